//! The hand-written o200k_base pre-tokenizer yields exactly the pieces of
//! bpe-openai's pre-tokenisation expression, and counting over its pieces
//! gives bpe-openai's count.
#![allow(clippy::expect_used)]

use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::tokens::{counter, o200k_split};
use proptest::prelude::*;

fn ours(text: &str) -> Vec<&str> {
    o200k_split::split(text)
        .expect("the character table builds")
        .collect()
}

fn reference(text: &str) -> Vec<&str> {
    bpe_openai::o200k_base().split(text).collect()
}

/// Same pieces, and the daemon's count is bpe-openai's.
fn assert_same(text: &str) {
    let (ours, reference) = (ours(text), reference(text));
    assert_eq!(ours, reference, "pieces of {text:?}");
    let want = bpe_openai::o200k_base().count(text);
    let got = counter(TokenizerKind::O200kBase).count(text);
    assert_eq!(got as usize, want, "count of {text:?}");
}

/// Compares the pieces only, for long texts where a mismatch message
/// should point at the first differing piece rather than print both.
fn assert_same_pieces(label: &str, text: &str) {
    let mut ours = o200k_split::split(text).expect("the character table builds");
    let mut reference = bpe_openai::o200k_base().split(text);
    let mut offset = 0;
    loop {
        match (ours.next(), reference.next()) {
            (None, None) => return,
            (a, b) => {
                assert_eq!(a, b, "{label}: first difference at byte {offset}");
                offset += a.map_or(0, str::len);
            }
        }
    }
}

#[test]
fn fixed_cases_split_identically() {
    let digits: Vec<String> = (1..=7)
        .map(|n| "1234567".get(..n).unwrap().to_owned())
        .collect();
    let mut cases: Vec<&str> = vec![
        "",
        " ",
        "  ",
        "a",
        "'",
        "'s",
        "'S",
        "'ſ",
        "'ll",
        "'LL",
        "'lL",
        "'l",
        "'re",
        "'r",
        "'VE",
        "don't",
        "don'T",
        "DON'T",
        "DON't",
        "it's'",
        "it''s",
        "they'll've",
        "y'all",
        "'twas",
        " 's",
        "x's's",
        "Paris'ſ",
        "ſ'ſ",
        "AB'ſ",
        "Paris's",
        "ǅemal's",
        "HTTPServer",
        "HTTPServerError",
        "getHTTPResponseCode",
        "camelCaseWord",
        "ABCdefGHI",
        "aBc",
        "McDonald's",
        "ʰello",
        "Aʰb",
        "ªAAA",
        "AªA",
        "ᾈᾈa",
        "ǅǅ",
        "\u{301}",
        "\u{301}a",
        "a\u{301}",
        "A\u{301}B",
        "!\u{301}",
        " \u{301}",
        "\u{301}\u{301}'s",
        "  \n  ",
        "  \n  x",
        "\n\n\n",
        "\r\n",
        "\r\n\r\n\r\n",
        "a\r\n\r\nb",
        "a  \r\n  b",
        "  \r  ",
        "\t\t",
        "trailing   ",
        "trailing\t",
        "trailing \n",
        "x \u{a0}",
        "x\u{a0}\u{a0}y",
        "x\u{3000}y",
        "\u{2028}\u{2029}",
        "a  b",
        "a   b",
        "a \tb",
        " !",
        "  !",
        " !!\n",
        "!/",
        "!//\n/",
        ".../",
        "a/b",
        "1/2",
        "://",
        " /",
        "\n/",
        "?\r\n\r\n",
        "中文文本，还有",
        "日本語のテキスト",
        "한국어 텍스트",
        "हिन्दी में लिखा",
        "किमपि",
        "Ελληνικά Σίσυφος",
        "עברית",
        "العربية ١٢٣٤",
        "٣٤٥٦٧",
        "Ⅻ½²",
        "🦀🔥",
        "👍🏽👨\u{200d}👩\u{200d}👧",
        " 🦀",
        "🇩🇪",
        "a\u{0}b",
        "\u{feff}BOM",
        "\u{fffd}",
        "\u{10ffff}",
    ];
    for d in &digits {
        cases.push(d);
    }
    let with_context: Vec<String> = digits
        .iter()
        .flat_map(|d| [format!("a{d}b"), format!(" {d} "), format!("{d}.{d}")])
        .collect();
    for c in &with_context {
        cases.push(c);
    }
    for text in cases {
        assert_same(text);
    }
}

#[test]
fn adversarial_inputs_split_identically() {
    let n = 100_000;
    let mut lower = String::with_capacity(n);
    let mut state: u32 = 0x2545_f491;
    for _ in 0..n {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        lower.push(char::from(b'a' + (state % 26) as u8));
    }
    let cases = [
        ("one letter", "a".repeat(n)),
        ("one capital", "A".repeat(n)),
        ("random letters", lower),
        ("spaces", " ".repeat(n)),
        ("spaces then a letter", format!("{}x", " ".repeat(n))),
        ("line breaks", "\n".repeat(n)),
        ("mixed whitespace", " \t\u{a0}\r\n".repeat(n / 5)),
        ("digits", "7".repeat(n)),
        ("symbols", "=".repeat(n)),
        ("marks", "\u{301}".repeat(n / 2)),
        ("capital and lower-or-upper", "Aʰ".repeat(n / 3)),
        ("apostrophes", "'s".repeat(n / 2)),
        ("CJK", "中".repeat(n / 3)),
    ];
    for (label, text) in &cases {
        assert_same_pieces(label, text);
    }
}

/// Every character between `before` and `after`, compared as part of one
/// long text, so that one call covers the whole character table.
fn assert_every_character(before: &str, after: &str) {
    let mut text = String::new();
    for c in (0..=0x10_ffff).filter_map(char::from_u32) {
        text.push_str(before);
        text.push(c);
        text.push_str(after);
    }
    assert_same_pieces(&format!("{before:?} c {after:?}"), &text);
}

/// Every character in surroundings where it decides between the letter
/// alternatives: as a word, inside one, before a contraction.
#[test]
fn every_character_splits_identically_in_words() {
    for (before, after) in [("a", "b"), ("A", "'s"), ("\u{301}", "ʰ")] {
        assert_every_character(before, after);
    }
}

/// Every character in surroundings where it decides between whitespace,
/// numbers and punctuation.
#[test]
fn every_character_splits_identically_among_spaces_digits_and_symbols() {
    for (before, after) in [("", " "), (" ", "1"), ("!", "\n")] {
        assert_every_character(before, after);
    }
}

/// Fragments of every kind the expression tells apart.
const FRAGMENTS: &[&str] = &[
    "a", "z", "e", "A", "Z", "S", "L", "x", "s", "t", "ll", "re", "ve", "'", "'s", "'S", "'t",
    "'T", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "'ſ", "0", "7", "42", "1234", " ",
    "  ", "\t", "\n", "\r", "\r\n", "\u{a0}", "\u{2003}", "\u{3000}", "\u{2028}", "\u{85}", ".",
    ",", "!", "?", "/", "\\", "-", "_", "(", ")", "{", "}", "\"", "`", "#", "…", "—", "€", "é",
    "ß", "ſ", "ø", "σ", "я", // Ll
    "É", "Σ", "Я", "Ø", // Lu
    "ǅ", "ᾈ", // Lt
    "ʰ", "ー", "ㆍ", // Lm
    "中", "文", "한", "あ", "ª", "א", "ع", "क", // Lo
    "\u{301}", "\u{308}", "\u{93f}", "\u{94d}", "\u{20dd}", "\u{fe0f}", // M
    "٣", "३", "Ⅻ", "½", "²", "①", // N
    "🦀", "👍", "🏽", "\u{200d}", "🇩", "🇪", "\u{feff}", "\u{0}", "\u{7f}",
];

fn mixed_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            8 => proptest::sample::select(FRAGMENTS).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
            1 => "[a-zA-Z]{2,10}",
        ],
        0..48,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mixed_text_splits_identically(text in mixed_text()) {
        let (ours, reference) = (ours(&text), reference(&text));
        prop_assert_eq!(ours, reference);
        let want = bpe_openai::o200k_base().count(text.as_str());
        prop_assert_eq!(counter(TokenizerKind::O200kBase).count(&text) as usize, want);
    }

    #[test]
    fn arbitrary_strings_split_identically(text in any::<String>()) {
        prop_assert_eq!(ours(&text), reference(&text));
    }
}
