//! The embedded tokenizers count exactly what OpenAI's reference
//! implementation encodes (without special tokens), for both encodings.

use std::sync::LazyLock;

use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::tokens::counter;
use proptest::prelude::*;
use tiktoken_rs::CoreBPE;

/// The reference tokenizers, built once per test process: building one is
/// slow in a debug build.
static REFERENCE: LazyLock<[(TokenizerKind, &'static CoreBPE); 2]> = LazyLock::new(|| {
    [
        (
            TokenizerKind::O200kBase,
            tiktoken_rs::o200k_base_singleton(),
        ),
        (
            TokenizerKind::Cl100kBase,
            tiktoken_rs::cl100k_base_singleton(),
        ),
    ]
});

fn assert_same(text: &str) {
    for (kind, reference) in REFERENCE.iter() {
        let want = reference.encode_ordinary(text).len();
        let got = counter(*kind).count(text);
        assert_eq!(got as usize, want, "{kind:?} on {text:?}");
    }
}

#[test]
fn a_varied_corpus_counts_identically() {
    let long_word = "a".repeat(5_000);
    let long_digits = "1234567890".repeat(300);
    let long_symbols = "=+-*/".repeat(400);
    let long_base64 = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0123456789+/".repeat(50);
    let whitespace = format!(
        "a{}b{}c{}",
        " ".repeat(37),
        "\t \n ".repeat(20),
        "\n".repeat(9)
    );
    let corpus: Vec<&str> = vec![
        "",
        " ",
        "\n",
        "hello",
        "Hello, world! How are you doing today?",
        "Never write to the `prod` namespace; stage only.",
        "Refactor k8s/staging/deploy.yaml to use kustomize overlays for the staging namespace.",
        "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{x:?}\");\n}\n",
        "def f(a, b):\n\treturn {'k': [a, b], \"n\": None}  # comment\n",
        r#"{"id": 12345, "name": "ctxbroker", "tags": ["a", "b"], "nested": {"x": 1.5e-3, "ok": true}}"#,
        "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id DESC LIMIT 50;",
        "error[E0425]: cannot find value `foo` in this scope\n --> src/main.rs:2:5",
        "thread 'main' panicked at src/lib.rs:10:5:\ncalled `Option::unwrap()` on a `None` value",
        "日本語のテキストと中文文本，还有한국어 텍스트。",
        "emoji: 🦀🔥👍🏽👨‍👩‍👧‍👦 🇩🇪 ✅",
        "combining: e\u{301} a\u{308} n\u{303} \u{1e9b}\u{323} Z\u{335}\u{321}a\u{337}l\u{338}g\u{334}o",
        "Ελληνικά, русский текст, עברית, العربية, हिन्दी",
        "I'm, you're, they'll, we'd, it's, DON'T, SHE'S, y'all've",
        "  leading and trailing spaces   ",
        "\r\n\r\nwindows\r\nline endings\r\n",
        "tabs\t\tand\u{a0}nbsp\u{2003}em space\u{200b}zero width",
        "numbers 1 12 123 1234 12345 123456 3.14159 -42 1e10 0xDEADBEEF 1,000,000",
        "512 MiB, 30s, 8080/tcp, 99.9%, $HOME, --force, RUST_LOG=debug",
        "https://example.com/path?query=1&b=2#frag",
        "a\u{0}b\u{1}c\u{7f}d",
        "\u{feff}BOM and \u{fffd} replacement",
        "'''\"\"\"```~~~!!!???...,,,;;;:::",
        &long_word,
        &long_digits,
        &long_symbols,
        &long_base64,
        &whitespace,
    ];
    for text in corpus {
        assert_same(text);
    }
}

/// A bounded count answers exactly what the count does: the count when it
/// is within the limit, `None` past it, for every counter.
fn assert_bounded_count_agrees(text: &str, limit: u32) {
    for kind in [
        TokenizerKind::O200kBase,
        TokenizerKind::Cl100kBase,
        TokenizerKind::Client,
    ] {
        let c = counter(kind);
        let n = c.count(text);
        let want = (n <= limit).then_some(n);
        assert_eq!(
            c.count_within(text, limit),
            want,
            "{kind:?}, limit {limit}, on {text:?}"
        );
        // At the count itself and one below it.
        assert_eq!(c.count_within(text, n), Some(n), "{kind:?} on {text:?}");
        if n > 0 {
            assert_eq!(c.count_within(text, n - 1), None, "{kind:?} on {text:?}");
        }
    }
}

#[test]
fn a_bounded_count_stops_at_its_limit() {
    let long = "a".repeat(5_000);
    for text in [
        "",
        "hello",
        "Never write to the `prod` namespace; stage only.",
        "error[E0425]: cannot find value `foo` in this scope\n --> src/main.rs:2:5",
        long.as_str(),
    ] {
        for limit in [0, 1, 2, 5, 10, 100, u32::MAX] {
            assert_bounded_count_agrees(text, limit);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_bounded_count_agrees_with_the_count(
        text in "([a-zA-Z]{1,9}|[0-9]{1,5}|[ .,:;|/`'-]{1,3}|\\n|日本語| ){0,80}",
        limit in 0u32..120,
    ) {
        assert_bounded_count_agrees(&text, limit);
    }

    #[test]
    fn arbitrary_strings_count_identically(text in any::<String>()) {
        assert_same(&text);
    }

    #[test]
    fn random_bytes_as_strings_count_identically(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        assert_same(&String::from_utf8_lossy(&bytes));
    }

    /// One long piece of the pre-tokenizer (a lowercase word, a run of
    /// symbols, of spaces, of a script without case, of digits' cousins),
    /// whose merge is the longest part of counting it: from a few bytes
    /// to past the length the counter merges itself (4,096 bytes).
    #[test]
    fn long_pieces_count_identically(
        unit in "([a-z]{1,7}|[=+*/#~-]{1,4}|[─━│]{1,3}|[日本語中文]{1,3}| {1,5}|[ab]{1,3})",
        repeats in 1usize..900,
        tail in "[a-z=─日 ]{0,3}",
    ) {
        let text = format!("{}{tail}", unit.repeat(repeats));
        assert_same(&text);
    }

    #[test]
    fn mixed_classes_count_identically(
        text in "([a-zA-Z]{1,12}|[0-9]{1,8}|[ \t\n]{1,6}|[.,;:!?'\"(){}\\[\\]<>/\\\\_=+-]{1,4}|[日本語中文한국어]{1,5}|[🦀🔥👍]{1,3}|e\u{301}|'s|'ll){0,60}"
    ) {
        assert_same(&text);
    }
}

/// The files under `dir` (recursively) whose names end in one of `exts`.
fn files(dir: &std::path::Path, exts: &[&str], out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, exts, out);
        } else if exts
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
}

/// The repository's own docs, contract and sources, read at test time,
/// count identically, file by file.
#[test]
fn the_repository_counts_identically() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths = Vec::new();
    files(&root.join("docs"), &["md"], &mut paths);
    files(&root.join("proto"), &["proto"], &mut paths);
    files(&root.join("crates/core/src"), &["rs"], &mut paths);
    paths.push(root.join("README.md"));
    paths.sort();
    assert!(paths.len() > 20, "found {paths:?}");
    let mut bytes = 0;
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        bytes += text.len();
        let want = REFERENCE[0].1.encode_ordinary(&text).len();
        let got = counter(TokenizerKind::O200kBase).count(&text);
        assert_eq!(got as usize, want, "{}", path.display());
    }
    assert!(bytes > 100_000, "{bytes} bytes");
}
