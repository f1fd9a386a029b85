//! Layering the settings with figment: the defaults, the file over them
//! (each key checked on its own first, so that every bad one is named),
//! the flags and their environment twins over it.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::Serialized;
use figment::value::{Dict, Value};

use super::{Cli, MemoryShares, Settings};

/// The old name of the `log` key, still read.
const OLD_LOG_KEY: &str = "log_filter";

/// The setting that, unless set, is derived from `memory_budget_bytes`.
const SESSION_CACHE_KEY: &str = "session_cache_bytes";

/// Why the settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML file is not TOML.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line and column.
        message: String,
    },
    /// Keys of the TOML file are unknown or hold values of the wrong type.
    #[error("invalid config file {path}: {}", KeyProblems(problems))]
    Keys {
        /// The file.
        path: PathBuf,
        /// Every bad key, in key order.
        problems: Vec<KeyProblem>,
    },
    /// A value is out of range.
    #[error("invalid setting {key}: {message}")]
    Invalid {
        /// The setting.
        key: &'static str,
        /// What is wrong and the limit.
        message: String,
    },
    /// The layers could not be merged (a flag that has no file form, such
    /// as a path that is not UTF-8).
    #[error("invalid settings: {0}")]
    Layers(Box<figment::Error>),
}

/// One bad key of a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    /// The key, as written in the file.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

struct KeyProblems<'a>(&'a [KeyProblem]);

impl std::fmt::Display for KeyProblems<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "key `{}`: {}", problem.key, problem.message)?;
        }
        Ok(())
    }
}

impl Cli {
    /// Resolves flags, environment and the optional file into settings.
    pub fn resolve(self) -> Result<Settings, ConfigError> {
        let mut layers = Figment::from(Serialized::defaults(Settings::default()));
        let given = self.given();
        let mut cache_set = given.contains_key(SESSION_CACHE_KEY);
        if let Some(path) = &self.config {
            let file = read_file(path)?;
            cache_set |= file.contains_key(SESSION_CACHE_KEY);
            layers = layers.merge(Serialized::defaults(file));
        }
        let mut settings: Settings = layers
            .merge(Serialized::defaults(given))
            .extract()
            .map_err(|err| ConfigError::Layers(Box::new(err)))?;
        if !cache_set {
            let budget = settings.limits.memory_budget_bytes;
            settings.limits.session_cache_bytes = MemoryShares::of(budget).sessions;
        }
        settings.check()?;
        Ok(settings)
    }

    /// The flags (and variables) given, keyed as the file.
    fn given(&self) -> Dict {
        let mut given = match Value::serialize(self) {
            Ok(Value::Dict(_, given)) => given,
            _ => Dict::new(),
        };
        given.retain(|_, value| !matches!(value, Value::Empty(..)));
        given
    }
}

/// The keys a config file may hold (besides the old `log_filter`).
pub fn file_keys() -> Vec<String> {
    Settings::default().values().into_keys().collect()
}

/// Reads the file, checking each key on its own so that every bad one is
/// named; the old `log_filter` key comes back as `log`.
fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|err| ConfigError::Parse {
        path: path.to_owned(),
        message: err.to_string().trim_end().to_owned(),
    })?;
    let known = file_keys();
    let mut checked = toml::Table::new();
    let mut problems = Vec::new();
    for (key, value) in &table {
        let name = if key == OLD_LOG_KEY { "log" } else { key };
        let message = if !known.iter().any(|k| k == name) {
            Some(match nearest(key, &known) {
                Some(near) => format!("unknown key; did you mean `{near}`?"),
                None => format!("unknown key; the keys are {}", known.join(", ")),
            })
        } else if name != key && table.contains_key(name) {
            Some(format!("the old name of `{name}`, which the file sets too"))
        } else {
            let one = toml::Table::from_iter([(name.to_owned(), value.clone())]);
            let err = toml::Value::Table(one).try_into::<Settings>().err();
            err.map(|err| err.message().to_owned())
        };
        match message {
            Some(message) => problems.push(KeyProblem {
                key: key.clone(),
                message,
            }),
            None => {
                checked.insert(name.to_owned(), value.clone());
            }
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError::Keys {
            path: path.to_owned(),
            problems,
        });
    }
    Ok(checked)
}

/// The known key closest to a misspelt one, within two edits.
fn nearest<'a>(key: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(|candidate| (strsim::levenshtein(key, candidate), candidate.as_str()))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, candidate)| candidate)
}
