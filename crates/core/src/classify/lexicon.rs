//! The closed word lists the features are made of: modals, scope and time
//! phrases, question openers, report verbs, a lexicon of verbs that open
//! instructions, and a few directive words of other languages. Nothing
//! here names a topic.

/// Verbs that name one piece of work when they open a sentence: a task
/// ("fix the flaky test"), not a way of working, unless something else in
/// the sentence says it holds beyond the task. Sorted.
pub(super) const TASK_VERBS: &[&str] = &[
    "add",
    "benchmark",
    "build",
    "bump",
    "calculate",
    "chart",
    "check",
    "compare",
    "compute",
    "convert",
    "create",
    "debug",
    "delete",
    "deploy",
    "double",
    "draft",
    "draw",
    "explain",
    "find",
    "fix",
    "generate",
    "go",
    "hook",
    "implement",
    "install",
    "investigate",
    "look",
    "make",
    "merge",
    "migrate",
    "move",
    "open",
    "plot",
    "port",
    "print",
    "profile",
    "refactor",
    "remove",
    "rename",
    "rerun",
    "restart",
    "retry",
    "revert",
    "review",
    "rewrite",
    "run",
    "set",
    "show",
    "split",
    "summarise",
    "summarize",
    "test",
    "translate",
    "try",
    "update",
    "upgrade",
    "wire",
    "write",
];

/// Words of a line that presents what follows as shown rather than said
/// ("this is what I get:", "the linter says").
pub(super) const SHOWING_WORDS: &[&str] = &[
    "compiler",
    "console",
    "error",
    "errors",
    "get",
    "getting",
    "got",
    "here's",
    "heres",
    "linter",
    "log",
    "logs",
    "output",
    "printed",
    "prints",
    "returned",
    "returns",
    "said",
    "say",
    "says",
    "showed",
    "shows",
    "stacktrace",
    "trace",
    "traceback",
    "warning",
    "warnings",
    "reads",
    "complains",
    "gives",
    "spat",
    "copied",
    "pasted",
    "blew",
];

/// Words skipped before the first meaningful one.
pub(super) const LEAD_FILLERS: &[&str] = &[
    "please",
    "pls",
    "plz",
    "kindly",
    "and",
    "also",
    "so",
    "ok",
    "okay",
    "oh",
    "hey",
    "hi",
    "just",
    "btw",
    "fyi",
    "reminder",
    "important",
    "note",
    "nb",
    "ps",
    "rule",
    "but",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
];

pub(super) const NEG_MODAL_PHRASES: &[&str] = &[
    "do not",
    "must not",
    "should not",
    "may not",
    "can not",
    "shall not",
    "not allowed",
    "not permitted",
    "no longer",
    "refrain from",
    "under no circumstances",
    "off limits",
    "keep away from",
    "stay away from",
    "keep out of",
    "stay out of",
    "stays out of",
    "steer clear of",
    "stay clear of",
    "hands off",
    "not ok",
    "not okay",
    "not acceptable",
    "a no-go",
    "a no go",
    "not to be",
    "hard no",
    "non-starter",
    "nonstarter",
    "non starter",
    "not an option",
    "out of the question",
    "not ever",
    "rather you didn't",
    "rather you did not",
    "if you didn't",
    "if you did not",
    "if you wouldn't",
    "if you would not",
];

pub(super) const NEG_MODAL_WORDS: &[&str] = &[
    "never",
    "don't",
    "dont",
    "mustn't",
    "shouldn't",
    "cannot",
    "can't",
    "shan't",
    "forbidden",
    "prohibited",
    "banned",
    "disallowed",
    "forbid",
    "avoid",
    "won't",
    "nope",
];

pub(super) const REQ_MODAL_PHRASES: &[&str] = &[
    // An approval the writer keeps for themself.
    "my ok",
    "my okay",
    "my approval",
    "my sign-off",
    "my sign off",
    "my go-ahead",
    "my go ahead",
    "my blessing",
    "check with me",
    "ask me first",
    "ask me before",
    "ping me first",
    "ping me before",
    "run it by me",
    "goes through me",
    "go through me",
    "make sure",
    "be sure",
    "need to",
    "needs to",
    "have to",
    "has to",
    "remember to",
    "don't forget",
    "do not forget",
    "got to",
    "is a must",
];

/// An action kept by the writer or by someone named, not the agent:
/// "tagging releases is my job", "leave the DNS to me", "that's their
/// call".
pub(super) const RESERVATIONS: &[&str] = &[
    "my job",
    "my call",
    "my decision",
    "my responsibility",
    "mine to",
    // "leave … to me" is found around its object (features.rs).
    "i'll handle",
    "i handle",
    "i do that myself",
    "i'll do that myself",
    "i'll do it myself",
    "their call",
    "their job",
    "their decision",
    "not your call",
    "not your job",
    "not yours to",
];

/// Reasons given for keeping to something, or what happens when it is
/// not kept: a rule's justification.
pub(super) const JUSTIFICATIONS: &[&str] = &[
    "otherwise",
    "or else",
    "gets rejected",
    "get rejected",
    "will be rejected",
    "won't pass",
    "wont pass",
    "will not pass",
    "fails review",
    "fail review",
    "has bitten us",
    "have bitten us",
    "bit us",
    "burned us",
    "burnt us",
    "ban us",
    "gets wiped",
    "get wiped",
    "gets overwritten",
    "get overwritten",
    "for compliance",
    "compliance reasons",
    "legal reasons",
    "security reasons",
];

/// A demand framed as what matters: "it's essential that …".
pub(super) const DEMAND_FRAMES: &[&str] = &[
    "important that",
    "essential that",
    "crucial that",
    "critical that",
    "vital that",
    "imperative that",
];

pub(super) const REQ_MODAL_WORDS: &[&str] = &[
    "must",
    "always",
    "ensure",
    "required",
    "require",
    "requires",
    "mandatory",
    "shall",
    "gotta",
    "needs",
];

pub(super) const RESTRICT_PHRASES: &[&str] = &[
    "at most",
    "at least",
    "no more than",
    "no less than",
    "no fewer than",
    "limited to",
    "restricted to",
    "stick to",
    "stick with",
    "nothing but",
    "nothing except",
    "nothing outside",
    "nothing other than",
    "nothing else",
    "nowhere else",
    "no one else",
    "nobody else",
    "no one but",
    "nobody but",
    "anywhere but",
    "except for",
    "up to",
    "or less",
    "or fewer",
    "or under",
];

pub(super) const RESTRICT_WORDS: &[&str] =
    &["only", "exclusively", "solely", "max", "maximum", "limit"];

/// Verbs that open instructions, sorted (binary search).
pub(super) const IMPERATIVE_VERBS: &[&str] = &[
    "abort",
    "add",
    "address",
    "align",
    "answer",
    "append",
    "apply",
    "archive",
    "ask",
    "assume",
    "attach",
    "avoid",
    "back",
    "be",
    "begin",
    "bold",
    "break",
    "bump",
    "call",
    "cap",
    "capitalise",
    "capitalize",
    "cc",
    "change",
    "check",
    "cite",
    "clean",
    "close",
    "comment",
    "commit",
    "compress",
    "confirm",
    "consult",
    "convert",
    "copy",
    "create",
    "cut",
    "decline",
    "default",
    "defer",
    "delete",
    "deploy",
    "describe",
    "disable",
    "document",
    "double",
    "drop",
    "edit",
    "email",
    "emit",
    "enable",
    "encrypt",
    "end",
    "escalate",
    "escape",
    "exclude",
    "explain",
    "export",
    "fail",
    "favor",
    "favour",
    "fetch",
    "file",
    "fill",
    "flag",
    "follow",
    "force",
    "format",
    "gate",
    "give",
    "go",
    "group",
    "handle",
    "hide",
    "highlight",
    "hold",
    "ignore",
    "import",
    "include",
    "indent",
    "inform",
    "insert",
    "install",
    "keep",
    "label",
    "lead",
    "leave",
    "let",
    "limit",
    "link",
    "list",
    "lock",
    "log",
    "look",
    "lowercase",
    "maintain",
    "make",
    "mark",
    "mask",
    "match",
    "measure",
    "mention",
    "merge",
    "migrate",
    "mirror",
    "move",
    "name",
    "notify",
    "number",
    "offer",
    "omit",
    "open",
    "order",
    "output",
    "pad",
    "pass",
    "paste",
    "pause",
    "pick",
    "pin",
    "ping",
    "place",
    "post",
    "prefer",
    "prefix",
    "prepend",
    "preserve",
    "print",
    "prioritise",
    "prioritize",
    "produce",
    "prompt",
    "protect",
    "push",
    "put",
    "quote",
    "raise",
    "read",
    "rebase",
    "recommend",
    "record",
    "redact",
    "reduce",
    "refer",
    "refuse",
    "reject",
    "remember",
    "remove",
    "rename",
    "reply",
    "report",
    "request",
    "require",
    "reset",
    "resolve",
    "respect",
    "respond",
    "restrict",
    "retry",
    "return",
    "reuse",
    "review",
    "round",
    "route",
    "run",
    "save",
    "say",
    "scope",
    "send",
    "separate",
    "set",
    "show",
    "sign",
    "skip",
    "sort",
    "spell",
    "split",
    "squash",
    "stage",
    "start",
    "state",
    "stay",
    "stick",
    "stop",
    "store",
    "strip",
    "structure",
    "submit",
    "suffix",
    "suggest",
    "summarise",
    "summarize",
    "switch",
    "tag",
    "take",
    "talk",
    "target",
    "tell",
    "test",
    "throttle",
    "touch",
    "translate",
    "treat",
    "trim",
    "try",
    "turn",
    "type",
    "uppercase",
    "use",
    "validate",
    "verify",
    "wait",
    "warn",
    "wrap",
    "write",
];

/// Words after which "no X" still opens a ban inside a sentence.
pub(super) const BAN_LEADERS: &[&str] = &[
    "and",
    "absolutely",
    "strictly",
    "also",
    "but",
    "so",
    "plus",
    "just",
    "definitely",
    "really",
    "please",
    "pls",
    "with",
];

pub(super) const BAN_HEADS: &[&str] = &["no", "zero", "nothing", "none", "without", "nix", "nada"];

/// After "no": an interjection or an idiom, not a ban.
pub(super) const BAN_NOT_FOLLOWED_BY: &[&str] = &[
    "problem", "worries", "idea", "clue", "way", "i", "you", "we", "it", "that's", "that",
    "thanks", "luck", "matter", "one", "doubt", "rush", "need", "biggie", "longer", "sir", "was",
    "is", "were", "are", "has", "had", "happened", "changed", "else", "works", "worked", "left",
];

/// Labels of log lines and headers, which say nothing about behaviour.
pub(super) const LOG_LABELS: &[&str] = &[
    "error",
    "warning",
    "warn",
    "info",
    "debug",
    "trace",
    "fatal",
    "panic",
    "exception",
    "traceback",
    "caused",
    "by",
    "at",
    "http",
    "https",
    "file",
    "line",
    "status",
    "output",
    "stdout",
    "stderr",
    "result",
    "response",
    "request",
    "q",
    "a",
    "re",
    "from",
    "to",
    "subject",
    "date",
    "edit",
    "update",
    "question",
    "answer",
    "user",
    "assistant",
    "tool",
    "step",
    "test",
    "failed",
    "failure",
    "expected",
    "actual",
    "got",
    "note",
    "hint",
    "help",
];

pub(super) const SUBJECT_PRONOUNS: &[&str] =
    &["i", "he", "she", "they", "it", "we", "this", "that"];

pub(super) const FORMAT_WORDS: &[&str] = &[
    "snake_case",
    "camelcase",
    "kebab",
    "pascalcase",
    "lowercase",
    "uppercase",
    "lower",
    "upper",
    "caps",
    "capitalized",
    "capitalised",
    "imperative",
    "iso",
    "iso8601",
    "utc",
    "rfc",
    "yyyy",
    "mm",
    "dd",
    "format",
    "formatted",
    "formatting",
    "style",
    "case",
    "indent",
    "indentation",
    "digits",
    "spelled",
    "numerals",
    "tabs",
    "spaces",
    "tone",
    "voice",
    "naming",
    "prefix",
    "prefixed",
    "suffix",
    "template",
    "pattern",
    "length",
    "width",
    "chars",
    "characters",
    "words",
    "lines",
    "sentence",
    "title",
    "bullet",
    "bullets",
    "markdown",
    "json",
    "yaml",
    "csv",
    "units",
    "decimal",
    "decimals",
    "currency",
    "trailing",
    "semicolons",
    "quotes",
    "header",
    "headers",
    "signature",
    "convention",
    "prefixes",
];

pub(super) const UNITS: &[&str] = &[
    "chars",
    "characters",
    "char",
    "words",
    "lines",
    "line",
    "px",
    "spaces",
    "sentences",
    "paragraphs",
    "items",
    "bullets",
    "columns",
    "cols",
    "digits",
    "decimals",
    "dp",
    "kb",
    "mb",
    "ms",
    "seconds",
    "minutes",
    "retries",
    "tries",
    "files",
    "steps",
    "emojis",
];

pub(super) const SCOPE_PHRASES: &[&str] = &[
    "from now on",
    "from here on",
    "from here",
    "going forward",
    "moving forward",
    "for the rest",
    "for the remainder",
    "rest of the",
    "rest of this",
    "all future",
    "every time",
    "each time",
    "any time",
    "at all times",
    "by default",
    "no matter",
    "no exceptions",
    "even when",
    "even if",
    "even for",
    "even in",
    "not even",
    "whole project",
    "whole codebase",
    "whole repo",
    "entire project",
    "entire codebase",
    "in general",
    "as a rule",
    "in this repo",
    "in this codebase",
    "in this project",
    "in this session",
    "in this conversation",
    "in this chat",
    "in this doc",
    "in this document",
    "in this thread",
    "in this team",
    "in our",
    "for every",
    "for everything",
    "for anything",
    "all new",
    "any new",
    "until i say",
    "until further notice",
    "unless i say",
    "unless i tell",
    "unless told",
    "from today",
    "from this point",
    "in future",
    "in the future",
];

pub(super) const SCOPE_WORDS: &[&str] = &[
    "henceforth",
    "everywhere",
    "anywhere",
    "throughout",
    "whenever",
    "anytime",
    "regardless",
    "ever",
    "forever",
    "globally",
    "consistently",
    "permanently",
];

/// Quantifiers over things: wider than one object, but common in tasks
/// and holds too.
pub(super) const QUANTIFIERS: &[&str] = &["any", "all", "every", "each"];

/// Words after a quantifier that make it count one set of things ("all
/// the PNGs", "each of these").
pub(super) const DEFINITE_AFTER_QUANTIFIER: &[&str] = &[
    "the", "of", "these", "those", "this", "that", "my", "our", "them",
];

pub(super) const PREFERENCE_PHRASES: &[&str] = &[
    "i'd rather",
    "i would rather",
    "rather than",
    "i'd like",
    "i would like",
    "i want",
    "we want",
    "we use",
    "we don't",
    "we do not",
    "we never",
    "we always",
    "we only",
    "i prefer",
    "we prefer",
    "i like",
    "house style",
    "our convention",
    "the convention",
    "the rule",
    "our rule",
    "my rule",
    "our policy",
    "is preferred",
    "are preferred",
    "i'd prefer",
    "i expect",
    "we expect",
    "default to",
];

pub(super) const PREFERENCE_WORDS: &[&str] =
    &["prefer", "preferred", "preference", "convention", "policy"];

pub(super) const POLITE_PHRASES: &[&str] = &[
    "could you",
    "would you",
    "would you mind",
    "i'd appreciate",
    "appreciate it",
    "it'd be great",
    "it would be great",
    "it would help",
    "it'd help",
    "i'd love",
    "do me a favor",
    "do me a favour",
    "if you could",
    "if you can",
    "if possible",
    "be nice if",
    "be great if",
    "be good if",
];

pub(super) const POLITE_WORDS: &[&str] = &["please", "pls", "plz", "kindly"];

pub(super) const CONDITION_OPENERS: &[&str] = &[
    "if", "when", "whenever", "unless", "once", "before", "after", "anytime", "should", "where",
    "wherever", "while",
];

pub(super) const CONDITION_ACTIONS: &[&str] = &[
    "stop", "ask", "ping", "tell", "check", "notify", "abort", "revert", "roll", "wait", "flag",
    "escalate", "confirm", "don't", "dont", "never", "always", "use", "run", "skip", "bail",
    "halt", "message", "email", "page", "alert", "mention", "leave", "rerun", "retry", "fall",
    "default", "prefer", "assume", "add", "keep", "mark", "report", "open", "file", "post", "do",
    "must", "should", "just", "then",
];

pub(super) const CORRECTION_PHRASES: &[&str] = &[
    "no more",
    "instead of",
    "rather than",
    "i told you",
    "i said",
    "i meant",
    "you keep",
    "you still",
    "how many times",
    "that's wrong",
    "thats wrong",
    "that is wrong",
    "not what i",
    "wrong again",
    "stop it",
    "cut it out",
    "enough with",
    "quit it",
    "knock it off",
    "scratch that",
    "not x but",
    "instead",
    "correction",
    "actually",
];

/// Verbs of saying, writing and wanting: words given to someone, when
/// the subject before them is not the writer ([`WRITER`]).
pub(super) const SAYING_VERBS: &[&str] = &[
    "say",
    "says",
    "said",
    "saying",
    "told",
    "tells",
    "telling",
    "wrote",
    "mentioned",
    "mentions",
    "claims",
    "claimed",
    "insists",
    "insisted",
    "swears",
    "swore",
    "states",
    "stated",
    "warned",
    "warns",
    "suggested",
    "suggests",
    "recommended",
    "recommends",
    "reckons",
    "wants",
    "wanted",
    "asked",
    "asks",
    "reads",
];

/// Words before a verb of saying that keep it the writer's own ("as I
/// said", "until I say") or make it no report ("needless to say").
pub(super) const WRITER: &[&str] = &[
    "i", "i've", "i'd", "i'll", "i'm", "we", "we've", "you", "you've", "you'd", "to",
];

/// Words that attribute what follows to someone else.
pub(super) const ATTRIBUTIONS: &[&str] = &[
    "apparently",
    "supposedly",
    "reportedly",
    "allegedly",
    "rumour",
    "rumor",
    "fwiw",
];

/// Words after an imperative's verb that do not yet name its object.
pub(super) const VERB_PARTICLES: &[&str] = &[
    "up", "out", "on", "off", "back", "over", "down", "through", "ahead", "and", "just", "quickly",
    "also", "again", "in", "into", "at", "to", "with", "me", "us",
];

/// Determiners and pronouns that name one particular thing.
pub(super) const SPECIFIC_DETERMINERS: &[&str] = &[
    "the", "this", "that", "these", "those", "it", "them", "my", "his", "her", "a", "an", "one",
];

/// Verbs that keep a state rather than do one piece of work: "keep the
/// API stable" holds however definite its object.
pub(super) const MAINTAINING_VERBS: &[&str] = &[
    "keep", "leave", "stay", "maintain", "preserve", "respect", "follow", "treat", "stick",
    "retain", "honor", "honour",
];

/// Words of a log line's level.
pub(super) const LOG_LEVELS: &[&str] = &[
    "error",
    "err",
    "warn",
    "warning",
    "info",
    "debug",
    "trace",
    "fatal",
    "critical",
    "panic",
    "exception",
    "fail",
    "failed",
    "failure",
    "severe",
    "notice",
    "hint",
];

/// How lines of machine output open.
pub(super) const OUTPUT_LINE_OPENERS: &[&str] = &[
    "$ ",
    "-->",
    "= note",
    "= help",
    "File \"",
    "Traceback",
    "Caused by",
    "//",
    "/*",
    "<!--",
    "\u{2502}",
    "| ",
    "E  ",
    ">>>",
    "+++",
    "---",
    "@@",
    "thread '",
];

/// Idioms read as one word: what they mean is not what their words say.
pub(super) const IDIOMS: &[(&[&str], &str)] = &[
    (&["never", "mind"], "nevermind"),
    (&["don't", "forget"], "remember"),
    (&["dont", "forget"], "remember"),
    (&["do", "not", "forget"], "remember"),
    (&["keep", "going"], "continue"),
    // The writer's own need binds nobody else.
    (&["i", "need", "to"], "i_need_to"),
    (&["i", "have", "to"], "i_have_to"),
];

/// The first words of [`IDIOMS`].
pub(super) const IDIOM_HEADS: &[&str] = &["never", "don't", "dont", "do", "keep", "i"];

/// Verbs of the writer's own state or habit: "I only have read access",
/// "I always run the tests myself".
pub(super) const WRITER_STATES: &[&str] = &[
    "have", "know", "see", "get", "use", "work", "run", "forget", "mix", "need", "do",
];

/// Words after a task's object that introduce what the product says.
pub(super) const TASK_CONTENT: &[&str] = &[
    "about",
    "announcing",
    "saying",
    "explaining",
    "describing",
    "stating",
    "telling",
    "asking",
    "warning",
    "reminding",
];

/// Words before an "-ed" word that make it an adjective ("the generated
/// files", "no hardcoded urls").
pub(super) const BEFORE_ADJECTIVES: &[&str] = &[
    "the", "a", "an", "no", "any", "all", "every", "each", "some", "on", "in", "of", "for", "with",
    "to", "from", "into", "onto", "by", "at", "your", "my", "our", "their", "its", "this", "that",
    "these", "those", "non", "un", "as", "be", "been", "being", "get", "stay", "remain", "keep",
];

/// Adverbs between "you" and its verb.
pub(super) const AGENT_ADVERBS: &[&str] = &[
    "just", "ever", "always", "never", "only", "also", "still", "actually", "really", "then", "do",
    "don't", "dont",
];

/// Verbs of what an agent does beyond the imperative lexicon.
pub(super) const AGENT_VERBS: &[&str] = &[
    "are",
    "aren't",
    "need",
    "want",
    "get",
    "see",
    "modify",
    "touch",
    "ship",
    "call",
    "introduce",
    "generate",
    "produce",
    "answer",
    "suggest",
    "propose",
    "reply",
    "talk",
    "mention",
    "quote",
];

/// Symbols that open lines of tool output (test marks, box drawing).
pub(super) const OUTPUT_SYMBOLS: &[char] = &[
    '✖', '✔', '✓', '✗', '✘', '❌', '⚠', '●', '○', '►', '▶', '│', '├', '└', '╷', '╵', '━', '─',
];

/// Verbs among [`SHOWING_WORDS`]: a lead-in with one of them presents
/// what follows its colon ("got this in the console: …").
pub(super) const SHOWING_VERBS: &[&str] = &[
    "get",
    "getting",
    "got",
    "here's",
    "heres",
    "printed",
    "prints",
    "returned",
    "returns",
    "said",
    "say",
    "says",
    "showed",
    "shows",
    "reads",
    "complains",
    "gives",
    "spat",
    "copied",
    "pasted",
    "blew",
];

/// Nouns of rules: a line that presents rules presents something said.
pub(super) const RULE_NOUNS: &[&str] = &[
    "rule",
    "rules",
    "convention",
    "conventions",
    "guideline",
    "guidelines",
    "policy",
    "policies",
    "requirements",
    "instructions",
    "standards",
    "constraints",
];

pub(super) const SECOND_PERSON_RULES: &[&str] = &[
    "you will",
    "you'll",
    "you are to",
    "you're to",
    "you're not to",
    "you are not to",
    "you should",
    "you shouldn't",
    "you may",
    "you can't",
    "you cannot",
    "you need",
    "you have to",
    "you must",
    "you're not allowed",
    "you are not allowed",
    "you won't",
    "you never",
    "you always",
    "you only",
];

pub(super) const PASSIVE_RULES: &[&str] = &[
    "is not allowed",
    "are not allowed",
    "isn't allowed",
    "aren't allowed",
    "must be",
    "should be",
    "has to be",
    "have to be",
    "needs to be",
    "need to be",
    "is required",
    "are required",
    "is forbidden",
    "are forbidden",
    "is banned",
    "are banned",
    "is prohibited",
    "are prohibited",
    "is off",
    "are off",
    "is a no",
    "not ok",
    "not okay",
    "unacceptable",
    "is mandatory",
    "are mandatory",
    "must stay",
    "must remain",
    "should stay",
    "should remain",
    "stays",
    "remain",
    "goes through",
    "go through",
];

pub(super) const WH_WORDS: &[&str] = &[
    "what", "why", "how", "where", "which", "who", "whose", "whom", "what's", "why's", "how's",
    "where's", "who's", "wat", "wdyt", "thoughts", "any",
];

pub(super) const AUXILIARIES: &[&str] = &[
    "is",
    "are",
    "was",
    "were",
    "do",
    "does",
    "did",
    "can",
    "could",
    "should",
    "would",
    "will",
    "have",
    "has",
    "shall",
    "may",
    "might",
    "isn't",
    "aren't",
    "doesn't",
    "didn't",
    "won't",
    "wouldn't",
    "shouldn't",
    "couldn't",
    "am",
];

pub(super) const QUESTION_SUBJECTS: &[&str] = &[
    "i", "we", "you", "it", "this", "that", "there", "they", "he", "she", "the", "a", "an", "my",
    "our", "your", "these", "those", "anyone", "somebody", "someone", "any",
];

pub(super) const TEMPORAL_PHRASES: &[&str] = &[
    "for now",
    "right now",
    "at the moment",
    "for the moment",
    "this time",
    "just this once",
    "this once",
    "not now",
    "hold on",
    "hold off",
    "for a sec",
    "for a second",
    "for a minute",
    "in a minute",
    "in a bit",
    "for a bit",
    "a sec",
    "a moment",
    "let me",
    "until i",
    "until we",
    "until you",
    "until after",
    "till i",
    "til i",
    "before i",
    "before we",
    "while i",
    "i'll tell you",
    "i'll let you know",
    "for today",
    "this week",
    "this morning",
    "this afternoon",
    "while the",
    "while it",
    "while we",
    "while i'm",
    "while we're",
    "not yet",
];

pub(super) const TEMPORAL_WORDS: &[&str] = &[
    "yet",
    "wait",
    "pause",
    "paused",
    "today",
    "tonight",
    "temporarily",
    "meanwhile",
    "until",
    "till",
    "til",
    "tomorrow",
    "later",
    "soon",
    "momentarily",
];

pub(super) const STEP_PHRASES: &[&str] = &[
    "this test",
    "this one",
    "so far",
    "what you have",
    "when you're done",
    "once you're done",
    "this file",
    "this function",
    "this pr",
    "this bug",
    "this error",
    "this line",
    "this step",
    "this branch",
    "this change",
    "this fix",
    "this commit",
    "the test",
    "the failing",
    "it again",
    "run it",
    "try it",
    "try again",
    "real quick",
    "that one",
    "the last",
    "the previous",
];

/// Step words beyond those [`super::features`] reads in context ("now",
/// "next", "then", "again", "this …").
pub(super) const STEP_WORDS: &[&str] = &["quickly", "currently"];

/// Nouns after "this" that name the whole of the work, not one step of
/// it: "in this repo" is a scope.
pub(super) const WHOLE_OF_THE_WORK: &[&str] = &[
    "repo",
    "repository",
    "project",
    "codebase",
    "monorepo",
    "session",
    "conversation",
    "chat",
    "thread",
    "team",
    "company",
    "org",
    "organisation",
    "organization",
    "workspace",
    "client",
    "customer",
    "product",
    "app",
    "whole",
    "entire",
    "document",
    "doc",
    "book",
    "site",
    "way",
    "kind",
    "sort",
];

/// Words after "this" or "that" that are not a noun it points with.
pub(super) const NOT_A_NOUN_AFTER_THIS: &[&str] = &[
    "is", "was", "are", "were", "will", "would", "could", "can", "does", "did", "do", "means",
    "one", "and", "or", "but", "for", "in", "on", "to", "of", "with", "it", "i", "you", "we",
    "they", "the", "a", "an", "seems", "looks", "happens", "way", "said", "says",
];

/// Phrases that leave a choice to the reader: "feel free to …", "…
/// however you like", "I don't mind …". "You can" is read apart, before
/// a verb of acting (`features::leaves_choice`).
pub(super) const PERMISSIONS: &[&str] = &[
    "feel free",
    "you're free to",
    "you are free to",
    "go ahead and",
    // With their subject: things also "run fine with python 3".
    "i'm fine with",
    "im fine with",
    "i am fine with",
    "we're fine with",
    "i'm ok with",
    "im ok with",
    "i'm okay with",
    "fine by me",
    "happy for you",
    "don't mind",
    "dont mind",
    "do not mind",
    "you're welcome to",
    "you are welcome to",
    "however you",
    "whatever you",
    "whichever you",
    "wherever you",
    "anything you",
    "any way you",
    "as needed",
    "as you see fit",
    "as you like",
    "as you wish",
    "if you want",
    "if you like",
    "if it helps",
    "up to you",
    "your call",
    "carte blanche",
];

/// What takes something back out of a choice left: "… but not the
/// footer", "… except the lockfile", "… as long as it still builds".
pub(super) const EXCEPTIONS: &[&str] = &[
    "but not",
    "just not",
    "only not",
    "though not",
    "except",
    "excepting",
    "apart from",
    "aside from",
    "other than",
    "as long as",
    "so long as",
    "provided that",
    "providing that",
];

/// Words that say a thing is to stay as it is: "… but the footer
/// stays", "the wire format is frozen".
pub(super) const INVARIANTS: &[&str] = &[
    "stay",
    "stays",
    "remain",
    "remains",
    "untouched",
    "unchanged",
    "intact",
    "frozen",
    "untouchable",
    "off limits",
    "off-limits",
    "as is",
    "the same",
    "alone",
];

pub(super) const REPORT_WORDS: &[&str] = &[
    "said",
    "says",
    "told",
    "tells",
    "mentioned",
    "mentions",
    "wrote",
    "asked",
    "asks",
    "according",
    "claims",
    "claimed",
    "quote",
    "quoted",
    "suggested",
    "suggests",
    "recommended",
    "recommends",
    "warned",
    "warns",
    "insisted",
    "insists",
    "complained",
    "wants",
    "wanted",
];

pub(super) const REPORT_PHRASES: &[&str] = &["per the", "according to"];

/// Words of someone telling what they saw: "no luck *either*", "nothing
/// in the logs *yet*", "same error", "*weird*".
pub(super) const OBSERVED_WORDS: &[&str] = &[
    "yet",
    "either",
    "apparently",
    "anymore",
    "same",
    "weird",
    "odd",
    "strange",
    "nice",
    "huh",
    "hmm",
    "ugh",
    "sadly",
    "unfortunately",
    "somehow",
];

pub(super) const OBSERVED_PHRASES: &[&str] = &[
    "this time",
    "so far",
    "as before",
    "like before",
    "any more",
    "for some reason",
];

pub(super) const STATEMENT_SUBJECTS: &[&str] = &[
    "i", "we", "it", "this", "that", "there", "they", "he", "she", "my", "our", "the", "its",
    "it's", "i'm", "we're", "there's", "that's", "they're", "he's", "she's", "you", "these",
    "those",
];

/// Words after a subject that make a rule of a statement.
pub(super) const MODAL_AFTER_SUBJECT: &[&str] = &[
    "must",
    "should",
    "shall",
    "need",
    "needs",
    "have",
    "has",
    "may",
    "can't",
    "cannot",
    "mustn't",
    "shouldn't",
    "never",
    "always",
    "only",
];

pub(super) const EPISTEMIC_PHRASES: &[&str] = &[
    "i think",
    "i guess",
    "i wonder",
    "i believe",
    "i suspect",
    "i feel",
    "i assume",
    "i hope",
    "i don't know",
    "i dont know",
    "not sure",
    "looks like",
    "must have",
    "must've",
    "should have",
    "should've",
    "could be",
    "might be",
    "must be the",
    "no idea",
    "i bet",
    "kind of",
    "sort of",
];

/// "Should" that expects rather than demands: "that should be fixed
/// now", "the next run should be quicker", "it should only take a
/// second".
pub(super) const EXPECTATIONS: &[&str] = &[
    "should now",
    "should work now",
    "should pass now",
    "should be fine",
    "should be good",
    "should be ok",
    "should be okay",
    "should be ready",
    "should be done",
    "should be fixed",
    "should be back",
    "should be live",
    "should be working",
    "should be gone",
    "should be resolved",
    "should be sorted",
    "should be faster",
    "should be quicker",
    "should be better",
    "should be easier",
    "should be smaller",
    "should be cheaper",
    "should be a lot",
    "should be much",
    "should be way",
    "should do it",
    "should do the trick",
    "should help",
    "should only take",
    "should take about",
    "should take around",
    "should take a",
    "should land",
    "should arrive",
    "should kick in",
    "should show up",
];

pub(super) const EPISTEMIC_WORDS: &[&str] = &[
    "maybe",
    "probably",
    "perhaps",
    "apparently",
    "seems",
    "seem",
    "seemed",
    "weird",
    "strange",
    "odd",
    "lol",
    "lmao",
    "hmm",
    "hm",
    "idk",
    "guess",
    "wonder",
    "likely",
    "possibly",
];

/// Past tenses beyond those the modal rules know ([`super::modal`]).
pub(super) const MORE_PAST: &[&str] = &[
    "wrote", "said", "told", "took", "made", "gave", "kept", "sent", "built", "spent", "led",
    "meant", "stood",
];

/// Words ending in "-ed" that are not past tenses in instructions.
pub(super) const NOT_PAST: &[&str] = &[
    "needed",
    "required",
    "allowed",
    "permitted",
    "prohibited",
    "forbidden",
    "banned",
    "disallowed",
    "preferred",
    "signed",
    "prefixed",
    "formatted",
    "capitalized",
    "capitalised",
    "quoted",
    "indented",
    "nested",
    "named",
    "based",
    "limited",
    "restricted",
    "detailed",
    "expected",
    "hundred",
    "speed",
    "unsigned",
    "supported",
    "unsupported",
    "related",
    "checked",
    "approved",
    "reviewed",
    "tested",
    "untested",
    "versioned",
    "pinned",
];

pub(super) const ACK_WORDS: &[&str] = &[
    "ok",
    "okay",
    "k",
    "kk",
    "thanks",
    "thank",
    "you",
    "ty",
    "thx",
    "lgtm",
    "sounds",
    "good",
    "great",
    "perfect",
    "cool",
    "nice",
    "done",
    "yes",
    "yep",
    "yeah",
    "yup",
    "sure",
    "go",
    "ahead",
    "ship",
    "it",
    "looks",
    "awesome",
    "works",
    "that",
    "got",
    "gotcha",
    "fine",
    "alright",
    "right",
    "agreed",
    "excellent",
    "amazing",
    "wonderful",
    "much",
    "a",
    "lot",
    "merci",
    "danke",
    "gracias",
    "👍",
    "🙏",
    "now",
    "better",
    "love",
    "this",
    "is",
    "ack",
    "roger",
    "noted",
    "understood",
    "makes",
    "sense",
];

pub(super) const OUTPUT_LINE_STARTS: &[&str] = &[
    "error",
    "warning",
    "warn",
    "info",
    "debug",
    "trace",
    "fatal",
    "panic",
    "exception",
    "traceback",
    "caused by",
    "at ",
    "file \"",
    "  ",
    "test ",
    "running",
    "compiling",
    "finished",
    "failed",
    "failures",
    "passed",
    "ok ",
    "note:",
    "help:",
    "-->",
    "| ",
    "e ",
    "assert",
    "expected",
    "found",
    "thread ",
    "npm ",
    "cargo ",
    "src/",
    "./",
    "http",
    "get ",
    "post ",
    "def ",
    "fn ",
    "func ",
    "class ",
    "import ",
    "from ",
    "return ",
    "let ",
    "const ",
    "var ",
    "if ",
    "for ",
    "while ",
    "pub ",
    "use ",
    "#include",
    "select ",
    "insert ",
    "update ",
    "create ",
    "drop ",
    "alter ",
    "apiversion",
    "kind:",
    "metadata",
    "spec:",
    "name:",
    "image:",
    "- name",
    "\"",
    "'",
];

pub(super) const FOREIGN_DIRECTIVES: &[&str] = &[
    // Spanish
    "nunca",
    "jamás",
    "siempre",
    "solo",
    "sólo",
    "solamente",
    "únicamente",
    "debe",
    "debes",
    "deben",
    "evita",
    "evitar",
    "prohibido",
    "prohibida",
    "obligatorio",
    "sin",
    "ningún",
    "ninguna",
    "usa",
    "utiliza",
    "escribe",
    "mantén",
    "añade",
    "pon",
    // German
    "nie",
    "niemals",
    "immer",
    "nur",
    "ausschließlich",
    "muss",
    "musst",
    "müssen",
    "darf",
    "darfst",
    "dürfen",
    "verboten",
    "vermeide",
    "keine",
    "keinen",
    "kein",
    "stets",
    "verwende",
    "benutze",
    "schreibe",
    "halte",
    "nutze",
    // French
    "jamais",
    "toujours",
    "seulement",
    "uniquement",
    "doit",
    "dois",
    "interdit",
    "évite",
    "utilise",
    "écris",
    "garde",
    // Portuguese, Italian
    "sempre",
    "apenas",
    "mai",
    "vietato",
    "proibido",
    "usare",
    "usar",
    // Dutch ("geen", like "keine", also tells: "er is geen tijd")
    "nooit",
    "altijd",
    "alleen",
    "uitsluitend",
    "moet",
    "moeten",
    "verboden",
    "vermijd",
    "gebruik",
];

pub(super) const FOREIGN_DIRECTIVE_PHRASES: &[&str] = &[
    "no uses",
    "no usar",
    "no hagas",
    "no pongas",
    "no añadas",
    "no toques",
    "no escribas",
    "hay que",
    "tienes que",
    "tiene que",
    "darf nicht",
    "darfst nicht",
    "bitte nicht",
    "il faut",
    "ne pas",
    "pas de",
    "não use",
    "não usar",
    "non usare",
    "niente",
];

pub(super) const FOREIGN_SCOPE: &[&str] = &[
    "a partir de ahora",
    "de ahora en adelante",
    "en adelante",
    "siempre que",
    "cada vez",
    "en todo",
    "en todos",
    "en todas",
    "ab jetzt",
    "ab sofort",
    "in zukunft",
    "künftig",
    "grundsätzlich",
    "jedes mal",
    "überall",
    "in allen",
    "désormais",
    "à partir de maintenant",
    "à l'avenir",
    "chaque fois",
    "partout",
    "d'ora in poi",
    "daqui em diante",
    "a partir de agora",
];

pub(super) const FOREIGN_POLITE: &[&str] = &[
    "por favor",
    "bitte",
    "s'il vous plaît",
    "s'il te plaît",
    "per favore",
    "por gentileza",
];

/// Pointers at what is present in the conversation.
pub(super) const DEICTIC: &[&str] = &["this", "that", "it", "these", "those", "here"];

/// Verbs of a team's way of working, as "we" says them: what it uses,
/// keeps, names, builds, ships and checks. A verb of what happens to the
/// team ("we hit", "we lose", "we get") or of thinking ("we think") is not
/// here.
pub(super) const PRACTICE_VERBS: &[&str] = &[
    "annotate",
    "approve",
    "archive",
    "audit",
    "avoid",
    "backport",
    "batch",
    "branch",
    "build",
    "bump",
    "bundle",
    "cache",
    "cap",
    "commit",
    "compile",
    "compress",
    "configure",
    "containerize",
    "cut",
    "default",
    "deploy",
    "document",
    "encode",
    "encrypt",
    "enforce",
    "escape",
    "export",
    "follow",
    "format",
    "gate",
    "generate",
    "hash",
    "host",
    "ignore",
    "import",
    "indent",
    "isolate",
    "keep",
    "label",
    "lint",
    "lock",
    "log",
    "merge",
    "migrate",
    "mirror",
    "mock",
    "name",
    "namespace",
    "normalize",
    "package",
    "paginate",
    "partition",
    "pin",
    "prefer",
    "prefix",
    "provision",
    "prune",
    "publish",
    "push",
    "put",
    "read",
    "rebase",
    "release",
    "replicate",
    "require",
    "retry",
    "review",
    "rotate",
    "round",
    "route",
    "run",
    "sanitize",
    "scan",
    "seed",
    "serialize",
    "shard",
    "ship",
    "sign",
    "sort",
    "split",
    "squash",
    "standardize",
    "stick",
    "store",
    "suffix",
    "tag",
    "target",
    "template",
    "test",
    "throttle",
    "track",
    "treat",
    "typecheck",
    "use",
    "validate",
    "vendor",
    "version",
    "wrap",
    "write",
];

/// Adverbs that may stand between "we" and the verb of a practice.
pub(super) const PRACTICE_ADVERBS: &[&str] = &[
    "all",
    "always",
    "also",
    "consistently",
    "generally",
    "just",
    "normally",
    "only",
    "strictly",
    "typically",
    "usually",
];

/// Words right after the verb that make it something that happened, or
/// an amount, rather than a practice: "we run out of memory", "we run
/// into the limit", "we use about 70 % of it", "we use a lot of disk".
pub(super) const PRACTICE_NOT_FOLLOWED_BY: &[&str] = &[
    "out",
    "into",
    "across",
    "over",
    "about",
    "around",
    "roughly",
    "approximately",
    "most",
    "lots",
    "tons",
];

/// Words after "and" that open a clause of its own: "we push to main and
/// the pipeline goes red" tells what followed, where "we lint with ruff
/// and format with black" goes on with the practice.
pub(super) const NEXT_SUBJECTS: &[&str] = &[
    "it",
    "that",
    "this",
    "they",
    "he",
    "she",
    "the",
    "nothing",
    "everything",
    "someone",
    "somebody",
    "nobody",
    "suddenly",
    "now",
];

/// Verbs of a norm: where a kind of thing lives, goes and comes from, what
/// it gets, needs, follows and uses ("secrets live in vault", "config
/// changes go through a PR", "public functions get docstrings", "new
/// tables need a primary key"). Activity verbs whose
/// third person reads as a plural noun ("deploys", "builds") are not here,
/// so that the subject is not cut short. Each verb is here in both its
/// forms, "live" and "lives".
pub(super) const NORM_VERBS: &[&str] = &[
    "belong", "belongs", "call", "calls", "carries", "carry", "come", "comes", "default",
    "defaults", "expire", "expires", "expose", "exposes", "flow", "flows", "follow", "follows",
    "get", "gets", "go", "goes", "happen", "happens", "include", "includes", "land", "lands",
    "live", "lives", "map", "maps", "match", "matches", "need", "needs", "own", "owns", "pass",
    "passes", "point", "points", "read", "reads", "receive", "receives", "remain", "remains",
    "require", "requires", "reside", "resides", "run", "runs", "ship", "ships", "sit", "sits",
    "start", "starts", "stay", "stays", "talk", "talks", "target", "targets", "use", "uses",
    "write", "writes",
];

/// Words that open something other than a kind of thing: a clause, a
/// person, a reply, a moment. Also where a norm's subject ends.
pub(super) const NORM_NOT_SUBJECTS: &[&str] = &[
    "after",
    "also",
    "and",
    "because",
    "before",
    "but",
    "everybody",
    "everyone",
    "here",
    "how",
    "if",
    "just",
    "let's",
    "maybe",
    "nobody",
    "not",
    "now",
    "once",
    "or",
    "since",
    "so",
    "someone",
    "somebody",
    "then",
    "today",
    "until",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "why",
    "yesterday",
    "you",
];

/// Prepositions after a passive that make it a norm: "is kept in the
/// archive", "are kept out of git", "are signed with the release key".
pub(super) const NORM_PREPOSITIONS: &[&str] = &[
    "after", "as", "at", "before", "behind", "by", "from", "in", "inside", "into", "on", "only",
    "out", "outside", "per", "through", "to", "under", "using", "via", "with",
];

/// Spans of time that "for" makes a long wait: "PRs sit for days".
pub(super) const NORM_LONG_WAITS: &[&str] = &[
    "ages", "days", "hours", "minutes", "months", "weeks", "years",
];

/// Words after the verb that tell trouble or how it went, not how a kind
/// of thing is handled: "requests get dropped", "builds go red", "old
/// branches stay around forever".
pub(super) const NORM_TROUBLE: &[&str] = &[
    "again",
    "bad",
    "blank",
    "break",
    "breaks",
    "broken",
    "corrupted",
    "crash",
    "crashes",
    "crashing",
    "dropped",
    "duplicated",
    "empty",
    "fail",
    "failing",
    "fails",
    "fine",
    "flaky",
    "forever",
    "garbled",
    "huge",
    "ignored",
    "intermittently",
    "lost",
    "mess",
    "messy",
    "missing",
    "nobody",
    "nowhere",
    "occasionally",
    "ok",
    "okay",
    "randomly",
    "red",
    "slow",
    "slower",
    "slowly",
    "sometimes",
    "somewhere",
    "stale",
    "still",
    "stuck",
    "swallowed",
    "truncated",
    "twice",
    "worse",
    "wrong",
];

/// A set of words and phrases the features ask about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Set {
    NegModal,
    ReqModal,
    Restrict,
    Format,
    Scope,
    Preference,
    Polite,
    ConditionAction,
    Correction,
    SecondPerson,
    Passive,
    Temporal,
    Step,
    Report,
    Epistemic,
    Observed,
    Past,
    ForeignDirective,
    ForeignScope,
    ForeignPolite,
    Again,
    Deictic,
    Quantifier,
    Justified,
    Reserved,
    Permission,
    Exception,
    Invariant,
    Expectation,
    /// "Should", which demands unless a phrase of [`Set::Expectation`]
    /// says it expects.
    Should,
    DemandFrame,
}

/// Which sets a segment's words touched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Found(u32);

impl Found {
    pub(super) fn has(self, set: Set) -> bool {
        self.0 & (1 << set as u32) != 0
    }

    fn add(&mut self, set: Set) {
        self.0 |= 1 << set as u32;
    }
}

/// Single-word lists a word may belong to, as bits of [`Lexed::classes`]:
/// one look-up per word answers every list.
pub(super) mod class {
    /// [`super::LEAD_FILLERS`].
    pub(in crate::classify) const LEAD_FILLER: u32 = 1 << 0;
    /// [`super::BAN_HEADS`].
    pub(in crate::classify) const BAN_HEAD: u32 = 1 << 1;
    /// [`super::BAN_LEADERS`].
    pub(in crate::classify) const BAN_LEADER: u32 = 1 << 2;
    /// [`super::QUANTIFIERS`].
    pub(in crate::classify) const QUANTIFIER: u32 = 1 << 3;
    /// [`super::DEFINITE_AFTER_QUANTIFIER`].
    pub(in crate::classify) const DEFINITE_AFTER_QUANTIFIER: u32 = 1 << 4;
    /// [`super::SAYING_VERBS`].
    pub(in crate::classify) const SAYING: u32 = 1 << 5;
    /// [`super::WRITER`].
    pub(in crate::classify) const WRITER: u32 = 1 << 6;
    /// [`super::ATTRIBUTIONS`].
    pub(in crate::classify) const ATTRIBUTION: u32 = 1 << 7;
    /// [`super::SHOWING_WORDS`].
    pub(in crate::classify) const SHOWING: u32 = 1 << 8;
    /// [`super::SHOWING_VERBS`].
    pub(in crate::classify) const SHOWING_VERB: u32 = 1 << 9;
    /// [`super::RULE_NOUNS`].
    pub(in crate::classify) const RULE_NOUN: u32 = 1 << 10;
    /// [`super::ACK_WORDS`].
    pub(in crate::classify) const ACK: u32 = 1 << 11;
    /// [`super::BEFORE_ADJECTIVES`].
    pub(in crate::classify) const BEFORE_ADJECTIVE: u32 = 1 << 12;
    /// [`super::AGENT_ADVERBS`].
    pub(in crate::classify) const AGENT_ADVERB: u32 = 1 << 13;
    /// [`super::AGENT_VERBS`].
    pub(in crate::classify) const AGENT_VERB: u32 = 1 << 14;
    /// [`super::IMPERATIVE_VERBS`].
    pub(in crate::classify) const IMPERATIVE: u32 = 1 << 15;
    /// [`super::TASK_VERBS`].
    pub(in crate::classify) const TASK: u32 = 1 << 16;
    /// [`super::MAINTAINING_VERBS`].
    pub(in crate::classify) const MAINTAINING: u32 = 1 << 17;
    /// [`super::SPECIFIC_DETERMINERS`].
    pub(in crate::classify) const SPECIFIC: u32 = 1 << 18;
    /// [`super::VERB_PARTICLES`].
    pub(in crate::classify) const PARTICLE: u32 = 1 << 19;
    /// [`super::NOT_PAST`].
    pub(in crate::classify) const NOT_PAST: u32 = 1 << 20;
    /// [`super::UNITS`].
    pub(in crate::classify) const UNIT: u32 = 1 << 21;
    /// [`super::WH_WORDS`].
    pub(in crate::classify) const WH_WORD: u32 = 1 << 22;
    /// [`super::AUXILIARIES`].
    pub(in crate::classify) const AUXILIARY: u32 = 1 << 23;
    /// [`super::QUESTION_SUBJECTS`].
    pub(in crate::classify) const QUESTION_SUBJECT: u32 = 1 << 24;
    /// [`super::CONDITION_OPENERS`].
    pub(in crate::classify) const CONDITION_OPENER: u32 = 1 << 25;
    /// [`super::STATEMENT_SUBJECTS`].
    pub(in crate::classify) const STATEMENT_SUBJECT: u32 = 1 << 26;
    /// [`super::MODAL_AFTER_SUBJECT`].
    pub(in crate::classify) const MODAL_AFTER_SUBJECT: u32 = 1 << 27;
    /// [`super::IDIOM_HEADS`].
    pub(in crate::classify) const IDIOM_HEAD: u32 = 1 << 28;
    /// [`super::NORM_VERBS`].
    pub(in crate::classify) const NORM_VERB: u32 = 1 << 29;
    /// [`super::NORM_NOT_SUBJECTS`].
    pub(in crate::classify) const NORM_NOT_SUBJECT: u32 = 1 << 30;
    /// [`super::NORM_TROUBLE`].
    pub(in crate::classify) const NORM_TROUBLE: u32 = 1 << 31;
}

/// A segment's words as the lexicon reads them: the sets its phrases
/// touch and each word's classes.
#[derive(Debug, Clone, Default)]
pub(super) struct Lexed {
    /// The sets touched.
    pub(super) found: Found,
    /// The sets touched by a phrase that starts before the segment's
    /// first comma or dash: its head clause.
    pub(super) head: Found,
    /// Per word, the [`class`] bits.
    pub(super) classes: Vec<u32>,
}

impl Lexed {
    /// Whether word `i` exists and is of `class`.
    pub(super) fn is(&self, i: usize, class: u32) -> bool {
        self.classes.get(i).is_some_and(|c| c & class != 0)
    }
}

/// A word's entry: the phrases that start with it, and its classes.
#[derive(Debug, Default)]
struct Entry {
    phrases: Vec<(Vec<&'static str>, Set)>,
    classes: u32,
}

/// FNV-1a: the lexicon's keys are short, fixed and not chosen by anyone
/// sending text, so a fast hash will do.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fnv(u64);

/// A map keyed by short words, hashed with [`Fnv`].
pub(super) type FnvMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Every set's phrases and every class's words, by their first word: one
/// pass over a segment's words finds every set it touches and every
/// word's classes.
#[derive(Debug)]
pub(super) struct Matcher {
    by_first: FnvMap<&'static str, Entry>,
}

impl Matcher {
    /// The matcher of the lexicon, built once.
    pub(super) fn get() -> &'static Matcher {
        static MATCHER: std::sync::OnceLock<Matcher> = std::sync::OnceLock::new();
        MATCHER.get_or_init(|| {
            let lists: &[(Set, &[&str])] = &[
                (Set::NegModal, NEG_MODAL_PHRASES),
                (Set::NegModal, NEG_MODAL_WORDS),
                (Set::ReqModal, REQ_MODAL_PHRASES),
                (Set::ReqModal, REQ_MODAL_WORDS),
                (Set::Restrict, RESTRICT_PHRASES),
                (Set::Restrict, RESTRICT_WORDS),
                (Set::Format, FORMAT_WORDS),
                (Set::Scope, SCOPE_PHRASES),
                (Set::Scope, SCOPE_WORDS),
                (Set::Preference, PREFERENCE_PHRASES),
                (Set::Preference, PREFERENCE_WORDS),
                (Set::Polite, POLITE_PHRASES),
                (Set::Polite, POLITE_WORDS),
                (Set::ConditionAction, CONDITION_ACTIONS),
                (Set::Correction, CORRECTION_PHRASES),
                (Set::SecondPerson, SECOND_PERSON_RULES),
                (Set::Passive, PASSIVE_RULES),
                (Set::Temporal, TEMPORAL_PHRASES),
                (Set::Temporal, TEMPORAL_WORDS),
                (Set::Step, STEP_PHRASES),
                (Set::Step, STEP_WORDS),
                (Set::Report, REPORT_WORDS),
                (Set::Report, REPORT_PHRASES),
                (Set::Epistemic, EPISTEMIC_PHRASES),
                (Set::Epistemic, EPISTEMIC_WORDS),
                (Set::Observed, OBSERVED_WORDS),
                (Set::Observed, OBSERVED_PHRASES),
                (Set::Past, super::modal::IRREGULAR_PAST),
                (Set::Past, MORE_PAST),
                (Set::ForeignDirective, FOREIGN_DIRECTIVES),
                (Set::ForeignDirective, FOREIGN_DIRECTIVE_PHRASES),
                (Set::ForeignScope, FOREIGN_SCOPE),
                (Set::ForeignPolite, FOREIGN_POLITE),
                (Set::Again, &["again"]),
                (Set::Deictic, DEICTIC),
                (Set::Quantifier, QUANTIFIERS),
                (Set::Justified, JUSTIFICATIONS),
                (Set::Reserved, RESERVATIONS),
                (Set::Permission, PERMISSIONS),
                (Set::Exception, EXCEPTIONS),
                (Set::Invariant, INVARIANTS),
                (Set::Expectation, EXPECTATIONS),
                (Set::Should, &["should"]),
                (Set::DemandFrame, DEMAND_FRAMES),
            ];
            let classes: &[(u32, &[&str])] = &[
                (class::LEAD_FILLER, LEAD_FILLERS),
                (class::BAN_HEAD, BAN_HEADS),
                (class::BAN_LEADER, BAN_LEADERS),
                (class::QUANTIFIER, QUANTIFIERS),
                (class::DEFINITE_AFTER_QUANTIFIER, DEFINITE_AFTER_QUANTIFIER),
                (class::SAYING, SAYING_VERBS),
                (class::WRITER, WRITER),
                (class::ATTRIBUTION, ATTRIBUTIONS),
                (class::SHOWING, SHOWING_WORDS),
                (class::SHOWING_VERB, SHOWING_VERBS),
                (class::RULE_NOUN, RULE_NOUNS),
                (class::ACK, ACK_WORDS),
                (class::BEFORE_ADJECTIVE, BEFORE_ADJECTIVES),
                (class::AGENT_ADVERB, AGENT_ADVERBS),
                (class::AGENT_VERB, AGENT_VERBS),
                (class::IMPERATIVE, IMPERATIVE_VERBS),
                (class::TASK, TASK_VERBS),
                (class::MAINTAINING, MAINTAINING_VERBS),
                (class::SPECIFIC, SPECIFIC_DETERMINERS),
                (class::PARTICLE, VERB_PARTICLES),
                (class::NOT_PAST, NOT_PAST),
                (class::UNIT, UNITS),
                (class::WH_WORD, WH_WORDS),
                (class::AUXILIARY, AUXILIARIES),
                (class::QUESTION_SUBJECT, QUESTION_SUBJECTS),
                (class::CONDITION_OPENER, CONDITION_OPENERS),
                (class::STATEMENT_SUBJECT, STATEMENT_SUBJECTS),
                (class::MODAL_AFTER_SUBJECT, MODAL_AFTER_SUBJECT),
                (class::IDIOM_HEAD, IDIOM_HEADS),
                (class::NORM_VERB, NORM_VERBS),
                (class::NORM_NOT_SUBJECT, NORM_NOT_SUBJECTS),
                (class::NORM_TROUBLE, NORM_TROUBLE),
            ];
            let mut by_first: std::collections::HashMap<_, Entry, _> = Default::default();
            for (set, phrases) in lists {
                for phrase in *phrases {
                    let words: Vec<&'static str> = phrase.split(' ').collect();
                    by_first
                        .entry(words[0])
                        .or_default()
                        .phrases
                        .push((words[1..].to_vec(), *set));
                }
            }
            for (bit, words) in classes {
                for word in *words {
                    by_first.entry(*word).or_default().classes |= bit;
                }
            }
            Matcher { by_first }
        })
    }

    /// The sets `words` touch, each phrase matched on consecutive words,
    /// and each word's classes.
    /// Reads `words`; phrases that start before word `head_end` are the
    /// head clause's too.
    pub(super) fn scan(&self, words: &[std::borrow::Cow<'_, str>], head_end: usize) -> Lexed {
        let mut found = Found::default();
        let mut head = Found::default();
        let mut classes = Vec::with_capacity(words.len());
        for (i, word) in words.iter().enumerate() {
            let Some(entry) = self.by_first.get(word.as_ref()) else {
                classes.push(0);
                continue;
            };
            classes.push(entry.classes);
            for (rest, set) in &entry.phrases {
                let fits = words.len() > i + rest.len()
                    && rest.iter().zip(&words[i + 1..]).all(|(a, b)| a == b);
                if fits {
                    found.add(*set);
                    if i < head_end {
                        head.add(*set);
                    }
                }
            }
        }
        Lexed {
            found,
            head,
            classes,
        }
    }
}
