//! `plan`: the cost of a compaction against the number of live spans.
//!
//! One session of `n` live spans sits just under its budget, and one
//! tool output arrives that does not fit: the admission must plan a
//! compaction, apply it and verify it before the turn can be written.
//! This is what the daemon does under the session's lock
//! ([`Session::admit`]); the store's write and the adoption of the change
//! ([`Session::apply`]) follow it.
//!
//! The session is made of what an agent's context holds: turns of a user
//! message now and then (some of them constraints, classified by the same
//! rules the daemon uses), the model's reasoning, and tool output with
//! paths, error lines and test results; it opens with the summary of an
//! earlier compaction. Every text is generated from a fixed seed and
//! counted with the session's real tokenizer (o200k_base), so every run
//! plans the same compaction; a digest of the plan is printed so that
//! two builds can be shown to plan identically.
//!
//! For each size the admission is repeated and its median reported, with
//! its parts (plan, apply, verify) measured separately the same number of
//! times, the cost per span, and the growth against `n·log n` between
//! consecutive sizes: `growth / n·log n` at or below 1 means the step
//! grew no faster than `n·log n`. The parts read the session's facts
//! ([`Session::facts`]) as the admission does; what deriving them costs
//! when a session is loaded (`Session::new` over the stored spans) is
//! printed with each size.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ctxbroker_core::classify;
use ctxbroker_core::config::{SessionConfig, TokenizerKind};
use ctxbroker_core::facts;
use ctxbroker_core::planner::{self, PlanInput, SummaryRoom, SummarySlot};
use ctxbroker_core::predicate;
use ctxbroker_core::session::{Change, Incoming, Session, SessionRecord};
use ctxbroker_core::span::{ClassSource, Classification, Role, Span, SpanClass};
use ctxbroker_core::tokens::{TokenCounter, counter, warm_up};
use ctxbroker_core::verify::verify_with;

use crate::common::{Failure, Rng, median};

/// The sizes measured when none are given.
pub const DEFAULT_SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// Spans an earlier compaction summarised into the summary the session
/// opens with.
const EARLIER_SPANS: u64 = 240;

/// The clock of the generated session, in ms since the epoch.
const NOW_MS: u64 = 1_700_000_000_000;

/// The arguments of `plan`.
#[derive(Debug, clap::Parser)]
#[command(
    about = "`ctxbroker-bench plan`: the admission that must compact a session of N live spans, in process (plan, apply, verify), and its growth against n log n",
    long_about = None
)]
struct PlanArgs {
    /// Session sizes, in live spans, comma-separated (each at least 2;
    /// default 1000,10000,100000,1000000).
    #[arg(value_parser = size_list)]
    sizes: Option<SizeList>,
    /// Runs measured per size.
    #[arg(default_value_t = 5)]
    repeats: usize,
    /// Also write every run's times to this CSV file.
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,
}

/// `plan [SIZES] [REPEATS] [--csv PATH]`: each size measured `REPEATS`
/// times; with `--csv`, every run's times are also written to PATH.
pub fn plan_main(args: &[String]) -> Result<(), Failure> {
    let args: PlanArgs = crate::common::flags("plan", args);
    let sizes = args.sizes.map_or(DEFAULT_SIZES.to_vec(), |list| list.0);
    if sizes.iter().any(|&n| n < 2) || args.repeats == 0 {
        return Err("every size must be at least 2 spans and REPEATS at least 1".into());
    }
    run(&sizes, args.repeats, args.csv.as_deref())
}

/// Session sizes given as one comma-separated argument.
#[derive(Debug, Clone, PartialEq)]
struct SizeList(Vec<usize>);

/// `SIZES` read: each comma-separated part a number of spans.
fn size_list(text: &str) -> Result<SizeList, String> {
    text.split(',')
        .map(|size| {
            size.trim()
                .parse()
                .map_err(|err| format!("{size:?} is not a size: {err}"))
        })
        .collect::<Result<_, _>>()
        .map(SizeList)
}

/// Every run of one size, in the order measured: the `k`th admission,
/// plan, apply, verify and adoption are each part's `k`th repetition.
#[derive(Debug, Clone)]
struct Runs {
    admit: Vec<Duration>,
    plan: Vec<Duration>,
    apply: Vec<Duration>,
    verify: Vec<Duration>,
    adopt: Vec<Duration>,
}

/// Writes every run of every size to `path`: live spans, run, and the
/// time of each part in ms.
fn write_csv(path: &Path, rows: &[Row]) -> Result<(), Failure> {
    let file =
        std::fs::File::create(path).map_err(|err| format!("--csv {}: {err}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(
        out,
        "live_spans,run,admit_ms,plan_ms,apply_ms,verify_ms,adopt_ms"
    )?;
    for row in rows {
        let r = &row.runs;
        for k in 0..r.admit.len() {
            let at = |v: &[Duration]| v.get(k).map_or(f64::NAN, |d| ms(*d));
            writeln!(
                out,
                "{},{k},{:.4},{:.4},{:.4},{:.4},{:.4}",
                row.n,
                at(&r.admit),
                at(&r.plan),
                at(&r.apply),
                at(&r.verify),
                at(&r.adopt)
            )?;
        }
    }
    out.flush()?;
    eprintln!("runs written to {}", path.display());
    Ok(())
}

/// One size's figures: medians over the repeats.
#[derive(Debug, Clone)]
struct Row {
    n: usize,
    admit: Duration,
    plan: Duration,
    apply: Duration,
    verify: Duration,
    adopt: Duration,
    evicted: usize,
    summary_tokens: u32,
    digest: u64,
    runs: Runs,
}

fn run(sizes: &[usize], repeats: usize, csv: Option<&Path>) -> Result<(), Failure> {
    warm_up(TokenizerKind::O200kBase);
    let c = counter(TokenizerKind::O200kBase);
    let tools = tool_outputs(TOOL_OUTPUTS, c);
    let bytes: usize = tools.spans.iter().map(|s| s.text.len()).sum();
    eprintln!(
        "{TOOL_OUTPUTS} tool outputs ({bytes} bytes of text): {}, medians of {repeats}",
        loading(&tools, repeats)?
    );
    let mut rows: Vec<Row> = Vec::new();
    for &n in sizes {
        let built = Instant::now();
        let (mut session, incoming) = workload(n, c);
        let live_tokens = session.record.live_tokens;
        let pinned = session.record.pinned_spans;
        let bytes: usize = session.spans.iter().map(|s| s.text.len()).sum();
        eprintln!(
            "{n} spans: {bytes} bytes of text, {live_tokens} live tokens, {pinned} constraints, window {}; built in {:.1?}",
            session.record.config.window_tokens,
            built.elapsed()
        );
        eprintln!(
            "{n} spans: {}, medians of {repeats}",
            loading(&session, repeats)?
        );
        let row = measure(&mut session, &incoming, repeats, c)?;
        rows.push(row);
    }
    print_table(&rows, repeats);
    if let Some(path) = csv {
        write_csv(path, &rows)?;
    }
    Ok(())
}

/// Times the admission and its parts `repeats` times each, and checks
/// that every repetition decides the same change.
fn measure(
    session: &mut Session,
    incoming: &[Incoming],
    repeats: usize,
    c: &'static dyn TokenCounter,
) -> Result<Row, Failure> {
    let n = session.spans.len();
    let mut admit = Vec::with_capacity(repeats);
    let mut first: Option<Change> = None;
    for _ in 0..repeats {
        let turn = incoming.to_vec();
        let started = Instant::now();
        let outcome = session.admit(turn, NOW_MS, c);
        admit.push(started.elapsed());
        let change = outcome.map_err(|r| format!("{n} spans: the admission was refused: {r:?}"))?;
        match &first {
            None => first = Some(change),
            Some(f) if *f == change => {}
            Some(_) => return Err(format!("{n} spans: two admissions decided differently").into()),
        }
    }
    let Some(change) = first else {
        return Err("no repetition ran".into());
    };
    if change.evict.is_empty() || change.summary.is_none() {
        return Err(format!("{n} spans: the admission did not compact").into());
    }

    // The parts, as the admission runs them, on the facts it derived.
    if session.facts().is_none() {
        return Err(format!("{n} spans: the facts do not describe the spans").into());
    }
    let session = &*session;
    let query: String = incoming
        .iter()
        .map(|i| i.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let incoming_tokens: u64 = incoming.iter().map(|i| u64::from(i.tokens)).sum();
    let config = &session.record.config;
    let input = PlanInput {
        config,
        live: &session.spans,
        incoming_tokens,
        query: &query,
        turn: session.record.turns + 1,
        next_span_id: session.record.next_span_id + incoming.len() as u64,
        now_ms: NOW_MS,
        target_tokens: None,
        held_tool_calls: &[],
    };
    let (mut plan_t, mut apply_t, mut verify_t) = (Vec::new(), Vec::new(), Vec::new());
    let mut plan = None;
    for _ in 0..repeats {
        let started = Instant::now();
        let p = planner::plan_with(&input, session.derived_facts(), c);
        let planned = Instant::now();
        let post = planner::apply(&session.spans, &p);
        let applied = Instant::now();
        let verdict = verify_with(
            &session.spans,
            session.derived_facts(),
            &p,
            &post,
            incoming_tokens,
            config,
            c,
        );
        let verified = Instant::now();
        if !verdict.passed() {
            return Err(format!("{n} spans: the plan failed verification: {verdict:?}").into());
        }
        plan_t.push(planned - started);
        apply_t.push(applied - planned);
        verify_t.push(verified - applied);
        plan = Some(p);
    }
    let Some(plan) = plan else {
        return Err("no repetition ran".into());
    };
    let evicted: Vec<u64> = plan.evicted.iter().map(|e| e.span_id).collect();
    if evicted != change.evict {
        return Err(format!("{n} spans: the plan differs from the admission's").into());
    }

    // Adopting the acknowledged change, on a copy made outside the clock.
    let mut adopt = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let mut copy = session.clone();
        let started = Instant::now();
        copy.apply(&change);
        adopt.push(started.elapsed());
        if copy.record.live_spans != copy.spans.len() as u64 {
            return Err(format!("{n} spans: the adopted change left inconsistent counters").into());
        }
    }

    let runs = Runs {
        admit: admit.clone(),
        plan: plan_t.clone(),
        apply: apply_t.clone(),
        verify: verify_t.clone(),
        adopt: adopt.clone(),
    };
    Ok(Row {
        n,
        admit: median(admit),
        plan: median(plan_t),
        apply: median(apply_t),
        verify: median(verify_t),
        adopt: median(adopt),
        evicted: change.evict.len(),
        summary_tokens: change.summary.as_ref().map_or(0, |s| s.tokens),
        digest: digest(&change),
        runs,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn n_log_n(n: usize) -> f64 {
    let n = n as f64;
    n * n.log2()
}

fn print_table(rows: &[Row], repeats: usize) {
    println!(
        "| live spans | admit ms | plan ms | apply ms | verify ms | adopt ms | ns/span (admit) | growth | n·log n growth | growth / n·log n | evicted | summary tokens | plan digest |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut previous: Option<&Row> = None;
    for row in rows {
        let (growth, expected, ratio) = match previous {
            Some(p) if p.admit > Duration::ZERO && p.n > 0 => {
                let growth = row.admit.as_secs_f64() / p.admit.as_secs_f64();
                let expected = n_log_n(row.n) / n_log_n(p.n);
                (
                    format!("{growth:.2}"),
                    format!("{expected:.2}"),
                    format!("{:.2}", growth / expected),
                )
            }
            _ => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {growth} | {expected} | {ratio} | {} | {} | {:016x} |",
            row.n,
            ms(row.admit),
            ms(row.plan),
            ms(row.apply),
            ms(row.verify),
            ms(row.adopt),
            row.admit.as_secs_f64() * 1e9 / row.n as f64,
            row.evicted,
            row.summary_tokens,
            row.digest,
        );
        previous = Some(row);
    }
    println!();
    println!(
        "medians of {repeats} runs each; admit = Session::admit of one tool output that does not fit (plan + apply + verify + the change); adopt = Session::apply of the acknowledged change"
    );
}

/// FNV-1a over what the admission decided: the evicted ids, the summary,
/// the live ids after, and the totals.
fn digest(change: &Change) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for id in &change.evict {
        eat(&id.to_le_bytes());
    }
    if let Some(s) = &change.summary {
        eat(s.text.as_bytes());
        eat(&s.tokens.to_le_bytes());
        eat(&s.position.to_le_bytes());
    }
    for s in change.append.iter().chain(&change.replace) {
        eat(&s.id.to_le_bytes());
        eat(s.text.as_bytes());
    }
    eat(&change.record.live_tokens.to_le_bytes());
    eat(&change.record.pinned_tokens.to_le_bytes());
    if let Some(m) = &change.marker {
        eat(&m.anchors_carried.to_le_bytes());
        eat(&m.anchors_dropped.to_le_bytes());
        eat(m.detail.as_bytes());
    }
    h
}

const COMPONENTS: [&str; 16] = [
    "scheduler",
    "planner",
    "gateway",
    "billing",
    "ingest",
    "auth",
    "cache",
    "router",
    "exporter",
    "indexer",
    "notifier",
    "catalog",
    "ledger",
    "search",
    "uploader",
    "metrics",
];

const NOUNS: [&str; 24] = [
    "retry policy",
    "timeout",
    "connection pool",
    "handler",
    "migration",
    "schema",
    "queue",
    "rate limiter",
    "config loader",
    "test fixture",
    "error path",
    "backoff",
    "health check",
    "lock",
    "index",
    "batch size",
    "serializer",
    "cursor",
    "feature flag",
    "log format",
    "deadline",
    "checksum",
    "snapshot",
    "replica set",
];

const VERBS: [&str; 12] = [
    "refactor",
    "inspect",
    "rewrite",
    "simplify",
    "benchmark",
    "document",
    "harden",
    "split",
    "rename",
    "profile",
    "cache",
    "validate",
];

const REASONS: [&str; 10] = [
    "the tests still fail intermittently",
    "the latency regressed after the last change",
    "the reviewer asked for a smaller diff",
    "the old code path is still used by the importer",
    "the error message does not name the field",
    "two callers disagree on the units",
    "the fixture depends on wall-clock time",
    "the lock is held across an await point",
    "the migration is not idempotent",
    "the metric is counted twice",
];

const ERRORS: [&str; 8] = [
    "error[E0308]: mismatched types",
    "error[E0599]: no method named `flush_all` found for struct `Writer`",
    "error: could not compile `ingest` due to 2 previous errors",
    "thread 'main' panicked at 'called `Result::unwrap()` on an `Err` value'",
    "FAILED: connection refused (os error 111)",
    "TypeError: cannot read properties of undefined (reading 'id')",
    "ERROR timeout after 30s waiting for replica-2",
    "fatal: not a git repository (or any of the parent directories)",
];

const CONSTRAINTS: [&str; 8] = [
    "Never write to the `prod-{k}` namespace; stage only.",
    "Do not modify anything under migrations/{c}/ without asking first.",
    "Always run `cargo test -p {c}` before you report a change as done.",
    "Only touch files in src/{c}/; the rest of the tree is frozen.",
    "Actually, use the {c} v2 client instead of the v1 client from now on.",
    "You must keep the public API of the {c} crate unchanged.",
    "Don't push to the main branch; open a pull request for {c} instead.",
    "Ensure every new {c} endpoint checks the caller's tenant.",
];

/// The text of one span of turn `turn`, by role.
fn text(rng: &mut Rng, role: Role, turn: u64, constraint: bool) -> String {
    let c = rng.pick(&COMPONENTS);
    let noun = rng.pick(&NOUNS);
    match role {
        Role::User | Role::System if constraint => rng
            .pick(&CONSTRAINTS)
            .replace("{k}", &format!("{}", turn % 97))
            .replace("{c}", c),
        Role::User | Role::System => format!(
            "Next, please {} the {noun} in the {c} service; {}.",
            rng.pick(&VERBS),
            rng.pick(&REASONS)
        ),
        Role::Assistant => {
            let mut out = format!(
                "I will {} the {noun} of {c} first, because {}.",
                rng.pick(&VERBS),
                rng.pick(&REASONS)
            );
            if rng.below(2) == 0 {
                out.push_str(&format!(
                    " Then I check the {} in src/{c}/{}.rs.",
                    rng.pick(&NOUNS),
                    rng.pick(&COMPONENTS)
                ));
            }
            out
        }
        Role::Tool => match rng.below(4) {
            0 => format!(
                "{}\n --> src/{c}/{}.rs:{}:{}",
                rng.pick(&ERRORS),
                rng.pick(&COMPONENTS),
                10 + rng.below(900),
                1 + rng.below(80)
            ),
            1 => format!(
                "test {c}::tests::{}_{} ... ok\ntest result: ok. {} passed; 0 failed; finished in {}.{}s",
                rng.pick(&VERBS),
                turn % 50,
                1 + rng.below(200),
                rng.below(10),
                rng.below(100)
            ),
            2 => format!(
                "{{\"service\": \"{c}\", \"status\": {}, \"latency_ms\": {}, \"path\": \"/v1/{c}/{}\"}}",
                [200, 200, 200, 404, 500][rng.below(5)],
                rng.below(2_000),
                rng.below(10_000)
            ),
            _ => format!(
                "$ grep -rn \"{}\" src/{c}\nsrc/{c}/mod.rs:{}:    let {} = {}::new();",
                noun.replace(' ', "_"),
                1 + rng.below(400),
                noun.replace(' ', "_"),
                c
            ),
        },
    }
}

/// Loading: a session made from the store's spans, and the facts of every
/// span, which it derives when a compaction first needs them (a reloaded
/// session's first compaction pays this), from the text and from the
/// seeds the store keeps beside the spans; the medians of `repeats`, the
/// copies made outside the clock.
fn loading(session: &Session, repeats: usize) -> Result<Loading, Failure> {
    let derive_seeds = || -> Vec<Option<Box<[u8]>>> {
        session
            .spans
            .iter()
            .map(|s| facts::seed(s).map(Vec::into_boxed_slice))
            .collect()
    };
    let seeds = derive_seeds();
    let (mut text, mut seeded) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
    let mut deriving = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let started = Instant::now();
        let again = derive_seeds();
        deriving.push(started.elapsed());
        if again != seeds {
            return Err("the seeds derived twice differ".into());
        }
        for from_seeds in [false, true] {
            let (record, spans) = (session.record.clone(), session.spans.clone());
            let seeds = if from_seeds {
                seeds.clone()
            } else {
                Vec::new()
            };
            let started = Instant::now();
            let mut loaded = Session::with_seeds(record, spans, seeds);
            let described = loaded.facts().is_some();
            let took = started.elapsed();
            if !described {
                return Err("the facts derived do not describe the session's spans".into());
            }
            match from_seeds {
                true => seeded.push(took),
                false => text.push(took),
            }
        }
    }
    Ok(Loading {
        from_text: median(text),
        from_seeds: median(seeded),
        deriving_seeds: median(deriving),
        seed_bytes: seeds.iter().flatten().map(|s| s.len()).sum(),
        text_bytes: session.spans.iter().map(|s| s.text.len()).sum(),
    })
}

/// What [`loading`] measured.
struct Loading {
    from_text: Duration,
    from_seeds: Duration,
    /// Deriving every span's seed, as admission does span by span.
    deriving_seeds: Duration,
    seed_bytes: usize,
    text_bytes: usize,
}

impl fmt::Display for Loading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Session::new and the facts of every span in {:.2} ms from the text, {:.2} ms from stored seeds ({:.2}x; the seeds derived at admission: {:.2} ms, {} bytes, {:.1} % of the text)",
            ms(self.from_text),
            ms(self.from_seeds),
            self.from_text.as_secs_f64() / self.from_seeds.as_secs_f64().max(1e-9),
            ms(self.deriving_seeds),
            self.seed_bytes,
            100.0 * self.seed_bytes as f64 / self.text_bytes.max(1) as f64
        )
    }
}

/// The tool outputs of the session [`tool_outputs`] makes.
const TOOL_OUTPUTS: usize = 200;

/// A session of `n` tool outputs of about 32 KB each (compiler
/// warnings, log lines, test results, stack frames, prose: the admit
/// benchmark's lines), the kind of span a long agent session holds most
/// of its text in.
fn tool_outputs(n: usize, c: &dyn TokenCounter) -> Session {
    let mut rng = Rng::new(0x7001_7001);
    let spans: Vec<Span> = (0..n)
        .map(|k| {
            let mut text = String::new();
            let mut line = 0;
            while text.len() < 32_000 {
                text.push_str(&crate::admit::workload::tool_line(k, line, &mut rng));
                line += 1;
            }
            admitted(k as u64 + 1, k as u64 + 1, Role::Tool, text, c)
        })
        .collect();
    let mut record = SessionRecord::new(
        "bench-tools",
        SessionConfig::with_window(10_000_000),
        NOW_MS - 3_600_000,
    );
    record.next_span_id = n as u64 + 1;
    record.turns = n as u64;
    record.live_spans = n as u64;
    record.live_tokens = spans.iter().map(|s| u64::from(s.tokens)).sum();
    Session::new(record, spans)
}

/// A span as the daemon would have admitted it: counted with `c`, user
/// and system text classified by the rules, constraints with a derived
/// predicate.
pub(crate) fn admitted(id: u64, turn: u64, role: Role, text: String, c: &dyn TokenCounter) -> Span {
    let classification = classify(role, &text);
    let predicate = (classification.class == SpanClass::Constraint)
        .then(|| predicate::derive(&text, ctxbroker_core::modality_of(&text)));
    Span {
        id,
        position: id,
        role,
        classification,
        tokens: c.count(&text),
        text,
        generation: 0,
        turn,
        predicate,
        summary: None,
        relevance_hint: None,
        admitted_at_ms: NOW_MS - 3_600_000 + turn,
        original: None,
        attributes: None,
    }
}

/// The spans of turn after turn from id `first`, until `count` spans
/// (the last turn may be cut short). Every third turn opens with a user
/// message, one in six of them a constraint.
fn turns(
    rng: &mut Rng,
    first: u64,
    first_turn: u64,
    count: u64,
    narrative_only: bool,
    c: &dyn TokenCounter,
) -> Vec<Span> {
    let mut out = Vec::with_capacity(count as usize);
    let mut turn = first_turn;
    let mut id = first;
    while (out.len() as u64) < count {
        let mut roles = Vec::with_capacity(4);
        if turn.is_multiple_of(3) {
            roles.push(Role::User);
        }
        roles.extend([Role::Assistant, Role::Tool, Role::Assistant]);
        for role in roles {
            if out.len() as u64 >= count {
                break;
            }
            let constraint = !narrative_only && role == Role::User && rng.below(6) == 0;
            let t = text(rng, role, turn, constraint);
            out.push(admitted(id, turn, role, t, c));
            id += 1;
        }
        turn += 1;
    }
    out
}

/// `n` live spans of an agent's session from id 1, turn after turn, as
/// the daemon would have admitted them: [`workload`]'s generator without
/// the earlier compaction. The same `n` gives the same spans.
pub(crate) fn history(n: usize, c: &dyn TokenCounter) -> Vec<Span> {
    let mut rng = Rng::new(0x00c0_ffee ^ n as u64);
    turns(&mut rng, 1, 1, n as u64, false, c)
}

/// A session of `n` live spans just under its budget, and a tool output
/// that does not fit next to it.
pub fn workload(n: usize, c: &'static dyn TokenCounter) -> (Session, Vec<Incoming>) {
    let mut rng = Rng::new(0x00c0_ffee ^ n as u64);
    // An earlier compaction summarised the session's first spans, when
    // the next `before` spans had been admitted already: the summary
    // stands first, with an id above theirs, as in a real session.
    let rest = n as u64 - 1;
    let before = (rest / 2).min(400);
    let earlier = turns(&mut rng, 1, 1, EARLIER_SPANS, true, c);
    let first_turn = earlier.last().map_or(1, |s| s.turn) + 1;
    let kept = turns(&mut rng, EARLIER_SPANS + 1, first_turn, before, false, c);
    let compaction_turn = kept.last().map_or(first_turn, |s| s.turn);
    let summary_id = EARLIER_SPANS + before + 1;
    let probe = SessionConfig::with_window(1_000_000);
    let evicted: Vec<&Span> = earlier.iter().collect();
    let summary = planner::write_summary(
        &evicted,
        SummaryRoom {
            tokens: 1_500,
            prose_tokens: 600,
        },
        &probe,
        SummarySlot {
            id: summary_id,
            turn: compaction_turn,
            now_ms: NOW_MS - 3_600_000,
        },
        c,
    )
    .span;

    let mut spans: Vec<Span> = Vec::with_capacity(n);
    spans.extend(summary);
    spans.extend(kept);
    let after = n as u64 - spans.len() as u64;
    spans.extend(turns(
        &mut rng,
        summary_id + 1,
        compaction_turn + 1,
        after,
        false,
        c,
    ));
    let last_turn = spans.last().map_or(compaction_turn, |s| s.turn);
    let next_span_id = spans.iter().map(|s| s.id).max().unwrap_or(summary_id) + 1;

    // The turn: one long tool output.
    let mut out = String::from("$ cargo test --workspace 2>&1 | tail -n 40\n");
    for k in 0..40 {
        let line = text(&mut rng, Role::Tool, last_turn + 1, false);
        out.push_str(&line);
        out.push('\n');
        if k % 10 == 9 {
            out.push_str("note: run with `RUST_BACKTRACE=1` for a backtrace\n");
        }
    }
    let incoming_tokens = c.count(&out);
    let incoming = vec![Incoming {
        role: Role::Tool,
        tokens: incoming_tokens,
        classification: Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Rules,
            rule: "role:tool".into(),
        },
        text: out,
        predicate: None,
        relevance_hint: None,
        unclassified: true,
        attributes: None,
    }];

    // A window whose budget holds the live spans and half the turn.
    let live: u64 = spans.iter().map(|s| u64::from(s.tokens)).sum();
    let pinned: Vec<&Span> = spans.iter().filter(|s| s.is_pinned()).collect();
    let budget = live + u64::from(incoming_tokens) / 2;
    let window = (budget as f64 / ctxbroker_core::config::defaults::ALPHA).ceil() as u32 + 1;
    let config = SessionConfig::with_window(window);
    let mut record = SessionRecord::new("bench", config, NOW_MS - 3_600_000);
    record.revision = last_turn + 2;
    record.next_span_id = next_span_id;
    record.turns = last_turn;
    record.marker_count = 1;
    record.compactions = 1;
    record.archived_spans = EARLIER_SPANS;
    record.live_tokens = live;
    record.pinned_tokens = pinned.iter().map(|s| u64::from(s.tokens)).sum();
    record.live_spans = spans.len() as u64;
    record.pinned_spans = pinned.len() as u64;
    record.last_compaction_turn = compaction_turn;
    record.last_admit_ms = NOW_MS - 1_000;
    record.last_compaction_ms = NOW_MS - 3_600_000;
    (Session::new(record, spans), incoming)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use clap::error::ErrorKind;

    use super::*;

    #[test]
    fn takes_sizes_repeats_and_csv_in_any_order() {
        let args = PlanArgs::try_parse_from(["plan", "--csv", "p.csv", "1000,5000", "3"]).unwrap();
        assert_eq!(args.sizes, Some(SizeList(vec![1_000, 5_000])));
        assert_eq!(args.repeats, 3);
        assert_eq!(args.csv, Some(PathBuf::from("p.csv")));
        let args = PlanArgs::try_parse_from(["plan"]).unwrap();
        assert_eq!(args.sizes, None);
        assert_eq!((args.repeats, args.csv), (5, None));
    }

    #[test]
    fn explains_itself_and_names_a_bad_argument() {
        let help = PlanArgs::try_parse_from(["plan", "--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        let bad = PlanArgs::try_parse_from(["plan", "1000,x"]).unwrap_err();
        assert!(bad.to_string().contains("[SIZES]"), "{bad}");
    }
}
