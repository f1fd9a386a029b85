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

use std::borrow::Cow;

use super::lexicon::*;
use super::modal::{code_ranges, is_word_char};
use super::word::Pending;
use crate::text::char_at;

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
    /// A quantifier over things: any, all, every, each, anything. Wider
    /// than one object, but as often inside a task ("update all the
    /// dependencies") or a hold ("don't change anything yet") as in a
    /// rule.
    Quantifier,
    /// Words given to someone else: a verb of saying or wanting after a
    /// subject other than the writer ("the docs say", "my lead told me",
    /// "QA wants"), "according to", "apparently".
    Attributed,
    /// The segment's line is shaped like machine output: a log level, a
    /// time stamp, a `file:line` position, a stack frame, a compiler's
    /// pointer, a shell prompt, a code comment, or more symbols than
    /// letters.
    OutputLine,
    /// An imperative whose object is one particular thing ("fix the
    /// typo", "rename this variable", "write a script"): the mark of a
    /// single piece of work.
    SpecificObject,
    /// A question that asks rather than requests: a question mark or a
    /// question's opening, but not "could you …" or "would you …".
    OpenQuestion,
    /// Some line of the span is shaped like machine output
    /// ([`Feature::OutputLine`]): the span holds something pasted.
    Pasted,
    /// A contrast after a comma or dash: "use pathlib, not os.path".
    Contrast,
    /// A clause about what the agent does, inside the sentence:
    /// "whenever you change …", "every PR you open": the mark of a habit.
    AgentClause,
    /// Opens with a verb that keeps a state rather than does one piece of
    /// work: "keep the API stable", "treat warnings as errors", "leave
    /// the generated files alone".
    Maintaining,
    /// A task whose product carries words of its own: "draft an email
    /// announcing that …", "add a section about how we never …".
    TaskContent,
    /// Words that tell what was seen ("yet", "either", "this time",
    /// "weird"): a report of an outcome, not a rule.
    Observed,
    /// A directive that opens a clause inside the sentence, after a comma
    /// or dash or after "so": "the db is shared with QA, so leave it
    /// alone", "the vendored dir is generated, keep your edits out of it".
    ClauseDirective,
    /// A reason given for keeping to something, or what happens when it
    /// is not kept: "otherwise", "or else", "gets rejected", "won't pass
    /// review", "has bitten us".
    Justified,
    /// An action kept by the writer or by someone named, not the agent:
    /// "tagging releases is my job", "leave the DNS to me", "that's
    /// their call".
    Reserved,
    /// Where a kind of thing is kept: "new migrations go under
    /// db/migrations", "screenshots belong in assets/img", "API keys stay
    /// in the secrets manager" (not "lives in", said as often of people).
    Placement,
}

/// How many features there are.
pub const FEATURE_COUNT: usize = Feature::Placement as usize + 1;

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
    Feature::Quantifier,
    Feature::Attributed,
    Feature::OutputLine,
    Feature::SpecificObject,
    Feature::OpenQuestion,
    Feature::Pasted,
    Feature::Contrast,
    Feature::AgentClause,
    Feature::Maintaining,
    Feature::TaskContent,
    Feature::Observed,
    Feature::ClauseDirective,
    Feature::Justified,
    Feature::Reserved,
    Feature::Placement,
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
            Feature::Quantifier => "quantifier",
            Feature::Attributed => "attributed",
            Feature::OutputLine => "output_line",
            Feature::SpecificObject => "specific_object",
            Feature::OpenQuestion => "open_question",
            Feature::Pasted => "pasted",
            Feature::Contrast => "contrast",
            Feature::AgentClause => "agent_clause",
            Feature::Maintaining => "maintaining",
            Feature::TaskContent => "task_content",
            Feature::Observed => "observed",
            Feature::ClauseDirective => "clause_directive",
            Feature::Justified => "justified",
            Feature::Reserved => "reserved",
            Feature::Placement => "placement",
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
    /// Why it is kept in the tier whatever its score, if it is: not a
    /// feature of the model.
    pub floor: Option<Floor>,
}

/// Why a segment the model may read as narrative is kept, verbatim, in the
/// standing-instructions tier. Ordered by precedence: a span with both is
/// kept as a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Floor {
    /// A directive with a time limit, not asked, reported or shown: "no
    /// deploys until the on-call is back".
    Hold,
    /// A practice of the writer's team stated as a plain fact: "we pin
    /// base images by digest".
    Practice,
    /// How a kind of thing is handled, stated as a plain fact: "secrets
    /// live in vault", "public functions get docstrings".
    Norm,
}

impl Floor {
    /// Its mark in an explanation.
    pub fn mark(self) -> &'static str {
        match self {
            Floor::Hold => "+hold",
            Floor::Practice => "+practice",
            Floor::Norm => "+norm",
        }
    }
}

/// The word that stands for a run of code.
const CODE: &str = "`";

/// One segment as cut: its words and what ended it.
#[derive(Debug, Default)]
struct Cut<'t> {
    start: usize,
    end: usize,
    /// Lower-cased; borrowed from the text where it reads the same.
    words: Vec<Cow<'t, str>>,
    /// Words before the first colon that is followed by more text.
    colon_after: Option<usize>,
    /// Whether a comma, dash or colon directly follows the first word.
    first_punctuated: bool,
    /// Words before each comma or dash inside the segment.
    breaks: Vec<usize>,
    question_mark: bool,
    quote: bool,
    arrow: bool,
    placeholder: bool,
    digits_with_unit: bool,
    /// Closed by a colon after a long lead-in ("the old team wrote in the
    /// wiki: …").
    lead_in: bool,
    /// The words as the lexicon reads them.
    lexed: Lexed,
}

/// Room made for a segment's words at its first: most sentences fit.
const WORDS_PER_CUT: usize = 16;

impl<'t> Cut<'t> {
    /// Adds a word.
    fn push_word(&mut self, word: Cow<'t, str>) {
        if self.words.is_empty() {
            self.words.reserve(WORDS_PER_CUT);
        }
        self.words.push(word);
    }
}

/// Cuts `text` into segments and describes each. Span-level features
/// (role, length, acknowledgement, output-likeness) are set on every
/// segment, so that each segment's score stands on its own.
pub fn segments(text: &str, system_role: bool) -> Vec<Segment> {
    let code = code_ranges(text);
    let cuts = cut(text, &code);
    // Each line is found and judged once, however many sentences it
    // holds: cuts come in order, so one pass over the text finds them all.
    let mut lines = Lines::new(text);
    let placed: Vec<(Line, bool)> = cuts
        .iter()
        .map(|c| {
            let line = lines.holding(c.start);
            let line_end = lines.ends_after(c.end);
            (line, line_end)
        })
        .collect();
    let output_lines: Vec<bool> = cuts
        .iter()
        .zip(&placed)
        .map(|(c, (line, _))| line.output || comment(text.get(c.start..).unwrap_or("")))
        .collect();
    let pasted = output_lines.iter().any(|o| *o);
    let total_words: usize = cuts.iter().map(|c| c.words.len()).sum();
    let output_like = output_like(text, &code);
    let ack = total_words <= 8
        && total_words > 0
        && cuts
            .iter()
            .all(|c| c.lexed.classes.iter().all(|k| k & class::ACK != 0));
    let many = cuts.len() > 1;
    let mut shown = false;
    // What a lead-in that reports or presents introduces after its colon.
    let mut introduced = false;
    // At most one segment per cut.
    let mut out = Vec::with_capacity(cuts.len());
    let described = cuts
        .into_iter()
        .zip(output_lines)
        .zip(placed)
        .filter(|((c, _), _)| c.words.iter().any(|w| *w != CODE))
        .map(|((c, output), (line, line_end))| {
            let mut f = describe(&c);
            if output {
                f.set(Feature::OutputLine);
            }
            if pasted {
                f.set(Feature::Pasted);
            }
            let rest = text.get(c.end..).unwrap_or("");
            // What a presenting line introduces is shown; when that is a
            // fenced block, the fence holds all of it. The presenting line
            // itself says nothing either.
            let after = rest.trim_start();
            let colon = after.starts_with(':');
            let fenced = after
                .trim_start_matches(':')
                .trim_start()
                .starts_with("```");
            let presenting = line_end && presents(&c.lexed, colon);
            if shown || introduced || presenting || line.quoted {
                f.set(Feature::Shown);
            }
            introduced = c.lead_in
                && (f.on(Feature::Attributed)
                    || c.lexed.classes.iter().any(|k| k & class::SHOWING != 0));
            if introduced {
                f.set(Feature::Shown);
            }
            shown = shown || (presenting && !fenced);
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
            let plain = !NOT_PLAIN.iter().any(|x| f.on(*x));
            let floor = if is_hold(&f) {
                Some(Floor::Hold)
            } else if plain && !f.on(Feature::Past) && practice(&c) {
                Some(Floor::Practice)
            } else if plain && !f.on(Feature::Acknowledgement) && norm(&c, f.on(Feature::Past)) {
                Some(Floor::Norm)
            } else {
                None
            };
            Segment {
                range: (c.start, c.end),
                features: f,
                floor,
            }
        });
    out.extend(described);
    out
}

/// Whether the character at `at` opens a word: at the start, or after
/// white space, a colon or an opening bracket.
fn word_starts(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_none_or(|p| p.is_whitespace() || matches!(p, ':' | '(' | '['))
}

fn is_apostrophe(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}' | '\u{2018}')
}

/// Lines, then sentences (`.`, `!`, `?` before white space or the end, and
/// `;`); code runs become one placeholder word.
fn cut<'t>(text: &'t str, code: &[(usize, usize)]) -> Vec<Cut<'t>> {
    let mut code_at = code.iter().peekable();
    let mut cuts = Vec::new();
    let mut current = Cut::default();
    // The word being read, if any.
    let mut word: Option<Pending> = None;
    // Inside double quotes: a quotation of several sentences is quoted
    // throughout.
    let mut in_quote = false;
    // Where the next character starts: the text is read from a byte
    // offset, so a run the loop takes whole is stepped over at once.
    let mut pos = 0;
    // The word read so far ends before `end`.
    let finish_word = |current: &mut Cut<'t>, word: &mut Option<Pending>, end: usize| {
        if let Some(w) = word.take() {
            current.push_word(w.finish(text, end));
        }
    };
    while let Some(c) = char_at(text, pos) {
        let at = pos;
        pos += c.len_utf8();
        while code_at.peek().is_some_and(|&&(_, end)| end <= at) {
            code_at.next();
        }
        if let Some(&&(start, end)) = code_at.peek()
            && start <= at
        {
            finish_word(&mut current, &mut word, at);
            if current.words.last().is_none_or(|w| *w != CODE) {
                current.push_word(Cow::Borrowed(CODE));
            }
            // Skip to the end of the code run: the first character that
            // starts at or after it.
            pos = end.clamp(pos, text.len());
            while !text.is_char_boundary(pos) {
                pos += 1;
            }
            current.end = end;
            continue;
        }
        // A run of ASCII letters, digits and underscores is taken whole:
        // no code starts inside it.
        if c.is_ascii_alphanumeric() || c == '_' {
            pos = word
                .get_or_insert_with(|| Pending::at(at))
                .push_ascii_run(text, at);
            current.end = pos;
            continue;
        }
        let next = char_at(text, pos);
        if is_word_char(c) {
            word.get_or_insert_with(|| Pending::at(at))
                .push(text, at, c);
            current.end = at + c.len_utf8();
            continue;
        }
        if is_apostrophe(c)
            && next.is_some_and(is_word_char)
            && let Some(w) = word.as_mut()
        {
            w.push_apostrophe(text, at, c);
            continue;
        }
        // "package.json", "os.path", "v1.2" are one word.
        if c == '.'
            && next.is_some_and(is_word_char)
            && let Some(w) = word.as_mut()
        {
            w.push(text, at, c);
            current.end = at + 1;
            continue;
        }
        finish_word(&mut current, &mut word, at);
        let boundary_space = next.is_none_or(char::is_whitespace);
        match c {
            '\n' | ';' => {
                close(&mut cuts, &mut current, at + c.len_utf8());
                in_quote &= c != '\n';
                current.quote = in_quote;
                continue;
            }
            '.' | '!' | '?' | '…' if boundary_space => {
                if c == '?' {
                    current.question_mark = true;
                }
                close(&mut cuts, &mut current, at + c.len_utf8());
                current.quote = in_quote;
                continue;
            }
            '?' | '¿' => current.question_mark = true,
            // After a long lead-in, a colon ends a sentence: "one rule for
            // the whole project: never tag images as latest".
            ':' if boundary_space
                && (current.words.len() > 6
                    || (current.words.len() > 1
                        && current.words.iter().any(|w| {
                            SHOWING_VERBS.contains(&w.as_ref())
                                || SAYING_VERBS.contains(&w.as_ref())
                        }))) =>
            {
                current.lead_in = true;
                close(&mut cuts, &mut current, at + c.len_utf8());
                current.quote = in_quote;
                continue;
            }
            ':' if boundary_space && current.colon_after.is_none() => {
                current.colon_after = Some(current.words.len());
                if current.words.len() == 1 {
                    current.first_punctuated = true;
                }
            }
            ',' | '—' | '–' | '-' if boundary_space && !current.words.is_empty() => {
                if current.words.len() == 1 {
                    current.first_punctuated = true;
                }
                // A hyphen breaks only between spaces.
                if c != '-' || text[..at].ends_with(' ') {
                    current.breaks.push(current.words.len());
                }
            }
            '"' | '“' | '”' | '«' | '»' => {
                current.quote = true;
                in_quote = match c {
                    '“' | '«' => true,
                    '”' | '»' => false,
                    _ => !in_quote,
                };
            }
            // An opening single quote: "wrote 'never touch …'".
            '\'' | '‘' if word_starts(text, at) && next.is_some_and(is_word_char) => {
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
    finish_word(&mut current, &mut word, text.len());
    close(&mut cuts, &mut current, text.len());
    cuts
}

fn close<'t>(cuts: &mut Vec<Cut<'t>>, current: &mut Cut<'t>, next_start: usize) {
    let mut done = std::mem::take(current);
    current.start = next_start;
    current.end = next_start;
    if done.words.is_empty() {
        return;
    }
    let matcher = Matcher::get();
    let head_end = |done: &Cut<'_>| done.breaks.first().copied().unwrap_or(done.words.len());
    done.lexed = matcher.scan(&done.words, head_end(&done));
    // Idioms read as one word: "never mind" forbids nothing, "don't
    // forget" reminds. The words are read again only when one was found.
    if done
        .lexed
        .classes
        .iter()
        .any(|k| k & class::IDIOM_HEAD != 0)
        && read_idioms(&mut done)
    {
        done.lexed = matcher.scan(&done.words, head_end(&done));
    }
    // A colon right at the end ("Rules:") labels what follows, not this.
    if done.colon_after == Some(done.words.len()) {
        done.colon_after = None;
    }
    done.digits_with_unit |= (1..done.words.len()).any(|i| {
        done.lexed.is(i, class::UNIT) && done.words[i - 1].bytes().all(|b| b.is_ascii_digit())
    });
    cuts.push(done);
}

/// Replaces each idiom ([`IDIOMS`]) by its one word, in one pass, and
/// moves the colon and the breaks with the words; whether there was any.
/// Only a word the lexicon marks as an idiom's head can start one.
fn read_idioms(done: &mut Cut<'_>) -> bool {
    let head = |lexed: &Lexed, i: usize| lexed.is(i, class::IDIOM_HEAD);
    if !(0..done.words.len()).any(|i| head(&done.lexed, i) && idiom_at(&done.words, i).is_some()) {
        return false;
    }
    let mut old = std::mem::take(&mut done.words);
    done.words.reserve(old.len());
    // Where each old word went.
    let mut moved = Vec::with_capacity(old.len() + 1);
    let mut i = 0;
    while i < old.len() {
        let idiom = if head(&done.lexed, i) {
            idiom_at(&old, i)
        } else {
            None
        };
        match idiom {
            Some((idiom, word)) => {
                moved.extend(std::iter::repeat_n(done.words.len(), idiom.len()));
                done.words.push(Cow::Borrowed(word));
                i += idiom.len();
            }
            None => {
                moved.push(done.words.len());
                done.words.push(std::mem::take(&mut old[i]));
                i += 1;
            }
        }
    }
    let len = done.words.len();
    let at = |k: usize| moved.get(k).copied().unwrap_or(len);
    done.colon_after = done.colon_after.map(at);
    done.breaks.iter_mut().for_each(|k| *k = at(*k));
    true
}

/// The idiom that starts at word `i`, if any.
fn idiom_at(
    words: &[Cow<'_, str>],
    i: usize,
) -> Option<&'static (&'static [&'static str], &'static str)> {
    IDIOMS
        .iter()
        .find(|(idiom, _)| words.get(i..i + idiom.len()).is_some_and(|p| p == *idiom))
}

/// The first word that carries meaning: bullets, fillers and greetings
/// skipped.
fn first_content(lx: &Lexed) -> usize {
    (0..lx.classes.len())
        .find(|&i| !lx.is(i, class::LEAD_FILLER))
        .unwrap_or(lx.classes.len())
}

fn describe(c: &Cut<'_>) -> Features {
    let mut f = Features([0.0; FEATURE_COUNT]);
    let w = &c.words[..];
    let lx = &c.lexed;
    let found = lx.found;
    let start = first_content(lx);
    let word = |i: usize| w.get(i).map_or("", |x| x.as_ref());
    let first = word(start);
    let second = word(start + 1);

    // "leave the staging db alone": a prohibition around its object.
    let leave_alone = leave_then(w, |after| {
        after.iter().take(LEAVE_REACH).any(|y| y == "alone")
    });
    let neg = found.has(Set::NegModal) || leave_alone;
    let expects = found.has(Set::Expectation);
    let req = demands(found);
    let restrict = found.has(Set::Restrict);
    if neg {
        f.set(Feature::NegModal);
    }
    if req {
        f.set(Feature::ReqModal);
    }
    // "feel free to restyle the page, but not the footer", "move anything
    // except the fixtures", "edit whatever you need, the wire format is
    // frozen": a choice left, then limited. The limit restricts.
    let excepted = leaves_choice(lx, start, first, second)
        && (found.has(Set::Exception)
            || (found.has(Set::Invariant)
                && (!c.breaks.is_empty() || w.iter().any(|x| x == "but"))));
    let restrict = restrict || excepted;
    if restrict {
        f.set(Feature::Restrict);
    }
    // "can you use …", "could you please keep …": a request, imperative
    // in all but form; `verb_at` is the verb that opens the sentence or
    // follows the request's frame.
    let request_frame = matches!(first, "can" | "could" | "would" | "will") && second == "you";
    let verb_at = if request_frame {
        (start + 2..w.len())
            .find(|&i| !lx.is(i, class::LEAD_FILLER))
            .unwrap_or(w.len())
    } else {
        start
    };
    // "Commit messages: imperative", "test names: …": a label, not a
    // log line's header ("Error: …", "Caused by: …") or a counter's.
    let label = c.colon_after.filter(|&k| {
        (1..=6).contains(&k)
            && w.len() > k
            && !LOG_LABELS.contains(&w[k - 1].as_ref())
            && !LOG_LEVELS.contains(&w[0].as_ref())
            && !SUBJECT_PRONOUNS.contains(&w[0].as_ref())
            && !matches!(w[0].as_ref(), "from" | "to" | "re" | "at" | "in")
            // "Turn 3:", "Step 2:": a counter's heading.
            && !w[k - 1].chars().all(|c| c.is_ascii_digit())
            && !(0..k).any(|i| lx.is(i, class::SAYING | class::SHOWING_VERB))
    });
    // A short label opens with a noun ("Log lines: JSON"), not a verb.
    let labelled = label.is_some_and(|k| k <= 3);
    let imperative = ((lx.is(start, class::IMPERATIVE) || opens_absolute(first, second))
        && !c.question_mark
        && !labelled)
        || (request_frame && lx.is(verb_at, class::IMPERATIVE));
    if imperative {
        f.set(Feature::Imperative);
    }
    // "no tabs", "zero deps", also after a label: "Reminder: no PII".
    let ban_at = |i: usize| {
        let next = word(i + 1);
        // "No, use the other one" is an answer, not a ban.
        let interjection = i == start && c.first_punctuated;
        // "not a single print", "not one TODO", "0 warnings".
        let counted_none = (word(i) == "not"
            && (next == "one" || (next == "a" && word(i + 2) == "single")))
            || (word(i) == "0"
                && !next.is_empty()
                && !next.starts_with(|c: char| c.is_ascii_digit()));
        // "nothing that touches billing": a relative clause, where "no
        // that's wrong" is an answer.
        let relative = next == "that" && word(i) == "nothing";
        counted_none
            || (lx.is(i, class::BAN_HEAD)
                && !next.is_empty()
                && !interjection
                && (relative || !BAN_NOT_FOLLOWED_BY.contains(&next)))
    };
    // Also inside a list of rules: "…, and no new dependencies",
    // "absolutely no DB writes".
    let ban_inside = (1..w.len()).any(|i| lx.is(i - 1, class::BAN_LEADER) && ban_at(i));
    if ban_at(start)
        || c.colon_after.is_some_and(ban_at)
        || c.breaks.iter().any(|&k| ban_at(k))
        || ban_inside
    {
        f.set(Feature::NounBan);
    }
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
    // "all new code", "every PR", not "all the PNGs" or "each of the
    // TODOs" (one set of things).
    if (0..w.len())
        .any(|i| lx.is(i, class::QUANTIFIER) && !lx.is(i + 1, class::DEFINITE_AFTER_QUANTIFIER))
    {
        f.set(Feature::Quantifier);
    }
    if found.has(Set::Preference) {
        f.set(Feature::Preference);
    }
    let opens_question = lx.is(start, class::WH_WORD)
        || (lx.is(start, class::AUXILIARY) && lx.is(start + 1, class::QUESTION_SUBJECT));
    let asks = c.question_mark || opens_question;
    // "please" asks something of the reader; "what would you use?" only
    // asks.
    if found.has(Set::Polite) && (request_frame || !asks) {
        f.set(Feature::Polite);
    }
    // The action of a condition: a word of acting, or an imperative right
    // after the condition's comma ("if you touch billing, tag me").
    let acts_after_comma = c
        .breaks
        .first()
        .is_some_and(|&k| lx.is(k, class::IMPERATIVE | class::TASK));
    // "should we use redis?" and "where should it go" open like "should
    // it fail, stop" and "when in doubt, ask", but ask.
    let opens_condition =
        lx.is(start, class::CONDITION_OPENER) || (first == "in" && second == "case");
    if opens_condition
        && (found.has(Set::ConditionAction) || acts_after_comma)
        && !c.question_mark
        && (!opens_question || !c.breaks.is_empty())
    {
        f.set(Feature::Conditional);
    }
    let stop_doing = w
        .windows(2)
        .any(|p| matches!(p[0].as_ref(), "stop" | "quit") && p[1].ends_with("ing"));
    // "again" corrects when it forbids or opens the sentence ("again,
    // tests go in tests/"), not in "run it again".
    let corrects_again =
        neg || (first == "again" && c.first_punctuated) || w.iter().any(|x| x == "wrong");
    let again = found.has(Set::Again) && corrects_again;
    if stop_doing || again || found.has(Set::Correction) {
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
    if opens_question {
        f.set(Feature::QuestionOpening);
    }
    if asks && !request_frame {
        f.set(Feature::OpenQuestion);
    }
    let temporal = found.has(Set::Temporal);
    if temporal {
        f.set(Feature::Temporal);
    }
    if found.has(Set::Step)
        || w.windows(2)
            .any(|p| p[0] == "line" && p[1].chars().all(|c| c.is_ascii_digit()))
        || points_at_step(w, &c.breaks)
        || (found.has(Set::Again) && !corrects_again)
    {
        f.set(Feature::StepLocal);
    }
    // "keep the logs terse, ops asked for that": the writer's own
    // directive, then whom it comes from. What follows the comma is the
    // rule's source, a reason like "otherwise …", not a report of someone
    // else's rule ("ops said to keep the logs terse").
    let sourced = !c.quote
        && c.breaks.first().is_some_and(|&k| {
            k > start
                && (imperative
                    || ban_at(start)
                    || lx.head.has(Set::NegModal)
                    || demands(lx.head)
                    || lx.head.has(Set::Restrict))
                && !lx.head.has(Set::Report)
                && !lx.head.has(Set::Past)
                && !(start..k).any(|i| lx.is(i, class::SAYING | class::ATTRIBUTION))
                && !(start.max(1)..k).any(|i| told_in_past_at(w, lx, i))
        });
    let report = (found.has(Set::Report) || c.quote) && !sourced;
    if report {
        f.set(Feature::Report);
    }
    // "if the user asks for …" is a condition, not a report.
    if attributed(w, lx) && !opens_condition && !sourced {
        f.set(Feature::Attributed);
    }
    // "use pathlib, not os.path", "comments explain why, not what".
    if c.breaks.iter().any(|&k| word(k) == "not") {
        f.set(Feature::Contrast);
    }
    if agent_clause(w, lx, start) {
        f.set(Feature::AgentClause);
    }
    // "we never had this problem" tells, "we never push on Fridays" rules.
    let third = start + 2;
    // So does "I only have read access": the writer's own state.
    let tells_past = matches!(second, "never" | "always" | "only")
        && (found_past(word(third))
            || regular_past(word(third), lx, third)
            || (first == "i" && WRITER_STATES.contains(&word(third))));
    // "it's essential that …" frames a demand; it tells nothing.
    let frames_demand = matches!(first, "it's" | "its" | "it") && found.has(Set::DemandFrame);
    if lx.is(start, class::STATEMENT_SUBJECT)
        && (!lx.is(start + 1, class::MODAL_AFTER_SUBJECT) || tells_past)
        && !(first == "you"
            || (first == "we" && matches!(second, "never" | "always" | "only") && !tells_past))
        && !frames_demand
    {
        f.set(Feature::Statement);
    }
    if found.has(Set::Deictic) {
        f.set(Feature::Deictic);
    }
    if found.has(Set::Epistemic) || expects {
        f.set(Feature::Epistemic);
    }
    if found.has(Set::Observed) {
        f.set(Feature::Observed);
    }
    // A clause that opens with a directive, past a filler: after a comma
    // or dash, or after "so" ("the db is shared with QA, so leave it
    // alone", "… so please keep …", "… so no pushes to main"); not "never"
    // before a past form ("…, never seen it before").
    let opens_clause = |k: usize| {
        let at = (k..w.len())
            .find(|&i| !lx.is(i, class::LEAD_FILLER))
            .unwrap_or(w.len());
        let next = word(at + 1);
        let forbids =
            opens_absolute(word(at), next) && !found_past(next) && !regular_past(next, lx, at + 1);
        at > start && at < w.len() && (forbids || lx.is(at, class::IMPERATIVE) || ban_at(at))
    };
    let after_so = (start + 1..w.len()).filter(|&i| w[i - 1] == "so");
    if !c.question_mark && c.breaks.iter().copied().chain(after_so).any(opens_clause) {
        f.set(Feature::ClauseDirective);
    }
    if found.has(Set::Justified) || (sourced && found.has(Set::Report)) {
        f.set(Feature::Justified);
    }
    // "leave the vendor calls to me": kept by the writer, around its
    // object.
    let leave_to_me = leave_then(w, |after| {
        after
            .windows(2)
            .take(LEAVE_REACH)
            .any(|p| p[0] == "to" && p[1] == "me")
    });
    if found.has(Set::Reserved) || leave_to_me {
        f.set(Feature::Reserved);
    }
    let placed = w.windows(2).any(|p| {
        matches!(
            p[0].as_ref(),
            "go" | "goes" | "belong" | "belongs" | "stay" | "stays"
        ) && matches!(p[1].as_ref(), "in" | "into" | "under" | "inside")
    });
    if placed {
        f.set(Feature::Placement);
    }
    if found.has(Set::Past) || told_in_past(w, lx) {
        f.set(Feature::Past);
    }
    if found.has(Set::ForeignDirective) || opens_foreign_prohibition(first, second) {
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
    if directive && asks {
        f.set(Feature::DirectiveQuestion);
    }
    if directive && (report || f.on(Feature::Attributed)) {
        f.set(Feature::DirectiveReport);
    }
    if label.is_some() && format {
        f.set(Feature::LabelFormat);
    }
    if imperative && neg {
        f.set(Feature::NegativeImperative);
    }
    if found.has(Set::Polite) && request_frame && asks {
        f.set(Feature::PoliteQuestion);
    }
    // "can you write …", "could you please add …": the verb after the
    // request's frame.
    let task = lx.is(verb_at, class::TASK) && !labelled;
    if task {
        f.set(Feature::TaskVerb);
    }
    // "draft an email announcing that we'll never …": what the task
    // produces says it, the writer does not.
    if task && (verb_at + 1..w.len()).any(|i| TASK_CONTENT.contains(&w[i].as_ref())) {
        f.set(Feature::TaskContent);
    }
    let maintaining = lx.is(verb_at, class::MAINTAINING);
    if maintaining {
        f.set(Feature::Maintaining);
    }
    if lx.is(verb_at, class::IMPERATIVE | class::TASK)
        && !neg
        && !excepted
        && !c.question_mark
        && !maintaining
        && specific_object(w, lx, verb_at + 1)
    {
        f.set(Feature::SpecificObject);
    }
    f
}

/// Whether some "leave" or "leaves" is followed by words for which
/// `after` holds ("leave the staging db alone", "leave the vendor calls
/// to me").
fn leave_then(w: &[Cow<'_, str>], after: impl Fn(&[Cow<'_, str>]) -> bool) -> bool {
    w.iter()
        .enumerate()
        .any(|(i, x)| matches!(x.as_ref(), "leave" | "leaves") && after(&w[i + 1..]))
}

/// How far past "leave" the word that completes it may start.
const LEAVE_REACH: usize = 6;

/// Whether a segment's features hold something back for a time: a
/// directive with a time limit ("no deploys until the on-call is back",
/// "don't merge anything until the release is cut"), not asked, reported,
/// shown as output or telling what was seen ("nothing in the logs yet").
/// The model reads a hold as transient, and the training split labels
/// holds narrative; but a hold binds until it is lifted, which may be days
/// of turns away, so a hold the model scores as narrative is kept,
/// verbatim, in the standing-instructions tier.
fn is_hold(f: &Features) -> bool {
    f.on(Feature::DirectiveTemporal)
        && ![
            Feature::DirectiveQuestion,
            Feature::DirectiveReport,
            Feature::Observed,
            Feature::OutputLine,
            Feature::Shown,
        ]
        .into_iter()
        .any(|x| f.on(x))
}

/// What a segment says that makes it no practice and no norm: a
/// question, what was seen, one step, a time limit, someone else's words,
/// a guess, or output. A practice is not in the past either; a norm reads
/// the past itself ([`norm`]), since "invoices are numbered by billing" is
/// a passive, and is no reply ("yep go ahead").
const NOT_PLAIN: [Feature; 11] = [
    Feature::Question,
    Feature::QuestionOpening,
    Feature::Observed,
    Feature::StepLocal,
    Feature::Deictic,
    Feature::Temporal,
    Feature::Report,
    Feature::Attributed,
    Feature::Epistemic,
    Feature::Shown,
    Feature::OutputLine,
];

/// Whether the words state a practice of the writer's team: "we pin base
/// images by digest", "in this repo we use pnpm", "timestamps: we store
/// UTC", "the team squashes every merge". The subject opens the segment,
/// its label or a clause after a comma, or follows a short place
/// ("in this repo", "on the backend", "around here"); an adverb of habit
/// may come before the verb. Not a practice: "here we loop over …" walks
/// through code, "when we deploy, …" is a condition, and a sequence of
/// events ("we deploy and then …", "we merge it and the bot reverts it",
/// "… but the build fails", "…, which is slow") tells what happens.
fn practice(c: &Cut<'_>) -> bool {
    let w = &c.words[..];
    let start = first_content(&c.lexed);
    // Where a subject may stand: the segment's first word, right after a
    // comma or a label's colon, or after a place of at most four words.
    let opens = |i: usize| {
        i == start
            || c.breaks.contains(&i)
            || c.colon_after == Some(i)
            || (i > start
                && i - start <= 4
                && matches!(
                    w[start].as_ref(),
                    "in" | "on" | "at" | "around" | "across" | "for"
                )
                && !w[start..i].iter().any(|x| x == "if" || x == "when"))
    };
    let stated = (0..w.len()).any(|i| {
        let (subject, third_person) = match w[i].as_ref() {
            "we" => (Some(i), false),
            "everyone" | "everybody" => (Some(i), true),
            "team" => (
                i.checked_sub(1)
                    .filter(|&d| matches!(w[d].as_ref(), "the" | "our")),
                true,
            ),
            _ => return false,
        };
        if !subject.is_some_and(opens) {
            return false;
        }
        let Some(verb) =
            (i + 1..w.len().min(i + 4)).find(|&k| !PRACTICE_ADVERBS.contains(&w[k].as_ref()))
        else {
            return false;
        };
        let said = w[verb].as_ref();
        let base = if third_person {
            said.strip_suffix("es")
                .filter(|b| b.ends_with(['s', 'h', 'x']))
                .or_else(|| said.strip_suffix('s'))
        } else {
            Some(said)
        };
        let Some(base) = base.filter(|b| PRACTICE_VERBS.contains(b)) else {
            return false;
        };
        let next = w.get(verb + 1).map_or("", |n| n.as_ref());
        let happened = PRACTICE_NOT_FOLLOWED_BY.contains(&next)
            // "we keep getting 429s": what goes on happening.
            || (base == "keep" && next.ends_with("ing"))
            // "we log in with the admin account".
            || (base == "log" && matches!(next, "in" | "on" | "out"))
            || (next == "a" && w.get(verb + 2).is_some_and(|n| n == "lot"));
        !happened
    });
    // A sequence of events, read only once a practice is stated.
    stated && !sequence(c)
}

/// Whether the words tell a sequence of events: "then", "but", "and"
/// before a new subject ("we merge it and the bot reverts it"), or ",
/// which …".
fn sequence(c: &Cut<'_>) -> bool {
    let w = &c.words[..];
    w.iter().enumerate().any(|(i, x)| match x.as_ref() {
        "then" | "but" => true,
        "and" => w
            .get(i + 1)
            .is_some_and(|n| NEXT_SUBJECTS.contains(&n.as_ref())),
        "which" => c.breaks.contains(&i),
        _ => false,
    })
}

/// The most words a norm is said in: a longer sentence tells more than how
/// a kind of thing is handled.
const NORM_MAX_WORDS: usize = 20;

/// How far past the subject's first word the verb of a norm may stand:
/// "changes to the billing schema get …".
const NORM_SUBJECT_REACH: usize = 6;

/// Whether the words state how a kind of thing is handled, as a plain
/// fact: "secrets live in vault", "public functions get docstrings",
/// "anything touching auth gets a security review", "invoices are kept in
/// pdf form", "error messages are in english". The subject opens the
/// segment or its label and names a kind: a bare noun, a quantifier or a
/// code name, not "the", "my", a pronoun or a person. A verb of where
/// things live, go and come from, or what they get or need, follows
/// within a few words; "is"/"are" counts when a participle and a
/// preposition ("is kept in") or "in" and a bare noun ("are in english")
/// follow it. Not a norm: trouble told in the present ("requests get
/// dropped", "new users get a 500", "builds go red"), the past, or a
/// sequence of events.
fn norm(c: &Cut<'_>, told_past: bool) -> bool {
    let w = &c.words[..];
    let lx = &c.lexed;
    if w.len() > NORM_MAX_WORDS {
        return false;
    }
    let start = match c.colon_after {
        Some(label) if label < w.len() => label,
        _ => first_content(lx),
    };
    if start >= w.len() {
        return false;
    }
    // A kind, not one thing, a person, a clause or a request: "the logs",
    // "my branch", "you", "if …", "refactor … to use …". A verb opens a
    // kind's name only before a plural: "build artifacts", "test
    // fixtures".
    let compound = w
        .get(start + 1)
        .is_some_and(|n| n.len() > 3 && n.ends_with('s') && !n.ends_with("ss"));
    let request = lx.is(start, class::IMPERATIVE | class::TASK) && !compound;
    let not_a_kind = class::STATEMENT_SUBJECT
        | class::ACK
        | class::SPECIFIC
        | class::WRITER
        | class::WH_WORD
        | class::AUXILIARY
        | class::CONDITION_OPENER
        | class::QUESTION_SUBJECT
        | class::SAYING
        | class::BAN_HEAD
        | class::NORM_NOT_SUBJECT;
    if request || lx.is(start, not_a_kind) || lx.is(start + 1, class::SPECIFIC) {
        return false;
    }
    let reach = w.len().min(start + 1 + NORM_SUBJECT_REACH);
    // The first verb after the subject, if it is a norm's: the subject
    // ends at a comma or a word that opens a clause ("to" opens none).
    let verb = (start + 1..reach).find_map(|k| {
        let said = w[k].as_ref();
        let next = w.get(k + 1).map_or("", |n| n.as_ref());
        if matches!(said, "is" | "are") {
            // "are in english", "is in pdf form": a form, not a place.
            let in_a_form = next == "in" && k + 2 < w.len() && !lx.is(k + 2, class::SPECIFIC);
            // "is kept in the archive", "are kept out of git".
            let passive = (regular_past(next, lx, k + 1) || found_past(next))
                && w.get(k + 2)
                    .is_some_and(|n| NORM_PREPOSITIONS.contains(&n.as_ref()));
            return Some((in_a_form || passive).then_some(k));
        }
        if c.breaks.contains(&k)
            || (said != "to"
                && lx.is(
                    k,
                    class::WRITER | class::CONDITION_OPENER | class::AUXILIARY,
                ))
            || lx.is(k, class::NORM_NOT_SUBJECT)
        {
            return Some(None);
        }
        lx.is(k, class::NORM_VERB).then_some(Some(k))
    });
    let Some(Some(verb)) = verb else {
        return false;
    };
    let after = &w[verb + 1..];
    // Trouble told in the present: "requests get dropped", "new users get
    // a 500", "PRs sit for days".
    let trouble = after.iter().enumerate().any(|(i, x)| {
        lx.is(verb + 1 + i, class::NORM_TROUBLE)
            || (x.len() == 3 && x.starts_with('5') && x.bytes().all(|b| b.is_ascii_digit()))
            || (x == "for"
                && after
                    .get(i + 1)
                    .is_some_and(|n| NORM_LONG_WAITS.contains(&n.as_ref())))
    });
    // The past the features found, but for the participle of a passive:
    // "were moved", "got lost", but not "is kept".
    let past = told_past
        && (0..w.len()).any(|i| {
            let passive = i
                .checked_sub(1)
                .is_some_and(|b| matches!(w[b].as_ref(), "is" | "are" | "be" | "get" | "gets"));
            !passive && (found_past(&w[i]) || (i > 0 && told_in_past_at(w, lx, i)))
        });
    !trouble && !past && !sequence(c)
}

/// Whether a directive opens on `first` (then `second`) with a word that
/// forbids or binds always: "don't", "never", "always", "do not".
fn opens_absolute(first: &str, second: &str) -> bool {
    matches!(first, "don't" | "dont" | "never" | "always") || (first == "do" && second == "not")
}

/// Whether the words from `from` on, after particles ("clean up the …",
/// "go ahead and merge it"), open by naming one particular thing: a
/// definite or demonstrative determiner, a pronoun, or "a"/"an".
fn specific_object(w: &[Cow<'_, str>], lx: &Lexed, from: usize) -> bool {
    let mut at = (from..w.len()).find(|&i| !lx.is(i, class::PARTICLE));
    // "remember to save the file", "be sure to restart the server": the
    // object of the verb that follows.
    for _ in 0..2 {
        if let Some(i) = at
            && (w[i] == "sure" || lx.is(i, class::IMPERATIVE | class::TASK))
        {
            at = (i + 1..w.len()).find(|&k| !lx.is(k, class::PARTICLE));
        }
    }
    // "in the same language" names a kind, not a thing.
    at.is_some_and(|i| lx.is(i, class::SPECIFIC) && w.get(i + 1).is_none_or(|n| n != "same"))
}

/// Whether someone other than the writer is said to have said or wanted
/// something: a verb of saying after a subject that is not "I", or an
/// attribution ("according to", "apparently").
fn attributed(w: &[Cow<'_, str>], lx: &Lexed) -> bool {
    (0..w.len()).any(|i| {
        lx.is(i, class::ATTRIBUTION)
            || (w[i] == "according" && w.get(i + 1).is_some_and(|n| n == "to"))
            || (lx.is(i, class::SAYING) && {
                // The subject, past adverbs: "you always mentioned"; "used
                // to say" reports, "needless to say" does not.
                let subject = (0..i).rev().find(|&k| !lx.is(k, class::AGENT_ADVERB));
                subject.is_some_and(|k| {
                    !lx.is(k, class::WRITER)
                        || (w[k] == "to"
                            && k > 0
                            && matches!(w[k - 1].as_ref(), "used" | "likes" | "keeps"))
                })
            })
    })
}

/// Whether a segment opens with a prohibition in French or Italian, which
/// has no subject: "ne pousse pas …", "n'efface …" (a statement opens with
/// its subject: "ça ne compile pas"), or "non" before an infinitive ("non
/// cambiare …", where "non parte" tells).
fn opens_foreign_prohibition(first: &str, second: &str) -> bool {
    let infinitive = second.chars().count() >= 5
        && (second.ends_with("are") || second.ends_with("ere") || second.ends_with("ire"));
    first == "ne" || (first.starts_with("n'") && first.len() > 3) || (first == "non" && infinitive)
}

/// Whether the words `found` demand something: a requirement modal, a
/// demand framed as what matters, or "should" that does not expect ("that
/// should be fixed now", "the next run should be quicker").
fn demands(found: Found) -> bool {
    found.has(Set::ReqModal)
        || found.has(Set::DemandFrame)
        || (found.has(Set::Should) && !found.has(Set::Expectation))
}

/// Whether the segment leaves a choice to the reader: a phrase of
/// [`PERMISSIONS`], or "you can" / "you may" before a verb of acting at
/// its start ("you can reword the docs", not "you can see the log").
fn leaves_choice(lx: &Lexed, start: usize, first: &str, second: &str) -> bool {
    lx.found.has(Set::Permission)
        || (matches!(first, "you" | "u")
            && matches!(second, "can" | "may")
            && lx.is(
                start + 2,
                class::IMPERATIVE | class::TASK | class::MAINTAINING,
            ))
}

/// Whether a regular past tense tells what happened: an "-ed" word not
/// after a determiner, a preposition or a verb, where it is an adjective
/// ("the generated files", "rewrite published history").
fn told_in_past(w: &[Cow<'_, str>], lx: &Lexed) -> bool {
    (1..w.len()).any(|i| told_in_past_at(w, lx, i))
}

/// Whether word `i` (not the first) is a regular past tense that tells
/// what happened ([`told_in_past`]).
fn told_in_past_at(w: &[Cow<'_, str>], lx: &Lexed, i: usize) -> bool {
    regular_past(&w[i], lx, i)
        && !lx.is(
            i - 1,
            class::BEFORE_ADJECTIVE | class::IMPERATIVE | class::TASK,
        )
}

/// A clause about what the agent will do, inside a sentence: "whenever
/// you change …", "every PR you open", "before you write code". Not a
/// question's "do you" or a request's "can you", not the past ("the
/// change you made"), and not one step's clause ("before you send it").
fn agent_clause(w: &[Cow<'_, str>], lx: &Lexed, start: usize) -> bool {
    (start + 1..w.len()).any(|i| {
        let you = w[i].as_ref();
        if !matches!(you, "you" | "you're") {
            return false;
        }
        let before = w[i - 1].as_ref();
        if lx.is(i - 1, class::AUXILIARY) || matches!(before, "thank" | "to" | "let" | "for") {
            return false;
        }
        let at = (i + 1..w.len())
            .find(|&k| !lx.is(k, class::AGENT_ADVERB))
            .unwrap_or(w.len());
        let object = w.get(at + 1).map_or("", |x| x.as_ref());
        (you == "you're" || lx.is(at, class::IMPERATIVE | class::TASK | class::AGENT_VERB))
            && !matches!(object, "it" | "this" | "that" | "them" | "these" | "those")
    })
}

/// One line of a text, as the segments on it see it.
#[derive(Debug, Clone, Copy, Default)]
struct Line {
    /// Where it starts.
    start: usize,
    /// Where its line break is (or the text ends).
    end: usize,
    /// Shaped like machine output ([`output_line`]).
    output: bool,
    /// A quotation: it starts with `>`.
    quoted: bool,
}

/// Finds the lines of a text for positions that only move forward, each
/// line once.
struct Lines<'t> {
    text: &'t str,
    current: Option<Line>,
    /// Where the last search for a line break started, and the break it
    /// found (none: the text ends first).
    next_break: Option<(usize, Option<usize>)>,
}

impl<'t> Lines<'t> {
    fn new(text: &'t str) -> Self {
        Lines {
            text,
            current: None,
            next_break: None,
        }
    }

    /// The line holding byte `at` (a line break belongs to the line it
    /// ends).
    fn holding(&mut self, at: usize) -> Line {
        let at = at.min(self.text.len());
        if let Some(line) = self.current
            && line.start <= at
            && at <= line.end
        {
            return line;
        }
        let from = self.current.map_or(0, |l| l.end.min(at));
        let start = self.text[from..at]
            .rfind('\n')
            .map_or(from, |n| from + n + 1);
        let end = self.text[at..]
            .find('\n')
            .map_or(self.text.len(), |n| at + n);
        let body = self.text.get(start..end).unwrap_or("");
        let line = Line {
            start,
            end,
            output: output_line(body),
            quoted: body.trim_start().starts_with('>'),
        };
        self.current = Some(line);
        line
    }

    /// Whether a line break follows byte `at` with at most one visible
    /// character before it (the colon of "here's the log:").
    fn ends_after(&mut self, at: usize) -> bool {
        let at = at.min(self.text.len());
        let found = match self.next_break {
            Some((from, found)) if from <= at && found.is_none_or(|b| b >= at) => found,
            _ => {
                let found = self.text[at..].find('\n').map(|n| at + n);
                self.next_break = Some((at, found));
                found
            }
        };
        found.is_some_and(|b| self.text[at..b].trim().len() <= 1)
    }
}

/// Whether a segment opens as a code comment: "// …", "# DO NOT EDIT".
fn comment(segment: &str) -> bool {
    let s = segment.trim_start();
    s.starts_with("//") || shouted_comment(s)
}

/// Whether a line is shaped like machine output rather than something a
/// person typed: a log level ("ERROR", "error:", "npm ERR!"), a time stamp
/// at its start, a `file.ext:12` position, a stack frame, a compiler's
/// pointer (`-->`, `= note:`), a shell prompt, a code comment, code's
/// indentation, or more symbols and digits than letters.
fn output_line(line: &str) -> bool {
    let t = line.trim();
    if t.is_empty() {
        return false;
    }
    if OUTPUT_LINE_OPENERS.iter().any(|p| t.starts_with(p))
        || stamp_at_start(t)
        || t.starts_with(OUTPUT_SYMBOLS)
        || comment(t)
        || has_run(t, b'*', 3)
        || (t.starts_with('[') && t.ends_with(']'))
    {
        return true;
    }
    // Indented like code, not like a list.
    let indent = line.len() - line.trim_start().len();
    if (indent >= 4 || line.starts_with('\t'))
        && !t.starts_with(['-', '*', '•', '+'])
        && !numbered(t)
    {
        return true;
    }
    let (letters, visible) = if t.is_ascii() {
        let b = t.as_bytes();
        (
            count_bytes(b, |x| x.is_ascii_alphabetic()),
            count_bytes(b, |x| !matches!(x, b'\t'..=b'\r' | b' ')),
        )
    } else {
        t.chars().fold((0usize, 0usize), |(l, v), c| {
            (
                l + usize::from(c.is_alphabetic()),
                v + usize::from(!c.is_whitespace()),
            )
        })
    };
    if letters * 2 < visible {
        return true;
    }
    let mut tokens = t.split_whitespace();
    let first = tokens.next().unwrap_or("");
    let bare = first.trim_start_matches(['[', '(']);
    let level = |w: &str| {
        let name = w.trim_end_matches([':', '!', ']', ',']);
        LOG_LEVELS.iter().any(|l| name.eq_ignore_ascii_case(l))
            && (w.ends_with([':', '!', ']']) || name.chars().all(|c| c.is_ascii_uppercase()))
    };
    // A program's name or path before its message: "/usr/bin/ld: …".
    let path_label =
        first.ends_with(':') && first.starts_with(['/', '.', '~']) && first.contains('/');
    let class_label = ["Error:", "Exception:", "Warning:"]
        .iter()
        .any(|k| bare.len() > k.len() && bare.ends_with(k));
    if level(bare)
        || bare.starts_with("error[")
        || bare.starts_with("warning[")
        || class_label
        || path_label
    {
        return true;
    }
    // "COPY failed: …", "scheduler: error: …".
    if t.split_whitespace().take(3).skip(1).any(|w| {
        w.strip_suffix(':')
            .is_some_and(|name| LOG_LEVELS.iter().any(|l| name.eq_ignore_ascii_case(l)))
    }) {
        return true;
    }
    // A log level in capitals further on ("npm ERR!", "[12:01] ERROR"),
    // or a compiler's "file.ext:12" position.
    may_mark_output(t)
        && t.split_whitespace().any(|w| {
            let name = w.trim_matches(|c: char| !c.is_alphanumeric());
            (name.len() >= 3
                && name.chars().all(|c| c.is_ascii_uppercase())
                && LOG_LEVELS.iter().any(|l| name.eq_ignore_ascii_case(l)))
                || file_position(w)
        })
}

/// Whether `s` holds `n` consecutive bytes `b` (an ASCII character): a
/// substring search without a searcher to set up.
fn has_run(s: &str, b: u8, n: usize) -> bool {
    // Most lines hold no `b` at all, which a search for one byte tells
    // quickly.
    if !s.as_bytes().contains(&b) {
        return false;
    }
    let mut run = 0;
    for &x in s.as_bytes() {
        run = if x == b { run + 1 } else { 0 };
        if run == n {
            return true;
        }
    }
    false
}

/// Whether a line holds three capitals in a row or a colon or opening
/// bracket before a digit: what a log level in capitals or a
/// `file.ext:12` position needs. Most prose has neither, and its words
/// need not be looked at one by one.
fn may_mark_output(t: &str) -> bool {
    let b = t.as_bytes();
    // Fewer than three capitals and neither a colon nor a bracket: most
    // prose, told without following runs.
    if count_bytes(b, |x| x.is_ascii_uppercase()) < 3 && !b.contains(&b':') && !b.contains(&b'(') {
        return false;
    }
    let mut capitals = 0;
    b.iter().enumerate().any(|(i, &x)| {
        capitals = if x.is_ascii_uppercase() {
            capitals + 1
        } else {
            0
        };
        capitals >= 3 || (matches!(x, b':' | b'(') && b.get(i + 1).is_some_and(u8::is_ascii_digit))
    })
}

/// How many bytes of `bytes` satisfy `f`, counted in blocks small enough
/// for a one-byte count, which the compiler does many bytes at a time.
fn count_bytes(bytes: &[u8], f: impl Fn(u8) -> bool) -> usize {
    bytes
        .chunks(usize::from(u8::MAX))
        .map(|block| usize::from(block.iter().fold(0u8, |n, &x| n + u8::from(f(x)))))
        .sum()
}

/// A comment in capitals: "# DO NOT EDIT", "-- GENERATED".
fn shouted_comment(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('#').or_else(|| s.strip_prefix("--")) else {
        return false;
    };
    let word: String = rest
        .trim_start_matches(['#', ' '])
        .chars()
        .take_while(|c| c.is_alphabetic())
        .collect();
    word.chars().count() >= 2 && word.chars().all(char::is_uppercase)
}

/// Whether a line opens like an item of a numbered list ("1.", "2)").
fn numbered(t: &str) -> bool {
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && t[digits..].starts_with(['.', ')'])
}

/// A time stamp or date at the start of a line: digits, a separator
/// (`-`, `:`, `/`) and more digits, perhaps in brackets.
fn stamp_at_start(t: &str) -> bool {
    let b = t.trim_start_matches(['[', '(']).as_bytes();
    let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    (1..=4).contains(&digits)
        && b.get(digits)
            .is_some_and(|c| matches!(c, b'-' | b':' | b'/'))
        && b.get(digits + 1).is_some_and(u8::is_ascii_digit)
}

/// A source position in a word: a file name with an extension, then
/// `:12` or `(12,`: "src/app.ts:12:5", "Foo.java:181)", "client.ts(88,14)".
fn file_position(word: &str) -> bool {
    let word = word.trim_start_matches(|c: char| !c.is_alphanumeric() && c != '.' && c != '/');
    let Some(cut) = word.find([':', '(']) else {
        return false;
    };
    let (name, rest) = word.split_at(cut);
    let has_extension = name.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty()
            && (1..=5).contains(&ext.len())
            && ext.chars().all(|c| c.is_ascii_alphabetic())
    });
    has_extension
        && rest
            .get(1..)
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

/// Whether a line introduces what follows as something shown rather than
/// said: a word of showing, and a colon or a short line.
fn presents(lx: &Lexed, colon: bool) -> bool {
    let has = |class: u32| lx.classes.iter().any(|c| c & class != 0);
    (colon || lx.classes.len() <= 8) && has(class::SHOWING) && !has(class::RULE_NOUN)
}

/// Whether most of a text is output rather than prose: code fences, or
/// lines shaped like logs, stack frames, diffs and prompts. `code` is the
/// text's [`code_ranges`].
fn output_like(text: &str, code: &[(usize, usize)]) -> bool {
    let code: usize = code.iter().map(|(s, e)| e - s).sum();
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
        let indented = line.len() - t.len() >= 2;
        let starts_digit = t.starts_with(|c: char| c.is_ascii_digit());
        // The openers are lower case: only those whose first byte is
        // the line's, lower-cased, can match.
        let head = t.as_bytes().first().map(u8::to_ascii_lowercase);
        let opens_with = |p: &str| {
            p.as_bytes().first().copied() == head
                && t.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p))
        };
        if indented
            || starts_digit
            || t.starts_with(['$', '>', '[', '{', '}', '|', '+', '#', '/', '<', '@', '='])
            || t.ends_with([';', '{', '}', ')', ','])
            || has_run(t, b':', 2)
            || has_run(t, b'=', 2)
            || OUTPUT_LINE_STARTS.iter().any(|p| opens_with(p))
        {
            shaped += 1;
        }
    }
    lines >= 3 && shaped * 3 >= lines * 2
}

/// Steps named by a word: "now" (not "from now on"), "next" (not "next
/// time"), "then"; or a demonstrative before a noun that is not
/// the whole of the work ("this snippet", "that table", but not "this
/// repo").
fn points_at_step(w: &[Cow<'_, str>], breaks: &[usize]) -> bool {
    w.iter().enumerate().any(|(i, x)| {
        let before = i.checked_sub(1).and_then(|k| w.get(k)).map(|b| b.as_ref());
        let after = w.get(i + 1).map_or("", |a| a.as_ref());
        match x.as_ref() {
            "now" => !matches!(before, Some("from" | "till" | "until" | "til")),
            "next" => !matches!(after, "time" | "times" | "to"),
            "then" => true,
            // "use python3.11 for this, …", "try that".
            "this" | "that" if i + 1 == w.len() || breaks.binary_search(&(i + 1)).is_ok() => {
                i > 0 && !matches!(before, Some("like" | "as" | "keep" | "remember"))
            }
            "this" | "that" | "these" | "those" => {
                !after.is_empty()
                    && after != CODE
                    && !WHOLE_OF_THE_WORK.contains(&after)
                    && !NOT_A_NOUN_AFTER_THIS.contains(&after)
                    && !MODAL_AFTER_SUBJECT.contains(&after)
            }
            _ => false,
        }
    })
}

/// Whether word `i` is a past tense by its "-ed" (irregular ones are in
/// the lexicon).
fn regular_past(word: &str, lx: &Lexed, i: usize) -> bool {
    word.len() >= 5 && word.ends_with("ed") && !word.ends_with("eed") && !lx.is(i, class::NOT_PAST)
}

/// Whether a word is an irregular past tense the lexicon knows.
fn found_past(word: &str) -> bool {
    super::modal::IRREGULAR_PAST.contains(&word) || MORE_PAST.contains(&word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_scans_agree_with_reading_every_byte() {
        for len in [0, 1, 254, 255, 256, 600] {
            let text: String = (0..len)
                .map(|i| ["A", "b", " ", "*", ":", "7"][i % 6])
                .collect();
            let b = text.as_bytes();
            assert_eq!(
                count_bytes(b, |x| x.is_ascii_uppercase()),
                b.iter().filter(|x| x.is_ascii_uppercase()).count(),
                "{len}"
            );
        }
        assert!(has_run("a *** b", b'*', 3));
        assert!(!has_run("a ** * b", b'*', 3));
        assert!(!has_run("plain prose", b'*', 3));
        assert!(may_mark_output("npm ERR! code 1"));
        assert!(may_mark_output("at main.rs:12"));
        assert!(!may_mark_output("Keep It Short, please"));
        assert!(!may_mark_output("see (the docs) for: details"));
    }

    #[test]
    fn rules_stated_after_a_fact_or_with_a_reason() {
        // A directive opening a clause inside the sentence.
        for text in [
            "the staging db is shared with QA so leave it alone",
            "the vendored dir is generated, keep your edits out of it",
            "the legal team reads these, so no slang anywhere",
            "we ship on thursdays, never on fridays",
        ] {
            assert!(
                on(text).contains(&"clause_directive"),
                "{text}: {:?}",
                on(text)
            );
        }
        for text in [
            "leave the lockfile alone",
            "the import failed, never seen that before",
            "the db is shared with QA, so should we leave it alone?",
            "the build went green after the retry",
        ] {
            assert!(
                !on(text).contains(&"clause_directive"),
                "{text}: {:?}",
                on(text)
            );
        }
        // "leave … alone" forbids around its object.
        assert!(on("leave the generated client alone").contains(&"neg_modal"));
        assert!(on("the api keys stay out of git").contains(&"neg_modal"));
        assert!(!on("I left the old handler as it was").contains(&"neg_modal"));
        // A reason, or what happens when the rule is not kept.
        assert!(on("pin exact versions, ranges have bitten us").contains(&"justified"));
        assert!(on("cap retries at 3, they ban us otherwise").contains(&"justified"));
        assert!(!on("the retries all went through").contains(&"justified"));
        assert!(on("cutting the release branch is my job").contains(&"reserved"));
        assert!(on("leave the vendor calls to me").contains(&"reserved"));
        assert!(!on("send the vendor calls to me").contains(&"reserved"));
        assert!(on("the cloud bill is their call, not ours").contains(&"reserved"));
        assert!(on("ship the logs to s3 and nowhere else").contains(&"restrict"));
        assert!(on("fixtures belong under tests/data").contains(&"placement"));
        assert!(on("the backups go into cold storage").contains(&"placement"));
        assert!(!on("the backups go to cold storage").contains(&"placement"));
    }

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
        for ban in [
            "not a single print statement in library code",
            "0 compiler warnings, that's the bar",
            "Nothing that touches billing without a second review.",
        ] {
            assert!(on(ban).contains(&"noun_ban"), "{ban}");
        }
        assert!(on("0 1 1 2 3 5").iter().all(|f| *f != "noun_ban"));
        assert!(
            on("no that's the wrong file")
                .iter()
                .all(|f| *f != "noun_ban")
        );
        assert!(on("no luck with the second approach either").contains(&"observed"));
        assert!(on("nothing in the logs yet").contains(&"observed"));
        assert!(on("no tabs in any file").iter().all(|f| *f != "observed"));
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
    fn words_given_to_others_are_attributed() {
        assert!(on("the docs say you must never call init twice").contains(&"attributed"));
        assert!(on("my lead keeps saying no ORMs").contains(&"attributed"));
        assert!(on("our old agency used to say no stock photos").contains(&"attributed"));
        assert!(!on("as I said, never push to main").contains(&"attributed"));
        assert!(!on("if the user asks for a refund, escalate").contains(&"attributed"));
        // What a reporting lead-in introduces after its colon is shown.
        let segs = segments(
            "the old team wrote in the wiki: never touch the billing cron",
            false,
        );
        assert_eq!(segs.len(), 2);
        assert!(segs[1].features.on(Feature::Shown));
    }

    #[test]
    fn lines_of_output_are_seen() {
        for line in [
            "[2025-03-02 08:14:55,120] WARNING  scheduler: must not run twice",
            "src/app.ts:12:5  error  'var' must never be used  no-var",
            "npm ERR! peer dep missing: react@^18",
            "TypeError: Cannot read properties of null (reading 'id')",
            "    at CheckoutForm.submit (checkout.js:214:31)",
            "# DO NOT EDIT - generated",
        ] {
            assert!(on(line).contains(&"output_line"), "{line}");
            assert!(on(line).contains(&"pasted"), "{line}");
        }
        for line in [
            "1. never rebase shared branches",
            "- no force pushes",
            "Error messages: lowercase, no trailing period",
            "at most 4 parallel workers",
        ] {
            assert!(!on(line).contains(&"output_line"), "{line}");
        }
    }

    #[test]
    fn one_piece_of_work_is_told_from_a_way_of_working() {
        assert!(on("fix the typo on line 3").contains(&"specific_object"));
        assert!(on("be sure to restart the server").contains(&"specific_object"));
        let keep = on("keep the public API backwards compatible");
        assert!(keep.contains(&"maintaining") && !keep.contains(&"specific_object"));
        assert!(on("add tests for every bug you fix").contains(&"quantifier"));
        assert!(!on("convert all the PNGs to webp").contains(&"quantifier"));
        assert!(
            on("update the docs whenever you change a public function").contains(&"agent_clause")
        );
        assert!(!on("double-check the table before you send it").contains(&"agent_clause"));
        assert!(on("use pathlib, not os.path").contains(&"contrast"));
        assert!(
            on("draft an email announcing that we'll never support python 2")
                .contains(&"task_content")
        );
        assert!(!on("never mind the lint errors").contains(&"neg_modal"));
    }

    #[test]
    fn questions_ask_and_requests_request() {
        let asks = on("should we use redis instead?");
        assert!(asks.contains(&"open_question") && !asks.contains(&"conditional"));
        let requests = on("could you keep the answers short from now on?");
        assert!(!requests.contains(&"open_question") && requests.contains(&"polite"));
        assert!(on("if you touch billing, tag me on the PR").contains(&"conditional"));
        assert!(on("use python3.11 for this, the default one is broken").contains(&"step_local"));
        assert!(!on("in this repo we use pnpm").contains(&"step_local"));
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
    fn idioms_are_listed_by_their_heads() {
        assert!(
            IDIOMS
                .iter()
                .all(|(idiom, _)| IDIOM_HEADS.contains(&idiom[0]))
        );
        let segs = segments("never mind never mind: don't forget, never mind", false);
        assert!(segs.iter().all(|s| !s.features.on(Feature::NegModal)));
    }

    /// Many sentences on one line, many idioms, breaks and quotes in one
    /// sentence: each line and each word is read a bounded number of times.
    #[test]
    fn huge_texts_stay_linear() {
        use std::time::{Duration, Instant};
        let texts = [
            "a. ".repeat(60_000),
            "never mind ".repeat(30_000),
            "this, ".repeat(30_000),
            "\"said\" 'no' ".repeat(20_000),
            "error: x.rs:1: boom\n".repeat(10_000),
            "you always always said ".repeat(10_000),
        ];
        let start = Instant::now();
        for t in &texts {
            let _ = segments(t, false);
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 256,
            ..proptest::prelude::ProptestConfig::default()
        })]

        #[test]
        fn segments_never_panic_and_stay_on_char_boundaries(
            t in "[`'\"a-z ;.,:!?\n_/>#*\\[\\]()-]{0,120}|\\PC{0,60}"
        ) {
            for s in segments(&t, false) {
                proptest::prop_assert!(s.range.0 <= s.range.1 && s.range.1 <= t.len());
                proptest::prop_assert!(t.is_char_boundary(s.range.0));
                proptest::prop_assert!(t.is_char_boundary(s.range.1));
            }
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
            "'",
            "“",
            "”x",
            "a: b: c: d: e: f: g: h: i",
            "x - y — z",
            "never mind",
            "i need to",
            "> said: x",
            "    # DO",
            "a.b.",
            "\n\n;\n",
        ] {
            let _ = segments(text, true);
        }
    }
}
