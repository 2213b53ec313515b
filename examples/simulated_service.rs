//! Starts the service simulator in-process, lists its models, embeds two
//! texts, checks the response and streams a chat reply.
//!
//! cargo run --example simulated_service

use embedjob::client::{ApiKey, ChatMessage, ChatRequest, Client, ClientConfig, EmbeddingInput};
use embedjob::simulate::{SimConfig, Simulator};
use embedjob::validate;
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let simulator = Simulator::start(SimConfig::default()).await?;
    let client = Client::new(ClientConfig::new(
        simulator.base_url(),
        ApiKey::new("example-key"),
    ))?;

    for model in client.models().await? {
        println!("{:<14} context {:?}", model.id, model.context_window);
    }

    let texts = vec!["a lighthouse on a cliff", "a beacon by the sea"];
    let response = client
        .embeddings("svc-embed-1", EmbeddingInput::Many(texts.clone()))
        .await?;
    let vectors = validate::check(response, texts.len(), Some(1024))?;
    let dot: f32 = vectors
        .row(0)
        .iter()
        .zip(vectors.row(1))
        .map(|(a, b)| a * b)
        .sum();
    println!(
        "{} vectors of {} values, {} prompt tokens, dot product {dot:.4}",
        vectors.len(),
        vectors.dimensions,
        vectors.usage.prompt_tokens
    );

    let request = ChatRequest {
        model: "svc-base".to_string(),
        messages: vec![ChatMessage::new("user", "Describe a lighthouse.")],
        temperature: None,
        max_tokens: None,
        stream: true,
    };
    let mut stream = client.chat_stream(&request).await?;
    while let Some(fragment) = stream.next().await {
        print!("{}", fragment?);
    }
    println!();
    println!(
        "ledger: {:?} requests billed",
        simulator.ledger().billed_requests
    );
    simulator.shutdown().await;
    Ok(())
}
