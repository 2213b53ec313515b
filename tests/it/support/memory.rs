//! Runs of the binary under a cap on the memory it may take, and the
//! compression bombs they read.

use std::io::Write;
use std::process::Command;

pub const MIB: u64 = 1024 * 1024;

/// [`super::bin`] with the memory its process may map for data capped at
/// `bytes`, set in the child before it runs the binary (by the shell's
/// `ulimit -d`, then `exec`): `RLIMIT_DATA` counts the heap and every
/// private writable mapping (each large allocation, thread stacks), and
/// past it an allocation fails, so the process ends by an allocator abort
/// or an "out of memory" error. (`RLIMIT_AS` would also count address
/// space reserved and never used, which grows with threads.)
pub fn capped_bin(bytes: u64) -> Command {
    let plain = super::bin();
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(r#"ulimit -d "$1" && shift && exec "$@""#)
        .arg("sh")
        .arg((bytes / 1024).to_string())
        .arg(plain.get_program());
    for (name, value) in plain.get_envs() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command
}

/// How a bomb is compressed.
#[derive(Clone, Copy, Debug)]
pub enum Squeeze {
    Gzip,
    Zstd,
}

/// `head`, then `mib` MiB of `x` with no line end, compressed: one member
/// (gzip) or frame (zstd) holds `head`, the next one MiB of `x`, compressed
/// once and repeated, as both formats allow, so a bomb of gigabytes costs a
/// few milliseconds and about 1 KiB (gzip) or 60 bytes (zstd) per MiB.
pub fn bomb(squeeze: Squeeze, head: &[u8], mib: u64) -> Vec<u8> {
    let compress = |bytes: &[u8]| match squeeze {
        Squeeze::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            encoder.write_all(bytes).unwrap();
            encoder.finish().unwrap()
        }
        Squeeze::Zstd => zstd::encode_all(bytes, 19).unwrap(),
    };
    let member = compress(&vec![b'x'; MIB as usize]);
    let mut out = if head.is_empty() {
        Vec::new()
    } else {
        compress(head)
    };
    out.reserve(member.len() * mib as usize);
    for _ in 0..mib {
        out.extend_from_slice(&member);
    }
    out
}
