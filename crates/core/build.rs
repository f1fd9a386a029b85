//! Writes o200k_base's vocabulary into `OUT_DIR` as one flat table, which
//! `src/tokens/vocabulary.rs` reads in place.
//!
//! bpe-openai keeps each encoding as a serialized byte-pair encoder whose
//! search automata take about 35 MB of heap once loaded, and touch about
//! as much of the binary again while they are read. Counting o200k_base
//! needs only the tokens themselves: their bytes by rank, about 1.4 MB.
//!
//! The table: the token count `n` (u32, little-endian), then `n + 1`
//! offsets (u32, little-endian; token `r`'s bytes run from offset `r` to
//! offset `r + 1`), then every token's bytes, in rank order.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo::rerun-if-changed=build.rs");
    let bpe = &bpe_openai::o200k_base().bpe;
    let n = u32::try_from(bpe.num_tokens())?;
    let mut offsets = Vec::with_capacity(n as usize + 1);
    let mut bytes = Vec::new();
    offsets.push(0u32);
    for rank in 0..n {
        bytes.extend_from_slice(bpe.token_bytes(rank));
        offsets.push(u32::try_from(bytes.len())?);
    }
    let mut table = Vec::with_capacity(4 + offsets.len() * 4 + bytes.len());
    table.extend_from_slice(&n.to_le_bytes());
    for offset in offsets {
        table.extend_from_slice(&offset.to_le_bytes());
    }
    table.extend_from_slice(&bytes);
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("o200k_base.tokens");
    std::fs::write(out, table)?;
    Ok(())
}
