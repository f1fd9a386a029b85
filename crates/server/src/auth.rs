//! Who is calling: bearer tokens, mapped by a token file to a tenant and a
//! role.
//!
//! # The token file
//!
//! TOML, one `[[token]]` table per token. The file holds each token's
//! SHA-256, never the token itself, so reading it does not let anyone
//! call the daemon:
//!
//! ```toml
//! [[token]]
//! id = "agent-ci"          # named in logs and the audit, never secret
//! tenant = "team-a"        # whose sessions the token reaches
//! role = "agent"           # agent | watcher | operator
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! ```
//!
//! `printf %s "$TOKEN" | sha256sum` gives the digest. A token is sent as
//! the `authorization` metadata, `Bearer <token>`.
//!
//! # Roles
//!
//! - `agent`: creates sessions, which then belong to its tenant, and
//!   reads, admits, plans, commits, pins, unpins, updates and deletes its
//!   tenant's sessions.
//! - `watcher`: reads and watches its tenant's sessions; changes nothing.
//! - `operator`: everything, on every tenant's sessions, export and import
//!   among it.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Works on its tenant's sessions.
    Agent,
    /// Reads and watches its tenant's sessions.
    Watcher,
    /// Everything, every tenant.
    Operator,
}

impl Role {
    /// The role's name in the token file and in errors.
    pub fn name(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Watcher => "watcher",
            Role::Operator => "operator",
        }
    }

    /// Whether the role may make a call that needs `access`.
    pub fn allows(self, access: Access) -> bool {
        match self {
            Role::Operator => true,
            Role::Agent => !matches!(access, Access::Transfer),
            Role::Watcher => matches!(access, Access::Server | Access::Read | Access::Watch),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The server's own description and health: any caller.
    Server,
    /// Reads a session's state or the list of sessions.
    Read,
    /// Streams compaction markers.
    Watch,
    /// Creates or changes a session.
    Write,
    /// Exports or imports a whole session.
    Transfer,
}

impl Access {
    /// What the `ctxbroker.v1.ContextBroker` method `method` (its name
    /// alone, as in the gRPC path) needs; `None` for a method the service
    /// does not have, which the service answers UNIMPLEMENTED.
    pub fn of_method(method: &str) -> Option<Access> {
        Some(match method {
            "GetServerInfo" => Access::Server,
            "GetSession" | "ListSessions" | "GetContext" | "GetSpan" | "SearchSpans"
            | "ListSpans" => Access::Read,
            "WatchCompactions" => Access::Watch,
            "CreateSession" | "UpdateSession" | "DeleteSession" | "Admit" | "AdmitStream"
            | "PlanCompaction" | "CommitCompaction" | "Pin" | "Unpin" | "SelectTrigger" => {
                Access::Write
            }
            "ExportSession" | "ImportSession" => Access::Transfer,
            _ => return None,
        })
    }

    /// How the access reads in errors.
    pub fn describe(self) -> &'static str {
        match self {
            Access::Server => "reading the server's description",
            Access::Read => "reading sessions",
            Access::Watch => "watching compaction markers",
            Access::Write => "changing sessions",
            Access::Transfer => "exporting or importing sessions",
        }
    }
}

/// The caller a token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's id in the token file: what logs and the audit name.
    pub token_id: String,
    /// Whose sessions the token reaches.
    pub tenant: String,
    /// What it allows.
    pub role: Role,
}

impl Caller {
    /// Whether the caller may see a session that belongs to `owner`.
    pub fn sees(&self, owner: &str) -> bool {
        self.role == Role::Operator || self.tenant == owner
    }
}

/// Why a token file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token file {path}: {detail}")]
pub struct TokenFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, naming the entry and the field.
    pub detail: String,
}

/// The longest tenant name and token id, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRows {
    #[serde(default)]
    token: Vec<TokenRow>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRow {
    id: String,
    tenant: String,
    role: Role,
    sha256: String,
}

/// The tokens of one token file, by digest.
#[derive(Debug, Default)]
pub struct TokenTable {
    by_digest: HashMap<[u8; 32], Arc<Caller>>,
}

impl TokenTable {
    /// Reads and checks the token file at `path`.
    pub fn load(path: &Path) -> Result<TokenTable, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|err| TokenFileError {
            path: path.to_owned(),
            detail: format!("cannot be read: {err}"),
        })?;
        TokenTable::parse(&text, path)
    }

    /// Checks the token file's `text` (read from `path`, for errors).
    pub fn parse(text: &str, path: &Path) -> Result<TokenTable, TokenFileError> {
        let refuse = |detail: String| TokenFileError {
            path: path.to_owned(),
            detail,
        };
        let rows: FileRows =
            toml::from_str(text).map_err(|err| refuse(err.message().to_owned()))?;
        let mut by_digest = HashMap::with_capacity(rows.token.len());
        let mut ids: HashMap<String, usize> = HashMap::with_capacity(rows.token.len());
        for (i, row) in rows.token.into_iter().enumerate() {
            let name = |field: &str| format!("token[{i}].{field}");
            for (field, value) in [("id", &row.id), ("tenant", &row.tenant)] {
                if let Some(why) = bad_name(value) {
                    return Err(refuse(format!("{}: {why}", name(field))));
                }
            }
            let digest = parse_digest(&row.sha256).ok_or_else(|| {
                refuse(format!(
                    "{}: must be 64 hexadecimal digits (the token's SHA-256)",
                    name("sha256")
                ))
            })?;
            if let Some(first) = ids.insert(row.id.clone(), i) {
                return Err(refuse(format!(
                    "{}: {:?} is also the id of token[{first}]",
                    name("id"),
                    row.id
                )));
            }
            let caller = Arc::new(Caller {
                token_id: row.id,
                tenant: row.tenant,
                role: row.role,
            });
            if let Some(other) = by_digest.insert(digest, caller) {
                return Err(refuse(format!(
                    "{}: the same token as {:?}",
                    name("sha256"),
                    other.token_id
                )));
            }
        }
        Ok(TokenTable { by_digest })
    }

    /// The caller `token` stands for, if the file has it.
    pub fn caller(&self, token: &str) -> Option<Arc<Caller>> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_digest.get(&digest).cloned()
    }

    /// How many tokens the file has.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether the file has no token.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// Why a name (tenant, token id) is refused, if it is.
fn bad_name(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".to_owned());
    }
    if value.len() > MAX_NAME_BYTES {
        return Some(format!(
            "{} bytes, over the limit of {MAX_NAME_BYTES}",
            value.len()
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "{c:?} is not allowed (letters, digits, '-', '_' and '.' only)"
        ));
    }
    None
}

fn parse_digest(hex_text: &str) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(hex_text.trim(), &mut digest).ok()?;
    Some(digest)
}

/// The tokens in force: read at start and again on reload.
#[derive(Debug)]
pub struct Tokens {
    path: PathBuf,
    table: RwLock<Arc<TokenTable>>,
}

impl Tokens {
    /// Reads the token file at `path`.
    pub fn load(path: &Path) -> Result<Tokens, TokenFileError> {
        let table = TokenTable::load(path)?;
        Ok(Tokens {
            path: path.to_owned(),
            table: RwLock::new(Arc::new(table)),
        })
    }

    /// Reads the file again. A file that is refused leaves the tokens in
    /// force as they were; the error says why.
    pub fn reload(&self) -> Result<usize, TokenFileError> {
        let table = TokenTable::load(&self.path)?;
        let count = table.len();
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
        Ok(count)
    }

    /// The tokens in force.
    pub fn table(&self) -> Arc<TokenTable> {
        Arc::clone(&self.table.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The token file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why a call's credentials were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization` metadata.
    Missing,
    /// `authorization` is not `Bearer <token>`.
    Malformed,
    /// The token is not in the token file.
    Unknown,
    /// The token's role does not allow the call.
    Forbidden {
        /// The token's role.
        role: Role,
        /// What the call needs.
        access: Access,
    },
}

impl Refusal {
    /// The status the caller gets: UNAUTHENTICATED when it is not known,
    /// PERMISSION_DENIED when it is known and not allowed.
    pub fn status(&self) -> tonic::Status {
        match self {
            Refusal::Missing => tonic::Status::unauthenticated(
                "authorization: missing; send \"Bearer <token>\" (the daemon requires tokens)",
            ),
            Refusal::Malformed => {
                tonic::Status::unauthenticated("authorization: must be \"Bearer <token>\"")
            }
            Refusal::Unknown => tonic::Status::unauthenticated("authorization: unknown token"),
            Refusal::Forbidden { role, access } => tonic::Status::permission_denied(format!(
                "a {role} token does not allow {}",
                access.describe()
            )),
        }
    }
}

/// The caller of a call that needs `access`, by the bearer token in its
/// `metadata`, or why it is refused.
pub fn authenticate(
    table: &TokenTable,
    metadata: &MetadataMap,
    access: Access,
) -> Result<Arc<Caller>, Refusal> {
    let value = metadata.get("authorization").ok_or(Refusal::Missing)?;
    let text = value.to_str().map_err(|_| Refusal::Malformed)?;
    let (scheme, token) = text.trim().split_once(' ').ok_or(Refusal::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(Refusal::Malformed);
    }
    let caller = table.caller(token.trim()).ok_or(Refusal::Unknown)?;
    if !caller.role.allows(access) {
        return Err(Refusal::Forbidden {
            role: caller.role,
            access,
        });
    }
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(token: &str) -> String {
        hex::encode(Sha256::digest(token.as_bytes()))
    }

    fn file(rows: &[(&str, &str, &str, &str)]) -> String {
        rows.iter()
            .map(|(id, tenant, role, token)| {
                format!(
                    "[[token]]\nid = {id:?}\ntenant = {tenant:?}\nrole = {role:?}\nsha256 = {:?}\n",
                    digest(token)
                )
            })
            .collect()
    }

    fn table(rows: &[(&str, &str, &str, &str)]) -> TokenTable {
        TokenTable::parse(&file(rows), Path::new("tokens.toml")).unwrap()
    }

    fn refused(text: &str) -> String {
        TokenTable::parse(text, Path::new("tokens.toml"))
            .unwrap_err()
            .to_string()
    }

    fn bearer(token: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
        metadata
    }

    #[test]
    fn a_token_stands_for_its_tenant_and_role_and_no_other_token_does() {
        let tokens = table(&[
            ("a-agent", "team-a", "agent", "secret-a"),
            ("ops", "platform", "operator", "secret-ops"),
        ]);
        assert_eq!(tokens.len(), 2);
        let caller = tokens.caller("secret-a").unwrap();
        assert_eq!(
            *caller,
            Caller {
                token_id: "a-agent".into(),
                tenant: "team-a".into(),
                role: Role::Agent
            }
        );
        assert!(caller.sees("team-a") && !caller.sees("team-b"));
        assert!(tokens.caller("ops").is_none());
        assert!(tokens.caller("secret-a ").is_none());
        assert!(tokens.caller("").is_none());
        let ops = tokens.caller("secret-ops").unwrap();
        assert!(ops.sees("team-a") && ops.sees("team-b"));
    }

    #[test]
    fn each_role_allows_what_it_says() {
        use Access::*;
        let table = [
            (Role::Agent, [true, true, true, true, false]),
            (Role::Watcher, [true, true, true, false, false]),
            (Role::Operator, [true, true, true, true, true]),
        ];
        for (role, allowed) in table {
            for (access, want) in [Server, Read, Watch, Write, Transfer]
                .into_iter()
                .zip(allowed)
            {
                assert_eq!(role.allows(access), want, "{role} {access:?}");
            }
        }
    }

    #[test]
    fn every_method_of_the_service_has_its_access() {
        let proto = include_str!("../../../proto/ctxbroker/v1/broker.proto");
        let methods: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .map(str::trim)
            .collect();
        assert_eq!(methods.len(), 20, "{methods:?}");
        for method in methods {
            assert!(
                Access::of_method(method).is_some(),
                "{method} has no access"
            );
        }
        assert_eq!(Access::of_method("Nope"), None);
        assert_eq!(Access::of_method("ExportSession"), Some(Access::Transfer));
        assert_eq!(Access::of_method("WatchCompactions"), Some(Access::Watch));
    }

    #[test]
    fn a_call_is_refused_for_each_reason_with_its_status() {
        let tokens = table(&[
            ("w", "team-a", "watcher", "secret-w"),
            ("a", "team-a", "agent", "secret-a"),
        ]);
        let code = |metadata: &MetadataMap, access| {
            authenticate(&tokens, metadata, access)
                .map(|c| c.token_id.clone())
                .map_err(|r| r.status().code())
        };
        use tonic::Code;
        assert_eq!(
            code(&MetadataMap::new(), Access::Read),
            Err(Code::Unauthenticated)
        );
        let mut basic = MetadataMap::new();
        basic.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(code(&basic, Access::Read), Err(Code::Unauthenticated));
        assert_eq!(code(&bearer(""), Access::Read), Err(Code::Unauthenticated));
        assert_eq!(
            code(&bearer("guess"), Access::Read),
            Err(Code::Unauthenticated)
        );
        assert_eq!(
            code(&bearer("secret-w"), Access::Write),
            Err(Code::PermissionDenied)
        );
        assert_eq!(code(&bearer("secret-w"), Access::Watch), Ok("w".into()));
        assert_eq!(code(&bearer("secret-a"), Access::Write), Ok("a".into()));
        assert_eq!(
            code(&bearer("secret-a"), Access::Transfer),
            Err(Code::PermissionDenied)
        );
        let mut lower = MetadataMap::new();
        lower.insert("authorization", "bearer secret-a".parse().unwrap());
        assert_eq!(code(&lower, Access::Read), Ok("a".into()));
        let denied = authenticate(&tokens, &bearer("secret-w"), Access::Write).unwrap_err();
        assert!(
            denied
                .status()
                .message()
                .contains("a watcher token does not allow changing sessions")
        );
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_entry_and_the_field() {
        let good = file(&[("a", "team-a", "agent", "x")]);
        for (text, expected) in [
            (good.replace("agent", "admin"), "unknown variant `admin`"),
            (
                good.replace(&digest("x"), "abc"),
                "token[0].sha256: must be 64 hexadecimal digits",
            ),
            (
                good.replace("team-a", ""),
                "token[0].tenant: must not be empty",
            ),
            (
                good.replace("team-a", "team a"),
                "token[0].tenant: ' ' is not allowed",
            ),
            (
                good.replace("id = \"a\"", &format!("id = {:?}", "i".repeat(129))),
                "token[0].id: 129 bytes, over the limit of 128",
            ),
            (format!("{good}extra = 1\n"), "unknown field `extra`"),
            (
                file(&[("a", "t", "agent", "x"), ("a", "t", "agent", "y")]),
                "token[1].id: \"a\" is also the id of token[0]",
            ),
            (
                file(&[("a", "t", "agent", "x"), ("b", "t", "watcher", "x")]),
                "token[1].sha256: the same token as \"a\"",
            ),
        ] {
            let err = refused(&text);
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
            assert!(err.starts_with("token file tokens.toml: "), "{err}");
        }
        assert!(TokenTable::parse("", Path::new("t")).unwrap().is_empty());
    }

    #[test]
    fn a_reload_takes_a_good_file_and_keeps_the_tokens_in_force_on_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, file(&[("a", "team-a", "agent", "one")])).unwrap();
        let tokens = Tokens::load(&path).unwrap();
        assert!(tokens.table().caller("one").is_some());
        std::fs::write(&path, file(&[("b", "team-a", "agent", "two")])).unwrap();
        assert_eq!(tokens.reload(), Ok(1));
        assert!(tokens.table().caller("one").is_none());
        assert!(tokens.table().caller("two").is_some());
        std::fs::write(&path, "[[token]]\nid = 3\n").unwrap();
        assert!(tokens.reload().is_err());
        assert!(
            tokens.table().caller("two").is_some(),
            "a bad file replaced the tokens"
        );
        std::fs::remove_file(&path).unwrap();
        let gone = tokens.reload().unwrap_err();
        assert!(gone.detail.contains("cannot be read"), "{gone}");
        assert!(tokens.table().caller("two").is_some());
    }
}
