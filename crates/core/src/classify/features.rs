//! What the standing-instruction model looks at: a text cut into segments
//! (lines and sentences), each described by a fixed set of features.
//!
//! The features are linguistic, not lexical: the mood of a sentence
//! (imperative, question, report), its scope (from now on, everywhere, by
//! default), its time limit (yet, for now, until I say), the shapes people
//! use for rules without a modal verb (a ban as a noun phrase, a label and
//! a pattern), and the signs of pasted output. Word lists are small
//! closed-class sets (modals, scope adverbs, wh-words) plus a lexicon of
//! verbs that start instructions; nothing in them names a topic.
//!
//! Code (backticks, fenced blocks) is replaced by one placeholder word: a
//! keyword inside pasted code binds nothing, but code in a sentence still
//! marks a format or naming rule.

use super::lexicon::*;
use super::modal::code_ranges;

/// One feature of a segment. The discriminant is its index in
/// [`Features`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// A prohibition: never, don't, must not, cannot, forbidden, avoid...
    NegModal,
    /// A requirement: must, always, ensure, make sure, need to, should...
    ReqModal,
    /// A restriction: only, exclusively, at most, stick to, nothing but...
    Restrict,
    /// The segment starts with a verb in the imperative.
    Imperative,
    /// The segment states a ban as a noun phrase: "no tabs", "zero deps".
    NounBan,
    /// A short label, a colon, then content: "Commit messages: imperative".
    LabelColon,
    /// Words and shapes of formats and names: snake_case, ISO, 50 chars,
    /// placeholders, arrows.
    FormatVocab,
    /// Scope beyond the current step: from now on, everywhere, by default.
    Scope,
    /// A stated preference or convention: prefer, I'd rather, we use.
    Preference,
    /// A polite request: please, could you, would you mind.
    Polite,
    /// A condition leading to an action: "if the migration fails, stop".
    Conditional,
    /// A correction that binds on: stop doing, no more, not X but Y, again.
    Correction,
    /// A rule addressed to "you": you will, you are to, you may not.
    SecondPersonRule,
    /// A rule in the passive: is not allowed, must be, is required.
    PassiveRule,
    /// The segment is a question (a question mark).
    Question,
    /// The segment opens like a question: a wh-word or an inverted
    /// auxiliary.
    QuestionOpening,
    /// A time limit: yet, for now, until, wait, hold on, this time.
    Temporal,
    /// Pointers at the current step: this test, it again, line 3, now.
    StepLocal,
    /// Reported or quoted speech: said, told, according to, a quote.
    Report,
    /// A first-person or third-person statement about the world.
    Statement,
    /// Belief and guesswork: I think, maybe, must have, seems.
    Epistemic,
    /// A past-tense verb.
    Past,
    /// The whole span is a short acknowledgement.
    Acknowledgement,
    /// Most of the span looks like pasted output, code or logs.
    OutputLike,
    /// The span comes from the system role.
    SystemRole,
    /// A pointer at something present: this, that, it, these, those.
    Deictic,
    /// A directive word of another language (nunca, immer, jamais...).
    ForeignDirective,
    /// A scope phrase of another language (a partir de ahora, ab jetzt...).
    ForeignScope,
    /// A politeness word of another language (por favor, bitte...).
    ForeignPolite,
    /// An imperative with a scope.
    ImperativeScope,
    /// A directive with a time limit: the mark of a transient hold.
    DirectiveTemporal,
    /// A directive inside a question.
    DirectiveQuestion,
    /// A directive inside reported speech.
    DirectiveReport,
    /// A label and colon whose content is a format.
    LabelFormat,
    /// A directive at the start of a segment of a longer message.
    LeadingDirective,
    /// A polite request phrased as a question ("could you … from now
    /// on?").
    PoliteQuestion,
    /// An imperative that forbids: "don't …", "never …", "do not …".
    NegativeImperative,
    /// Opens with a verb of one piece of work ("implement …", "fix …",
    /// "can you draft …"): the mark of a task, unless scope or a modal
    /// says it holds beyond it.
    TaskVerb,
    /// Follows a line that presents what comes next as something shown
    /// ("this is what I get:", "the linter says", "here's the log"), or is
    /// a quoted line (`> …`): pasted, not said.
    Shown,
}

/// How many features there are.
pub const FEATURE_COUNT: usize = Feature::Shown as usize + 1;

/// Every feature, in index order.
pub const ALL_FEATURES: [Feature; FEATURE_COUNT] = [
    Feature::NegModal,
    Feature::ReqModal,
    Feature::Restrict,
    Feature::Imperative,
    Feature::NounBan,
    Feature::LabelColon,
    Feature::FormatVocab,
    Feature::Scope,
    Feature::Preference,
    Feature::Polite,
    Feature::Conditional,
    Feature::Correction,
    Feature::SecondPersonRule,
    Feature::PassiveRule,
    Feature::Question,
    Feature::QuestionOpening,
    Feature::Temporal,
    Feature::StepLocal,
    Feature::Report,
    Feature::Statement,
    Feature::Epistemic,
    Feature::Past,
    Feature::Acknowledgement,
    Feature::OutputLike,
    Feature::SystemRole,
    Feature::Deictic,
    Feature::ForeignDirective,
    Feature::ForeignScope,
    Feature::ForeignPolite,
    Feature::ImperativeScope,
    Feature::DirectiveTemporal,
    Feature::DirectiveQuestion,
    Feature::DirectiveReport,
    Feature::LabelFormat,
    Feature::LeadingDirective,
    Feature::PoliteQuestion,
    Feature::NegativeImperative,
    Feature::TaskVerb,
    Feature::Shown,
];

impl Feature {
    /// The feature's name in explanations and in the weights table.
    pub fn name(self) -> &'static str {
        match self {
            Feature::NegModal => "neg_modal",
            Feature::ReqModal => "req_modal",
            Feature::Restrict => "restrict",
            Feature::Imperative => "imperative",
            Feature::NounBan => "noun_ban",
            Feature::LabelColon => "label_colon",
            Feature::FormatVocab => "format_vocab",
            Feature::Scope => "scope",
            Feature::Preference => "preference",
            Feature::Polite => "polite",
            Feature::Conditional => "conditional",
            Feature::Correction => "correction",
            Feature::SecondPersonRule => "second_person_rule",
            Feature::PassiveRule => "passive_rule",
            Feature::Question => "question",
            Feature::QuestionOpening => "question_opening",
            Feature::Temporal => "temporal",
            Feature::StepLocal => "step_local",
            Feature::Report => "report",
            Feature::Statement => "statement",
            Feature::Epistemic => "epistemic",
            Feature::Past => "past",
            Feature::Acknowledgement => "acknowledgement",
            Feature::OutputLike => "output_like",
            Feature::SystemRole => "system_role",
            Feature::Deictic => "deictic",
            Feature::ForeignDirective => "foreign_directive",
            Feature::ForeignScope => "foreign_scope",
            Feature::ForeignPolite => "foreign_polite",
            Feature::ImperativeScope => "imperative*scope",
            Feature::DirectiveTemporal => "directive*temporal",
            Feature::DirectiveQuestion => "directive*question",
            Feature::DirectiveReport => "directive*report",
            Feature::LabelFormat => "label*format",
            Feature::LeadingDirective => "leading_directive",
            Feature::PoliteQuestion => "polite*question",
            Feature::NegativeImperative => "negative_imperative",
            Feature::TaskVerb => "task_verb",
            Feature::Shown => "shown",
        }
    }
}

/// The feature values of one segment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features(pub [f64; FEATURE_COUNT]);

impl Features {
    fn set(&mut self, feature: Feature) {
        self.0[feature as usize] = 1.0;
    }

    /// The value of a feature.
    pub fn get(&self, feature: Feature) -> f64 {
        self.0[feature as usize]
    }

    fn on(&self, feature: Feature) -> bool {
        self.get(feature) > 0.0
    }
}

/// A segment of a text and its features.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The segment's byte range in the text.
    pub range: (usize, usize),
    /// Its features.
    pub features: Features,
}

/// The word that stands for a run of code.
const CODE: &str = "`";

/// One segment as cut: its words and what ended it.
#[derive(Debug, Default)]
struct Cut {
    start: usize,
    end: usize,
    words: Vec<String>,
    /// Words before the first colon that is followed by more text.
    colon_after: Option<usize>,
    /// Whether a comma, dash or colon directly follows the first word.
    first_punctuated: bool,
    question_mark: bool,
    quote: bool,
    arrow: bool,
    placeholder: bool,
    digits_with_unit: bool,
}

/// Cuts `text` into segments and describes each. Span-level features
/// (role, length, acknowledgement, output-likeness) are set on every
/// segment, so that each segment's score stands on its own.
pub fn segments(text: &str, system_role: bool) -> Vec<Segment> {
    let cuts = cut(text);
    let total_words: usize = cuts.iter().map(|c| c.words.len()).sum();
    let output_like = output_like(text);
    let ack = total_words <= 8 && total_words > 0 && cuts.iter().all(|c| is_ack(&c.words));
    let many = cuts.len() > 1;
    let mut shown = false;
    cuts.into_iter()
        .filter(|c| c.words.iter().any(|w| w != CODE))
        .map(|c| {
            let mut f = describe(&c);
            let rest = &text[c.end..];
            let line_end = rest.find('\n').is_some_and(|n| rest[..n].trim().len() <= 1);
            if shown || quoted_line(text, c.start) {
                f.set(Feature::Shown);
            }
            shown = shown || (line_end && presents(&c.words, rest.trim_start().starts_with(':')));
            if system_role {
                f.set(Feature::SystemRole);
            }
            if output_like {
                f.set(Feature::OutputLike);
            }
            if ack {
                f.set(Feature::Acknowledgement);
            }
            if many
                && (f.on(Feature::Imperative) || f.on(Feature::NegModal) || f.on(Feature::NounBan))
            {
                f.set(Feature::LeadingDirective);
            }
            Segment {
                range: (c.start, c.end),
                features: f,
            }
        })
        .collect()
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn is_apostrophe(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}' | '\u{2018}')
}

/// Lines, then sentences (`.`, `!`, `?` before white space or the end, and
/// `;`); code runs become one placeholder word.
fn cut(text: &str) -> Vec<Cut> {
    let code = code_ranges(text);
    let mut code_at = code.iter().peekable();
    let mut cuts = Vec::new();
    let mut current = Cut::default();
    let mut word: Option<String> = None;
    let mut chars = text.char_indices().peekable();
    let finish_word = |current: &mut Cut, word: &mut Option<String>| {
        if let Some(w) = word.take() {
            current.words.push(w);
        }
    };
    while let Some((at, c)) = chars.next() {
        while code_at.peek().is_some_and(|&&(_, end)| end <= at) {
            code_at.next();
        }
        if let Some(&&(start, end)) = code_at.peek()
            && start <= at
        {
            finish_word(&mut current, &mut word);
            if current.words.last().map(String::as_str) != Some(CODE) {
                current.words.push(CODE.to_owned());
            }
            // Skip to the end of the code run.
            while chars.peek().is_some_and(|&(next, _)| next < end) {
                chars.next();
            }
            current.end = end;
            continue;
        }
        let next = chars.peek().map(|&(_, n)| n);
        if is_word_char(c) {
            word.get_or_insert_with(String::new)
                .extend(c.to_lowercase());
            current.end = at + c.len_utf8();
            continue;
        }
        if is_apostrophe(c)
            && next.is_some_and(is_word_char)
            && let Some(w) = word.as_mut()
        {
            w.push('\'');
            continue;
        }
        finish_word(&mut current, &mut word);
        let boundary_space = next.is_none_or(char::is_whitespace);
        match c {
            '\n' | ';' => {
                close(&mut cuts, &mut current, at + c.len_utf8());
                continue;
            }
            '.' | '!' | '?' | '…' if boundary_space => {
                if c == '?' {
                    current.question_mark = true;
                }
                close(&mut cuts, &mut current, at + c.len_utf8());
                continue;
            }
            '?' | '¿' => current.question_mark = true,
            ':' if boundary_space && current.colon_after.is_none() => {
                current.colon_after = Some(current.words.len());
                if current.words.len() == 1 {
                    current.first_punctuated = true;
                }
            }
            ',' | '—' | '–' | '-' if current.words.len() == 1 && boundary_space => {
                current.first_punctuated = true;
            }
            '"' | '“' | '”' | '«' | '»' => {
                current.quote = true;
            }
            '→' | '⇒' => current.arrow = true,
            '>' if current.end > 0 && text[..at].ends_with(['-', '=']) => current.arrow = true,
            '<' | '{' | '[' if next.is_some_and(is_word_char) => current.placeholder = true,
            '≤' | '≥' => current.digits_with_unit = true,
            _ => {}
        }
        if !c.is_whitespace() {
            current.end = at + c.len_utf8();
        }
    }
    finish_word(&mut current, &mut word);
    close(&mut cuts, &mut current, text.len());
    cuts
}

fn close(cuts: &mut Vec<Cut>, current: &mut Cut, next_start: usize) {
    let mut done = std::mem::take(current);
    current.start = next_start;
    current.end = next_start;
    if done.words.is_empty() {
        return;
    }
    // A colon right at the end ("Rules:") labels what follows, not this.
    if done.colon_after == Some(done.words.len()) {
        done.colon_after = None;
    }
    done.digits_with_unit |= done
        .words
        .windows(2)
        .any(|p| p[0].chars().all(|c| c.is_ascii_digit()) && UNITS.contains(&p[1].as_str()));
    cuts.push(done);
}

/// The first word that carries meaning: bullets, fillers and greetings
/// skipped.
fn first_content(words: &[String]) -> usize {
    words
        .iter()
        .position(|w| !LEAD_FILLERS.contains(&w.as_str()))
        .unwrap_or(words.len())
}

fn describe(c: &Cut) -> Features {
    let mut f = Features([0.0; FEATURE_COUNT]);
    let w = &c.words[..];
    let found = Matcher::get().scan(w);
    let start = first_content(w);
    let first = w.get(start).map(String::as_str).unwrap_or("");
    let second = w.get(start + 1).map(String::as_str).unwrap_or("");

    let neg = found.has(Set::NegModal);
    let req = found.has(Set::ReqModal);
    let restrict = found.has(Set::Restrict);
    if neg {
        f.set(Feature::NegModal);
    }
    if req {
        f.set(Feature::ReqModal);
    }
    if restrict {
        f.set(Feature::Restrict);
    }
    let imperative = (IMPERATIVE_VERBS.binary_search(&first).is_ok()
        || matches!(first, "don't" | "dont" | "never" | "always")
        || (first == "do" && second == "not"))
        && !c.question_mark;
    if imperative {
        f.set(Feature::Imperative);
    }
    // "no tabs", "zero deps", also after a label: "Reminder: no PII".
    let ban_at = |i: usize| {
        let head = w.get(i).map(String::as_str).unwrap_or("");
        let next = w.get(i + 1).map(String::as_str).unwrap_or("");
        // "No, use the other one" is an answer, not a ban.
        let interjection = i == start && c.first_punctuated;
        BAN_HEADS.contains(&head)
            && !next.is_empty()
            && !interjection
            && !BAN_NOT_FOLLOWED_BY.contains(&next)
    };
    // Also inside a list of rules: "…, and no new dependencies",
    // "absolutely no DB writes".
    let ban_inside = (1..w.len()).any(|i| BAN_LEADERS.contains(&w[i - 1].as_str()) && ban_at(i));
    if ban_at(start) || c.colon_after.is_some_and(ban_at) || ban_inside {
        f.set(Feature::NounBan);
    }
    let label = c.colon_after.filter(|&k| {
        (1..=6).contains(&k)
            && w.len() > k
            && !LOG_LABELS.contains(&w[0].as_str())
            && !SUBJECT_PRONOUNS.contains(&w[0].as_str())
    });
    if label.is_some() || c.arrow {
        f.set(Feature::LabelColon);
    }
    let format = found.has(Set::Format)
        || w.iter()
            .any(|x| x.len() > 5 && x.ends_with("case") && x.contains('_'))
        || c.placeholder
        || c.digits_with_unit
        || c.arrow
        || (w.iter().any(|x| x == CODE) && (label.is_some() || imperative));
    if format {
        f.set(Feature::FormatVocab);
    }
    let scope = found.has(Set::Scope) || (neg && found.has(Set::Again));
    if scope {
        f.set(Feature::Scope);
    }
    if found.has(Set::Preference) {
        f.set(Feature::Preference);
    }
    if found.has(Set::Polite) {
        f.set(Feature::Polite);
    }
    if CONDITION_OPENERS.contains(&first) && found.has(Set::ConditionAction) {
        f.set(Feature::Conditional);
    }
    let stop_doing = w
        .windows(2)
        .any(|p| matches!(p[0].as_str(), "stop" | "quit") && p[1].ends_with("ing"));
    if stop_doing || found.has(Set::Correction) {
        f.set(Feature::Correction);
    }
    if found.has(Set::SecondPerson) {
        f.set(Feature::SecondPersonRule);
    }
    if found.has(Set::Passive) {
        f.set(Feature::PassiveRule);
    }
    if c.question_mark {
        f.set(Feature::Question);
    }
    let opens_question = WH_WORDS.contains(&first)
        || (AUXILIARIES.contains(&first) && QUESTION_SUBJECTS.contains(&second));
    if opens_question {
        f.set(Feature::QuestionOpening);
    }
    let temporal = found.has(Set::Temporal);
    if temporal {
        f.set(Feature::Temporal);
    }
    if found.has(Set::Step)
        || w.windows(2)
            .any(|p| p[0] == "line" && p[1].chars().all(|c| c.is_ascii_digit()))
    {
        f.set(Feature::StepLocal);
    }
    let report = found.has(Set::Report) || c.quote;
    if report {
        f.set(Feature::Report);
    }
    if STATEMENT_SUBJECTS.contains(&first)
        && !MODAL_AFTER_SUBJECT.contains(&second)
        && !(first == "you" || (first == "we" && matches!(second, "never" | "always" | "only")))
    {
        f.set(Feature::Statement);
    }
    if found.has(Set::Deictic) {
        f.set(Feature::Deictic);
    }
    if found.has(Set::Epistemic) {
        f.set(Feature::Epistemic);
    }
    if found.has(Set::Past) || w.iter().any(|x| is_regular_past(x)) {
        f.set(Feature::Past);
    }
    if found.has(Set::ForeignDirective) {
        f.set(Feature::ForeignDirective);
    }
    if found.has(Set::ForeignScope) {
        f.set(Feature::ForeignScope);
    }
    if found.has(Set::ForeignPolite) {
        f.set(Feature::ForeignPolite);
    }
    let directive = neg || req || restrict || imperative || f.on(Feature::NounBan);
    if imperative && scope {
        f.set(Feature::ImperativeScope);
    }
    if directive && temporal {
        f.set(Feature::DirectiveTemporal);
    }
    if directive && (c.question_mark || opens_question) {
        f.set(Feature::DirectiveQuestion);
    }
    if directive && report {
        f.set(Feature::DirectiveReport);
    }
    if label.is_some() && format {
        f.set(Feature::LabelFormat);
    }
    if imperative && neg {
        f.set(Feature::NegativeImperative);
    }
    if found.has(Set::Polite) && (c.question_mark || opens_question) {
        f.set(Feature::PoliteQuestion);
    }
    // "can you write …", "could you please add …": the verb after the
    // request's frame.
    let verb = match (first, second) {
        ("can" | "could" | "would" | "will", "you") => w[start + 2..]
            .iter()
            .map(String::as_str)
            .find(|x| !LEAD_FILLERS.contains(x))
            .unwrap_or(""),
        _ => first,
    };
    if TASK_VERBS.binary_search(&verb).is_ok() {
        f.set(Feature::TaskVerb);
    }
    f
}

/// Whether a line introduces what follows as something shown rather than
/// said: a word of showing, and a colon or a short line.
fn presents(words: &[String], colon: bool) -> bool {
    (colon || words.len() <= 8) && words.iter().any(|w| SHOWING_WORDS.contains(&w.as_str()))
}

/// Whether the line holding byte `at` starts with `>` (a quotation).
fn quoted_line(text: &str, at: usize) -> bool {
    let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    text[line_start..].trim_start().starts_with('>')
}

/// Whether most of a text is output rather than prose: code fences, or
/// lines shaped like logs, stack frames, diffs and prompts.
fn output_like(text: &str) -> bool {
    let code: usize = code_ranges(text).iter().map(|(s, e)| e - s).sum();
    if text.len() >= 40 && code * 2 >= text.len() {
        return true;
    }
    let mut lines = 0usize;
    let mut shaped = 0usize;
    for line in text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
    {
        lines += 1;
        let t = line.trim_start();
        let lower = t.to_lowercase();
        let indented = line.len() - t.len() >= 2;
        let starts_digit = t.starts_with(|c: char| c.is_ascii_digit());
        if indented
            || starts_digit
            || OUTPUT_LINE_STARTS.iter().any(|p| lower.starts_with(p))
            || t.starts_with(['$', '>', '[', '{', '}', '|', '+', '#', '/', '<', '@', '='])
            || lower.contains("::")
            || lower.contains("==")
            || t.ends_with([';', '{', '}', ')', ','])
        {
            shaped += 1;
        }
    }
    lines >= 3 && shaped * 3 >= lines * 2
}

fn is_ack(words: &[String]) -> bool {
    words.iter().all(|w| ACK_WORDS.contains(&w.as_str()))
}

/// A past tense by its "-ed" (irregular ones are in the lexicon).
fn is_regular_past(word: &str) -> bool {
    word.len() >= 5 && word.ends_with("ed") && !word.ends_with("eed") && !NOT_PAST.contains(&word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(text: &str) -> Vec<&'static str> {
        let segs = segments(text, false);
        let mut names: Vec<&'static str> = ALL_FEATURES
            .iter()
            .filter(|f| segs.iter().any(|s| s.features.on(**f)))
            .map(|f| f.name())
            .collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn the_verb_lexicon_is_sorted_for_binary_search() {
        assert!(IMPERATIVE_VERBS.windows(2).all(|p| p[0] < p[1]));
        assert!(TASK_VERBS.windows(2).all(|p| p[0] < p[1]));
    }

    #[test]
    fn shapes_without_a_modal_verb_are_seen() {
        assert!(on("No tabs, anywhere.").contains(&"noun_ban"));
        assert!(on("no, use the other one").iter().all(|f| *f != "noun_ban"));
        let label = on("Commit messages: imperative, 50 chars max");
        assert!(label.contains(&"label_colon") && label.contains(&"label*format"));
        assert!(
            on("Error: connection refused")
                .iter()
                .all(|f| *f != "label_colon")
        );
    }

    #[test]
    fn questions_holds_and_reports_are_seen() {
        assert!(on("should we use tabs instead?").contains(&"question"));
        assert!(on("don't change anything yet").contains(&"directive*temporal"));
        assert!(on("my lead said we must never deploy on fridays").contains(&"report"));
    }

    #[test]
    fn code_is_one_placeholder_and_segments_cover_the_text() {
        let text = "Use `snake_case` for files.\nNever run ```rm -rf /``` again!";
        let segs = segments(text, false);
        assert_eq!(segs.len(), 2);
        assert!(segs[0].features.on(Feature::Imperative));
        assert!(segs[1].features.on(Feature::NegModal));
        for s in &segs {
            assert!(s.range.0 <= s.range.1 && s.range.1 <= text.len());
            assert!(text.is_char_boundary(s.range.0) && text.is_char_boundary(s.range.1));
        }
    }

    #[test]
    fn odd_text_does_not_panic() {
        for text in [
            "",
            "`",
            "```",
            "’",
            "a’",
            "İstanbul",
            "\u{0301}no",
            "::",
            "->",
            "<",
            "…?",
        ] {
            let _ = segments(text, true);
        }
    }
}
