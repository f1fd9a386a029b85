//! `tokens`: the daemon's token counter against tiktoken-rs.
//!
//! Every admitted span is counted before it takes the session's turn, so
//! the counter's throughput bounds admission, and its behaviour on hostile
//! text (a tool that prints a megabyte without a space) decides whether one
//! span can stall the daemon. Both are measured on the same input for both
//! encodings the daemon embeds, o200k_base and cl100k_base:
//!
//! - a fixed corpus: the repository's own contract, docs and source texts
//!   (compiled into the binary), generated logs and JSON records, and a few
//!   paragraphs of other scripts, counted document by document as the
//!   daemon counts spans;
//! - adversarial input at growing sizes: one character repeated, random
//!   lower-case letters (one pre-tokenizer piece of any length), and
//!   base64 (long runs of letters and digits).
//!
//! Counts must agree wherever both finish. tiktoken-rs merges each piece
//! in time quadratic in its length, so on adversarial input each of its
//! runs is skipped when the time measured at the previous size, grown
//! quadratically, would exceed a cap (10 s unless given); the table says
//! so.

use std::time::{Duration, Instant};

use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::tokens::{counter, warm_up};
use tiktoken_rs::CoreBPE;

use crate::common::{Failure, Rng, median};

/// Adversarial sizes when none are given: 10 KB, 100 KB, 1 MB.
pub const DEFAULT_ADVERSARIAL_BYTES: [usize; 3] = [10_000, 100_000, 1_000_000];

/// The repository texts of the corpus.
const REPOSITORY_TEXTS: [(&str, &str); 7] = [
    (
        "proto/ctxbroker/v1/broker.proto",
        include_str!("../../../proto/ctxbroker/v1/broker.proto"),
    ),
    ("README.md", include_str!("../../../README.md")),
    (
        "docs/reliability.md",
        include_str!("../../../docs/reliability.md"),
    ),
    (
        "crates/core/src/summary.rs",
        include_str!("../../core/src/summary.rs"),
    ),
    (
        "crates/core/src/text.rs",
        include_str!("../../core/src/text.rs"),
    ),
    (
        "crates/core/src/predicate.rs",
        include_str!("../../core/src/predicate.rs"),
    ),
    (
        "crates/core/src/classify/modal.rs",
        include_str!("../../core/src/classify/modal.rs"),
    ),
];

/// Paragraphs in other scripts, so that the corpus is not all ASCII.
const OTHER_SCRIPTS: [&str; 4] = [
    "Die Bereitstellung ist fehlgeschlagen: Zeitüberschreitung nach 30 s beim Warten auf Replik 2. Bitte prüfen Sie die Größe des Verbindungspools.",
    "Развёртывание не удалось: истекло время ожидания реплики. Проверьте размер пула соединений и повторите попытку.",
    "部署失败：等待副本超时。请检查连接池的大小，然后重试。日志位于 /var/log/ctxbroker/broker.log。",
    "デプロイに失敗しました。レプリカの待機がタイムアウトしました 🚀 再試行してください ✅",
];

/// The arguments of `tokens`.
#[derive(Debug, clap::Parser)]
#[command(
    about = "`ctxbroker-bench tokens`: the token counter against tiktoken-rs, on a fixed corpus and on adversarial input",
    long_about = None
)]
struct TokensArgs {
    /// Runs over the corpus per counter; the median is reported.
    #[arg(default_value_t = 5)]
    repeats: usize,
    /// The largest adversarial input, in bytes.
    #[arg(default_value_t = 1_000_000)]
    max_adversarial_bytes: usize,
    /// Seconds after which tiktoken-rs's adversarial sizes are skipped.
    #[arg(default_value_t = 10)]
    tiktoken_cap_seconds: u64,
}

/// `tokens [REPEATS] [MAX_ADVERSARIAL_BYTES] [TIKTOKEN_CAP_SECONDS]`.
pub fn tokens_main(args: &[String]) -> Result<(), Failure> {
    let args: TokensArgs = crate::common::flags("tokens", args);
    if args.repeats == 0 || args.max_adversarial_bytes == 0 {
        return Err("REPEATS and MAX_ADVERSARIAL_BYTES must be at least 1".into());
    }
    let sizes = adversarial_sizes(args.max_adversarial_bytes);
    run(
        args.repeats,
        &sizes,
        Duration::from_secs(args.tiktoken_cap_seconds),
    )
}

/// 10 KB, 100 KB, 1 MB up to `max`, and `max` itself when it is none of
/// them.
fn adversarial_sizes(max: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = DEFAULT_ADVERSARIAL_BYTES
        .iter()
        .copied()
        .filter(|&s| s <= max)
        .collect();
    if sizes.last() != Some(&max) {
        sizes.push(max);
    }
    sizes
}

/// One of the two tokenizers under test, for one encoding.
#[derive(Clone, Copy)]
enum Counter {
    /// What the daemon counts with.
    Ours(TokenizerKind),
    /// The reference.
    Tiktoken(&'static CoreBPE),
}

impl Counter {
    fn count(self, text: &str) -> usize {
        match self {
            Counter::Ours(kind) => counter(kind).count(text) as usize,
            Counter::Tiktoken(bpe) => bpe.encode_ordinary(text).len(),
        }
    }
}

fn reference(kind: TokenizerKind) -> &'static CoreBPE {
    match kind {
        TokenizerKind::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        _ => tiktoken_rs::o200k_base_singleton(),
    }
}

fn name(kind: TokenizerKind) -> &'static str {
    match kind {
        TokenizerKind::Cl100kBase => "cl100k_base",
        TokenizerKind::O200kBase => "o200k_base",
        TokenizerKind::Client => "client",
    }
}

/// The corpus: its documents, in a fixed order.
pub fn corpus() -> Vec<String> {
    let mut docs: Vec<String> = REPOSITORY_TEXTS
        .iter()
        .map(|(_, text)| (*text).to_owned())
        .collect();
    let mut rng = Rng::new(0x7041_c0de);
    for k in 0..40 {
        docs.push(log_chunk(&mut rng, k));
    }
    for k in 0..40 {
        docs.push(json_chunk(&mut rng, k));
    }
    for (k, text) in OTHER_SCRIPTS.iter().enumerate() {
        docs.push(text.repeat(4 + k));
    }
    docs
}

const LEVELS: [&str; 5] = ["INFO", "INFO", "DEBUG", "WARN", "ERROR"];
const TARGETS: [&str; 6] = [
    "ctxbroker_server::broker",
    "ctxbroker_store::writer",
    "ctxbroker_server::hub",
    "tonic::transport",
    "h2::proto::connection",
    "ctxbroker_core::planner",
];
const MESSAGES: [&str; 6] = [
    "compaction committed",
    "turn admitted",
    "watcher moved back to the durable log",
    "flush completed",
    "connection closed: broken pipe (os error 32)",
    "request refused: span text exceeds 1048576 bytes",
];

/// About 4 KB of structured log lines.
fn log_chunk(rng: &mut Rng, k: usize) -> String {
    let mut out = String::new();
    let mut n = 0;
    while out.len() < 4_000 {
        n += 1;
        out.push_str(&format!(
            "2025-06-{:02}T{:02}:{:02}:{:02}.{:06}Z {:5} {}: {} session_id=\"agent-{}\" seq={} tokens_before={} tokens_after={} elapsed_ms={}.{}\n",
            1 + k % 28,
            rng.below(24),
            rng.below(60),
            rng.below(60),
            rng.below(1_000_000),
            rng.pick(&LEVELS),
            rng.pick(&TARGETS),
            rng.pick(&MESSAGES),
            rng.below(64),
            k * 1_000 + n,
            rng.below(200_000),
            rng.below(150_000),
            rng.below(50),
            rng.below(1_000),
        ));
    }
    out
}

/// About 4 KB of JSON records.
fn json_chunk(rng: &mut Rng, k: usize) -> String {
    let mut out = String::from("[\n");
    let mut n = 0;
    while out.len() < 4_000 {
        n += 1;
        out.push_str(&format!(
            "  {{\"id\": {}, \"session\": \"agent-{}\", \"role\": \"{}\", \"tokens\": {}, \"relevance\": 0.{:04}, \"path\": \"src/{}/mod_{}.rs\", \"ok\": {}, \"tags\": [\"{}\", \"{}\"]}},\n",
            k * 1_000 + n,
            rng.below(64),
            rng.pick(&["user", "assistant", "tool", "system"]),
            rng.below(4_096),
            rng.below(10_000),
            rng.pick(&["broker", "store", "core", "proto"]),
            rng.below(100),
            rng.below(2) == 0,
            rng.pick(&LEVELS).to_lowercase(),
            rng.pick(&["staging", "prod", "canary", "dev"]),
        ));
    }
    out.push_str("  {}\n]\n");
    out
}

/// The adversarial texts of `bytes` bytes: (name, text).
pub fn adversarial(bytes: usize) -> Vec<(&'static str, String)> {
    let mut rng = Rng::new(0xad5e_55a1 ^ bytes as u64);
    const LOWER: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const BASE64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut pick = |alphabet: &[u8]| -> String {
        (0..bytes)
            .map(|_| char::from(alphabet[rng.below(alphabet.len())]))
            .collect()
    };
    let letters = pick(LOWER);
    let base64 = pick(BASE64);
    vec![
        ("one character repeated", "a".repeat(bytes)),
        ("random lower-case letters", letters),
        ("base64", base64),
    ]
}

/// The median time of counting every document, and the total count.
fn time_corpus(c: Counter, docs: &[String], repeats: usize) -> (Duration, usize) {
    let mut times = Vec::with_capacity(repeats);
    let mut total = 0;
    for _ in 0..repeats {
        let started = Instant::now();
        total = docs.iter().map(|d| c.count(d)).sum();
        times.push(started.elapsed());
    }
    (median(times), total)
}

/// This process's resident memory (`VmRSS`), in MiB; 0 if unreadable.
fn resident_mib() -> f64 {
    crate::storage::Memory::of(std::process::id()).map_or(0.0, |m| m.rss as f64 / (1 << 20) as f64)
}

/// What each counter adds to the resident memory of a process that has
/// loaded none yet: o200k_base counting text whose pieces its own table
/// merges, then bpe-openai's o200k_base encoder, which a longer piece
/// loads, then cl100k_base. Run first, before tiktoken-rs's tables.
fn print_resident_memory() {
    let start = resident_mib();
    let o200k = counter(TokenizerKind::O200kBase);
    o200k.count("Never write to the prod namespace; stage changes only.");
    let table = resident_mib();
    o200k.count(&"a".repeat(ctxbroker_core::tokens::MERGED_MAX + 1));
    let encoder = resident_mib();
    warm_up(TokenizerKind::Cl100kBase);
    let cl100k = resident_mib();
    println!(
        "resident memory (VmRSS) added: o200k_base counting ordinary text {:.1} MiB; \
         bpe-openai's o200k_base encoder, loaded by a piece over {} bytes, {:.1} MiB more; \
         cl100k_base {:.1} MiB more",
        table - start,
        ctxbroker_core::tokens::MERGED_MAX,
        encoder - table,
        cl100k - encoder,
    );
    println!();
}

fn run(repeats: usize, sizes: &[usize], cap: Duration) -> Result<(), Failure> {
    let kinds = [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase];
    print_resident_memory();
    for kind in kinds {
        warm_up(kind);
        let _ = reference(kind).encode_ordinary("warm up");
    }
    let docs = corpus();
    let bytes: usize = docs.iter().map(String::len).sum();
    let mb = bytes as f64 / 1e6;

    println!(
        "corpus: {} documents, {bytes} bytes ({} from the repository); medians of {repeats} runs",
        docs.len(),
        REPOSITORY_TEXTS.iter().map(|(_, t)| t.len()).sum::<usize>()
    );
    println!();
    println!(
        "| encoding | tokenizer | tokens | ms | MB/s | Mtokens/s | ours / tiktoken-rs | counts equal |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut mismatches = Vec::new();
    for kind in kinds {
        let (ours, n_ours) = time_corpus(Counter::Ours(kind), &docs, repeats);
        let (theirs, n_theirs) = time_corpus(Counter::Tiktoken(reference(kind)), &docs, repeats);
        let equal = n_ours == n_theirs;
        if !equal {
            mismatches.push(format!("{} corpus: {n_ours} vs {n_theirs}", name(kind)));
        }
        let speedup = theirs.as_secs_f64() / ours.as_secs_f64().max(1e-12);
        for (label, d, n, ratio) in [
            ("ctxbroker", ours, n_ours, format!("{speedup:.2}×")),
            ("tiktoken-rs", theirs, n_theirs, "1.00×".to_owned()),
        ] {
            let secs = d.as_secs_f64().max(1e-12);
            println!(
                "| {} | {label} | {n} | {:.2} | {:.1} | {:.2} | {ratio} | {} |",
                name(kind),
                secs * 1e3,
                mb / secs,
                n as f64 / secs / 1e6,
                if equal { "yes" } else { "NO" },
            );
        }
    }

    println!();
    println!(
        "adversarial input; tiktoken-rs is skipped where its last time grown quadratically would exceed {} s",
        cap.as_secs()
    );
    println!();
    println!(
        "| encoding | input | bytes | tokens | ours ms | ours ns/byte | tiktoken-rs ms | tiktoken-rs ns/byte | counts equal |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for kind in kinds {
        let ours = Counter::Ours(kind);
        let theirs = Counter::Tiktoken(reference(kind));
        // Per input kind: the last tiktoken-rs size and time, and whether
        // it was skipped at a smaller size already.
        let mut last: Vec<Option<(usize, Duration)>> = vec![None; 3];
        let mut given_up = [false; 3];
        for &size in sizes {
            for (k, (input, text)) in adversarial(size).into_iter().enumerate() {
                let (t_ours, n_ours) = time_corpus(ours, std::slice::from_ref(&text), repeats);
                let predicted = last[k].map(|(s, t)| {
                    let grow = size as f64 / s as f64;
                    t.mul_f64(grow * grow)
                });
                let skip = given_up[k] || predicted.is_some_and(|p| p > cap);
                let (cell_ms, cell_ns, equal) = if skip {
                    let why = match predicted {
                        Some(p) if !given_up[k] => {
                            format!("skipped (predicted {:.0} s)", p.as_secs_f64())
                        }
                        _ => "skipped".to_owned(),
                    };
                    given_up[k] = true;
                    (why, "-".to_owned(), "-".to_owned())
                } else {
                    // One run when a run is slow, else the median.
                    let started = Instant::now();
                    let n = theirs.count(&text);
                    let first = started.elapsed();
                    let t = if first > Duration::from_millis(200) {
                        first
                    } else {
                        time_corpus(theirs, std::slice::from_ref(&text), repeats).0
                    };
                    last[k] = Some((size, t));
                    if n != n_ours {
                        mismatches.push(format!(
                            "{} {input} {size} bytes: {n_ours} vs {n}",
                            name(kind)
                        ));
                    }
                    (
                        format!("{:.2}", t.as_secs_f64() * 1e3),
                        format!("{:.1}", t.as_secs_f64() * 1e9 / size as f64),
                        if n == n_ours { "yes" } else { "NO" }.to_owned(),
                    )
                };
                println!(
                    "| {} | {input} | {size} | {n_ours} | {:.2} | {:.2} | {cell_ms} | {cell_ns} | {equal} |",
                    name(kind),
                    t_ours.as_secs_f64() * 1e3,
                    t_ours.as_secs_f64() * 1e9 / size as f64,
                );
            }
        }
    }
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(format!("token counts differ: {}", mismatches.join("; ")).into())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use clap::error::ErrorKind;

    use super::*;

    #[test]
    fn takes_its_three_positions_with_defaults() {
        let args = TokensArgs::try_parse_from(["tokens", "7", "10000"]).unwrap();
        assert_eq!(
            (
                args.repeats,
                args.max_adversarial_bytes,
                args.tiktoken_cap_seconds
            ),
            (7, 10_000, 10)
        );
        let help = TokensArgs::try_parse_from(["tokens", "--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        let bad = TokensArgs::try_parse_from(["tokens", "many"]).unwrap_err();
        assert!(bad.to_string().contains("[REPEATS]"), "{bad}");
    }
}
