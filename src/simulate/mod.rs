// temporary local placeholder; replaced by the real simulator
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateOptions { #[arg(long, default_value_t = 0)] pub port: u16 }
impl SimulateOptions { pub fn to_config(&self) -> Result<(), String> { Ok(()) } }
pub async fn serve(_o: SimulateOptions) -> anyhow::Result<()> { Ok(()) }
