//! Who may call what: bearer tokens, mapped by a token file to a role and
//! a tenant, checked by a tower layer in front of every gRPC service.
//!
//! # The token file
//!
//! TOML, one `[[token]]` table per token (`auth_tokens_file`). The file
//! holds each token's SHA-256, never the token itself, so reading it does
//! not let anyone call the daemon:
//!
//! ```toml
//! [[token]]
//! id = "ci-bot"            # named in logs, never secret
//! role = "agent"           # agent | watcher | operator
//! tenant = "acme"          # agents and watchers only; an operator has none
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! ```
//!
//! `ctxbrokerd token new` makes a token and its entry; `ctxbrokerd token
//! hash` prints the digest of a token read from stdin. A token is sent as
//! the `authorization` metadata, `Bearer <token>`. The file is read at
//! start and again on SIGHUP; a file that fails its checks stops the start,
//! or, on reload, leaves the tokens in force as they were.
//!
//! # Roles
//!
//! [`RPCS`] says, for every RPC of `ctxbroker.v1.ContextBroker`, which
//! roles may call it: an agent everything but export and import, a
//! watcher the reads and the watch, an operator everything (and gets
//! UNIMPLEMENTED for a method the service does not have, where the others
//! are refused).
//!
//! # The layer
//!
//! [`AuthLayer`] sees every request before tonic routes it. A request to
//! the broker service either carries a token the file has and whose role
//! may call the method, and goes on with its [`Caller`] in its extensions
//! (where `BrokerService::caller` reads it), or is answered at once with
//! UNAUTHENTICATED or PERMISSION_DENIED, built from [`ApiError`] like
//! every other error. Health and reflection need no token: they tell
//! whether the daemon serves and what the contract is, nothing about any
//! session. With authentication off every broker request carries
//! [`Caller::open`], an operator.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use sha2::{Digest, Sha256};
use tonic::codegen::http;
use tower::{Layer, Service};
use tracing::{debug, info};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tenant::{self, Caller, Role};

/// The gRPC path prefix of every `ctxbroker.v1.ContextBroker` method.
pub const BROKER_PATH: &str = "/ctxbroker.v1.ContextBroker/";

/// The longest token id, in bytes.
pub const MAX_ID_BYTES: usize = 64;

/// The fields of a `[[token]]` entry.
const FIELDS: [&str; 4] = ["id", "role", "tenant", "sha256"];

/// The setting that names the token file, for errors.
const SETTING: &str = "auth_tokens_file";

/// Who may call an RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Allowed {
    /// Agents, watchers and operators: reads, the watch, the server's
    /// description and the trigger advice.
    Readers,
    /// Agents and operators: every RPC that creates or changes a session.
    Writers,
    /// Operators only: whole sessions out and in.
    Operators,
}

impl Allowed {
    /// Whether `role` may call an RPC allowed to `self`.
    pub fn permits(self, role: Role) -> bool {
        match (self, role) {
            (_, Role::Operator) => true,
            (Allowed::Readers | Allowed::Writers, Role::Agent) => true,
            (Allowed::Readers, Role::Watcher) => true,
            (Allowed::Writers | Allowed::Operators, Role::Watcher) => false,
            (Allowed::Operators, Role::Agent) => false,
        }
    }

    /// The roles, as errors name them.
    pub fn roles(self) -> &'static str {
        match self {
            Allowed::Readers => "agent, watcher and operator",
            Allowed::Writers => "agent and operator",
            Allowed::Operators => "operator",
        }
    }
}

/// Every RPC of `ctxbroker.v1.ContextBroker`, by the method name of its
/// gRPC path, with the roles that may call it. A unit test holds it to
/// the service in the contract, so an RPC added there and not here fails
/// the build's tests.
pub const RPCS: [(&str, Allowed); 22] = [
    ("CreateSession", Allowed::Writers),
    ("GetSession", Allowed::Readers),
    ("ListSessions", Allowed::Readers),
    ("UpdateSession", Allowed::Writers),
    ("DeleteSession", Allowed::Writers),
    ("Admit", Allowed::Writers),
    ("AdmitStream", Allowed::Writers),
    ("GetContext", Allowed::Readers),
    ("GetSpan", Allowed::Readers),
    ("SearchSpans", Allowed::Readers),
    ("ListSpans", Allowed::Readers),
    ("PlanCompaction", Allowed::Writers),
    ("CommitCompaction", Allowed::Writers),
    ("Pin", Allowed::Writers),
    ("Unpin", Allowed::Writers),
    ("WatchCompactions", Allowed::Readers),
    ("SelectTrigger", Allowed::Readers),
    ("GetServerInfo", Allowed::Readers),
    ("ExportSession", Allowed::Operators),
    ("ImportSession", Allowed::Operators),
    ("RetractLastTurn", Allowed::Writers),
    ("ResetSession", Allowed::Writers),
];

/// Who may call the broker method `method`; `None` for a name the
/// service does not have.
pub fn allowed(method: &str) -> Option<Allowed> {
    RPCS.iter()
        .find(|(name, _)| *name == method)
        .map(|(_, allowed)| *allowed)
}

/// Whether `role` may call the broker method `method`. An operator may
/// call anything (a method the service lacks is then UNIMPLEMENTED); the
/// other roles only the methods [`RPCS`] allows them.
pub fn may_call(role: Role, method: &str) -> bool {
    role == Role::Operator || allowed(method).is_some_and(|allowed| allowed.permits(role))
}

/// A role by its name in the token file.
pub fn parse_role(name: &str) -> Option<Role> {
    [Role::Agent, Role::Watcher, Role::Operator]
        .into_iter()
        .find(|role| role.name() == name)
}

/// The SHA-256 of a token, as the token file holds it: 64 lowercase
/// hexadecimal digits.
pub fn token_sha256_hex(token: &str) -> String {
    hex::encode(digest(token))
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A fresh token: 32 bytes from the operating system's generator, as 64
/// hexadecimal digits.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Checks a token id: 1 to 64 bytes of `[A-Za-z0-9._-]`.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if id.len() > MAX_ID_BYTES {
        return Err(format!(
            "must be at most {MAX_ID_BYTES} bytes; got {}",
            id.len()
        ));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "may only contain A-Z, a-z, 0-9, '.', '_' and '-'; found {bad:?}"
        ));
    }
    Ok(())
}

/// Checks what an entry's role needs of its tenant: agents and watchers
/// have one, operators none.
pub fn check_role_tenant(role: Role, tenant: Option<&str>) -> Result<(), String> {
    match (role, tenant) {
        (Role::Operator, Some(_)) => Err(format!(
            "must be absent for role {}: an operator reaches every tenant",
            role.name()
        )),
        (Role::Operator, None) => Ok(()),
        (Role::Agent | Role::Watcher, None) => Err(format!(
            "required for role {}: the tenant whose sessions the token reaches",
            role.name()
        )),
        (Role::Agent | Role::Watcher, Some(name)) => {
            tenant::check_tenant("tenant", name).map_err(|bad| bad.description)
        }
    }
}

/// The `[[token]]` entry for a token whose SHA-256 is `sha256`.
pub fn entry_toml(id: &str, role: Role, tenant: Option<&str>, sha256: &str) -> String {
    let mut out = format!("[[token]]\nid = {id:?}\nrole = {:?}\n", role.name());
    if let Some(tenant) = tenant {
        out.push_str(&format!("tenant = {tenant:?}\n"));
    }
    out.push_str(&format!("sha256 = {sha256:?}\n"));
    out
}

/// A token file that could not be used: its path and what is wrong,
/// naming the entry and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting auth_tokens_file ({}): {detail}", path.display())]
pub struct TokenFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub detail: String,
}

impl TokenFileError {
    /// The setting naming the file.
    pub fn key(&self) -> &'static str {
        SETTING
    }
}

/// How many tokens of each role a file has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoleCounts {
    /// Agent tokens.
    pub agent: usize,
    /// Watcher tokens.
    pub watcher: usize,
    /// Operator tokens.
    pub operator: usize,
}

impl RoleCounts {
    /// Every token.
    pub fn total(&self) -> usize {
        self.agent + self.watcher + self.operator
    }
}

impl fmt::Display for RoleCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tokens: {} agent, {} watcher, {} operator",
            self.total(),
            self.agent,
            self.watcher,
            self.operator
        )
    }
}

/// The tokens of one token file, by the SHA-256 of the token.
#[derive(Debug, Default)]
pub struct TokenTable {
    by_digest: HashMap<[u8; 32], Caller>,
    counts: RoleCounts,
}

impl TokenTable {
    /// Reads and checks the token file at `path`.
    pub fn load(path: &Path) -> Result<TokenTable, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|err| TokenFileError {
            path: path.to_owned(),
            detail: format!("cannot read: {err}"),
        })?;
        TokenTable::parse(&text, path)
    }

    /// Checks the token file's `text` (read from `path`, which errors
    /// name).
    pub fn parse(text: &str, path: &Path) -> Result<TokenTable, TokenFileError> {
        parse(text).map_err(|detail| TokenFileError {
            path: path.to_owned(),
            detail,
        })
    }

    /// The caller `token` stands for, if the file has it. Only digests are
    /// compared: the table holds no token.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        self.by_digest.get(&digest(token)).cloned()
    }

    /// How many tokens of each role the file has.
    pub fn counts(&self) -> RoleCounts {
        self.counts
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

/// The table of a token file's text, or what is wrong with it.
fn parse(text: &str) -> Result<TokenTable, String> {
    let document: toml::Table = toml::from_str(text)
        .map_err(|err| format!("not valid TOML: {}", err.to_string().trim_end()))?;
    if let Some(key) = document.keys().find(|key| *key != "token") {
        return Err(format!(
            "unknown key `{key}`; the file holds only [[token]] entries"
        ));
    }
    let entries = match document.get("token") {
        None => return Ok(TokenTable::default()),
        Some(toml::Value::Array(entries)) => entries,
        Some(_) => return Err("`token` must be an array of tables ([[token]])".to_owned()),
    };
    let mut table = TokenTable::default();
    let mut ids: HashMap<Arc<str>, usize> = HashMap::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let (digest, caller, at) = parse_entry(i, entry)?;
        let id = caller.token_id.clone().unwrap_or_else(|| Arc::from(""));
        if let Some(first) = ids.insert(id.clone(), i) {
            return Err(format!("{at}: id: {id:?} is also the id of token[{first}]"));
        }
        match caller.role {
            Role::Agent => table.counts.agent += 1,
            Role::Watcher => table.counts.watcher += 1,
            Role::Operator => table.counts.operator += 1,
        }
        if let Some(other) = table.by_digest.insert(digest, caller) {
            return Err(format!(
                "{at}: sha256: the same token as {:?}; every token must be different",
                other.token_id.as_deref().unwrap_or("")
            ));
        }
    }
    Ok(table)
}

/// One `[[token]]` entry: its digest, the caller it stands for, and how
/// errors name it.
fn parse_entry(i: usize, entry: &toml::Value) -> Result<([u8; 32], Caller, String), String> {
    let toml::Value::Table(entry) = entry else {
        return Err(format!(
            "token[{i}]: must be a table ([[token]]), not a {}",
            entry.type_str()
        ));
    };
    // Named by its id once the id is known to be one.
    let at = match entry.get("id").and_then(toml::Value::as_str) {
        Some(id) if check_id(id).is_ok() => format!("token[{i}] (id {id:?})"),
        _ => format!("token[{i}]"),
    };
    if let Some(key) = entry.keys().find(|key| !FIELDS.contains(&key.as_str())) {
        return Err(format!(
            "{at}: unknown field `{key}`; the fields are {}",
            FIELDS.join(", ")
        ));
    }
    let field = |name: &str| -> Result<Option<&str>, String> {
        match entry.get(name) {
            None => Ok(None),
            Some(toml::Value::String(text)) => Ok(Some(text.as_str())),
            Some(other) => Err(format!(
                "{at}: {name}: must be a string, not a {}",
                other.type_str()
            )),
        }
    };
    let required = |name: &str| -> Result<&str, String> {
        field(name)?.ok_or_else(|| format!("{at}: {name}: missing"))
    };
    let id = required("id")?;
    check_id(id).map_err(|why| format!("{at}: id: {why}"))?;
    let role_name = required("role")?;
    let role = parse_role(role_name).ok_or_else(|| {
        format!("{at}: role: must be one of agent, watcher, operator; got {role_name:?}")
    })?;
    let tenant = field("tenant")?;
    check_role_tenant(role, tenant).map_err(|why| format!("{at}: tenant: {why}"))?;
    let sha256 = required("sha256")?;
    let digest = parse_digest(sha256).map_err(|why| format!("{at}: sha256: {why}"))?;
    let caller = Caller {
        token_id: Some(Arc::from(id)),
        tenant: tenant.map(Arc::from),
        role,
    };
    Ok((digest, caller, at))
}

/// A digest written as 64 hexadecimal digits. The value is not repeated
/// in the error: it may be a token pasted in the wrong place.
fn parse_digest(text: &str) -> Result<[u8; 32], String> {
    let what = "must be 64 hexadecimal digits, the SHA-256 of the token (`ctxbrokerd token hash`)";
    if text.len() != 64 {
        return Err(format!("{what}; got {} characters", text.len()));
    }
    let mut digest = [0u8; 32];
    hex::decode_to_slice(text, &mut digest)
        .map_err(|_| format!("{what}; got characters that are not hexadecimal digits"))?;
    Ok(digest)
}

/// The tokens in force: read at start, and again on reload.
#[derive(Debug)]
pub struct Tokens {
    path: PathBuf,
    table: RwLock<Arc<TokenTable>>,
}

impl Tokens {
    /// Reads and checks the token file at `path`.
    pub fn load(path: &Path) -> Result<Tokens, TokenFileError> {
        let table = TokenTable::load(path)?;
        Ok(Tokens {
            path: path.to_owned(),
            table: RwLock::new(Arc::new(table)),
        })
    }

    /// Reads the file again. On success the new tokens are in force for
    /// every request from now on; on failure the tokens in force stay,
    /// and the error says why.
    pub fn reload(&self) -> Result<RoleCounts, TokenFileError> {
        let table = TokenTable::load(&self.path)?;
        let counts = table.counts();
        *self.table.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(table);
        Ok(counts)
    }

    /// The tokens in force.
    pub fn table(&self) -> Arc<TokenTable> {
        Arc::clone(&self.table.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The token file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The token of an `authorization` header: `Bearer <token>`, the scheme
/// in any case. Errors never repeat the header's value.
pub fn bearer_token(headers: &http::HeaderMap) -> Result<&str, ApiError> {
    let refuse = |why: &str| ApiError::Unauthenticated(why.to_owned());
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = values
        .next()
        .ok_or_else(|| refuse("no credentials: send `authorization: Bearer <token>`"))?;
    if values.next().is_some() {
        return Err(refuse(
            "more than one authorization header: send one, `authorization: Bearer <token>`",
        ));
    }
    let text = value.to_str().map_err(|_| {
        refuse(
            "the authorization header is not visible ASCII: send `authorization: Bearer <token>`",
        )
    })?;
    let text = text.trim();
    let (scheme, token) = text.split_once([' ', '\t']).unwrap_or((text, ""));
    if scheme.is_empty() || (token.is_empty() && !scheme.eq_ignore_ascii_case("bearer")) {
        return Err(refuse(
            "the authorization header has no scheme: send `authorization: Bearer <token>`",
        ));
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(refuse(
            "the authorization scheme is not Bearer; only bearer tokens are accepted: send `authorization: Bearer <token>`",
        ));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(refuse(
            "the bearer token is empty: send `authorization: Bearer <token>`",
        ));
    }
    Ok(token)
}

/// The caller of a call to the broker method `method` with `headers`, or
/// the error it is refused with: UNAUTHENTICATED without a known bearer
/// token, PERMISSION_DENIED when the token's role may not call the method.
/// Logs refusals by token id, never the token.
pub fn authorize(
    table: &TokenTable,
    headers: &http::HeaderMap,
    method: &str,
) -> Result<Caller, ApiError> {
    let token = bearer_token(headers).inspect_err(|err| {
        debug!(rpc = method, %err, "call refused");
    })?;
    let Some(caller) = table.caller(token) else {
        debug!(rpc = method, "call refused: unknown bearer token");
        return Err(ApiError::Unauthenticated(
            "unknown token: it is not in the daemon's token file".to_owned(),
        ));
    };
    if may_call(caller.role, method) {
        return Ok(caller);
    }
    let token_id = caller.token_id.as_deref().unwrap_or("");
    info!(
        token_id,
        role = caller.role.name(),
        rpc = method,
        "call refused: the token's role may not call the RPC"
    );
    let detail = match allowed(method) {
        Some(allowed) => format!(
            "the {} token {:?} may not call {method}; it is for {} tokens",
            caller.role.name(),
            caller.token_id.as_deref().unwrap_or(""),
            allowed.roles()
        ),
        None => format!(
            "{method} is not an RPC of ctxbroker.v1.ContextBroker; the {} token {:?} may call only the RPCs its role allows",
            caller.role.name(),
            caller.token_id.as_deref().unwrap_or("")
        ),
    };
    Err(ApiError::PermissionDenied {
        role: caller.role.name(),
        rpc: method.to_owned(),
        detail,
    })
}

/// The tower layer that authenticates every call to the broker service:
/// [`Server::layer`](tonic::transport::Server::layer) puts it in front of
/// every service.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    tokens: Option<Arc<Tokens>>,
    metrics: Option<Arc<Metrics>>,
}

impl AuthLayer {
    /// Checks calls against `tokens`; with `None`, authentication is off
    /// and every broker call is [`Caller::open`].
    pub fn new(tokens: Option<Arc<Tokens>>) -> AuthLayer {
        AuthLayer {
            tokens,
            metrics: None,
        }
    }

    /// Counts refused calls in `metrics` (`ctxbroker_rpc_duration_seconds`
    /// by method and code, as the service counts the calls it serves).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> AuthLayer {
        self.metrics = Some(metrics);
        self
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            tokens: self.tokens.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`AuthLayer`] makes: a broker call goes on to `inner` with
/// its [`Caller`], or is answered with the refusal; every other call goes
/// on untouched.
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    tokens: Option<Arc<Tokens>>,
    metrics: Option<Arc<Metrics>>,
}

/// The future of an [`Auth`] call.
pub type AuthFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Auth<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = AuthFuture<http::Response<R>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(method) = request.uri().path().strip_prefix(BROKER_PATH) {
            let arrived = std::time::Instant::now();
            let decided = match &self.tokens {
                None => Ok(Caller::open()),
                Some(tokens) => authorize(&tokens.table(), request.headers(), method),
            };
            match decided {
                Ok(caller) => {
                    // The handlers need the caller, not the token.
                    request.headers_mut().remove(http::header::AUTHORIZATION);
                    request.extensions_mut().insert(caller);
                }
                Err(err) => {
                    let status = tonic::Status::from(err);
                    if let Some(metrics) = &self.metrics {
                        let path = request.uri().path();
                        metrics.refused_call(path, status.code(), arrived.elapsed());
                    }
                    return Box::pin(std::future::ready(Ok(status.into_http())));
                }
            }
        }
        // The instance polled ready serves this call; a clone waits for
        // the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(inner.call(request))
    }
}

/// The shortest token `ctxbrokerd token hash` takes, in bytes.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Runs `ctxbrokerd token ...`: the token on `stdout`, what goes in the
/// token file or what is wrong on `stderr`. Returns the exit code: 0, 1
/// when the system fails (no randomness, no stdin), 2 for bad input.
pub fn token_command(
    command: &crate::config::TokenCommand,
    stdin: &mut dyn std::io::Read,
    stdout: &mut dyn std::io::Write,
    stderr: &mut dyn std::io::Write,
) -> u8 {
    match run_token_command(command, stdin, stdout, stderr) {
        Ok(()) => 0,
        Err((code, message)) => {
            let _ = writeln!(stderr, "ctxbrokerd: {message}");
            code
        }
    }
}

fn run_token_command(
    command: &crate::config::TokenCommand,
    stdin: &mut dyn std::io::Read,
    stdout: &mut dyn std::io::Write,
    stderr: &mut dyn std::io::Write,
) -> Result<(), (u8, String)> {
    use crate::config::TokenCommand;
    let io = |err: std::io::Error| (1, format!("cannot write: {err}"));
    match command {
        TokenCommand::New { id, role, tenant } => {
            check_id(id).map_err(|why| (2, format!("token new: --id: {why}")))?;
            check_role_tenant(*role, tenant.as_deref())
                .map_err(|why| (2, format!("token new: --tenant: {why}")))?;
            let token =
                new_token().map_err(|err| (1, format!("token new: no randomness: {err}")))?;
            let entry = entry_toml(id, *role, tenant.as_deref(), &token_sha256_hex(&token));
            writeln!(stdout, "{token}").map_err(io)?;
            write!(
                stderr,
                "\n# Token {id:?}, made by `ctxbrokerd token new`: append this entry to the \
                 token file (auth_tokens_file), then send the daemon SIGHUP. The token itself \
                 was printed on stdout and is kept nowhere.\n{entry}"
            )
            .map_err(io)?;
            Ok(())
        }
        TokenCommand::Hash => {
            let mut text = String::new();
            stdin
                .take(64 * 1024)
                .read_to_string(&mut text)
                .map_err(|err| (1, format!("token hash: cannot read stdin: {err}")))?;
            let token = text.strip_suffix('\n').unwrap_or(&text);
            let token = token.strip_suffix('\r').unwrap_or(token);
            if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
                return Err((
                    2,
                    format!(
                        "token hash: a token is sent in an HTTP header, so it must be visible ASCII without spaces; found {bad:?}"
                    ),
                ));
            }
            if token.len() < MIN_TOKEN_BYTES {
                return Err((
                    2,
                    format!(
                        "token hash: the token has {} characters, fewer than {MIN_TOKEN_BYTES}: too easy to guess (`ctxbrokerd token new` makes tokens of 64)",
                        token.len()
                    ),
                ));
            }
            writeln!(stdout, "{}", token_sha256_hex(token)).map_err(io)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::convert::Infallible;

    use prost::Message;
    use tonic::Code;
    use tonic_types::StatusExt;

    use super::*;

    fn file(rows: &[(&str, &str, Option<&str>, &str)]) -> String {
        rows.iter()
            .map(|(id, role, tenant, token)| {
                let role = parse_role(role).unwrap();
                entry_toml(id, role, *tenant, &token_sha256_hex(token))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn table(rows: &[(&str, &str, Option<&str>, &str)]) -> TokenTable {
        TokenTable::parse(&file(rows), Path::new("tokens.toml")).unwrap()
    }

    fn refused(text: &str) -> String {
        TokenTable::parse(text, Path::new("tokens.toml"))
            .unwrap_err()
            .to_string()
    }

    fn headers(value: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    fn sample() -> TokenTable {
        table(&[
            ("ci-bot", "agent", Some("acme"), "agent-secret-0123456789"),
            ("dash", "watcher", Some("acme"), "watcher-secret-0123456789"),
            ("ops", "operator", None, "operator-secret-0123456789"),
        ])
    }

    #[test]
    fn a_good_file_maps_each_token_to_its_caller() {
        let tokens = sample();
        assert_eq!(tokens.len(), 3);
        assert_eq!(
            tokens.counts(),
            RoleCounts {
                agent: 1,
                watcher: 1,
                operator: 1
            }
        );
        assert_eq!(
            tokens.counts().to_string(),
            "3 tokens: 1 agent, 1 watcher, 1 operator"
        );
        assert_eq!(
            tokens.caller("agent-secret-0123456789"),
            Some(Caller {
                token_id: Some(Arc::from("ci-bot")),
                tenant: Some(Arc::from("acme")),
                role: Role::Agent,
            })
        );
        let ops = tokens.caller("operator-secret-0123456789").unwrap();
        assert_eq!((ops.role, ops.tenant), (Role::Operator, None));
        assert_eq!(ops.token_id.as_deref(), Some("ops"));
        for stranger in [
            "",
            "agent-secret-012345678",
            "agent-secret-0123456789 ",
            "ci-bot",
            &token_sha256_hex("agent-secret-0123456789"),
        ] {
            assert_eq!(tokens.caller(stranger), None, "{stranger:?}");
        }
        // Upper-case digests are digests too; an empty file has no token.
        let upper = entry_toml(
            "a",
            Role::Agent,
            Some("t"),
            &token_sha256_hex("x").to_uppercase(),
        );
        let upper = TokenTable::parse(&upper, Path::new("t")).unwrap();
        assert!(upper.caller("x").is_some());
        assert!(TokenTable::parse("", Path::new("t")).unwrap().is_empty());
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_file_the_entry_and_the_field() {
        let good = file(&[("ci", "agent", Some("acme"), "x")]);
        let digest = token_sha256_hex("x");
        for (text, expected) in [
            ("[[token]\n".to_owned(), "not valid TOML"),
            (
                format!("tokens = 1\n{good}"),
                "unknown key `tokens`; the file holds only [[token]] entries",
            ),
            (
                "token = 3\n".to_owned(),
                "`token` must be an array of tables",
            ),
            ("token = [1]\n".to_owned(), "token[0]: must be a table"),
            (good.replace("id = \"ci\"\n", ""), "token[0]: id: missing"),
            (
                good.replace("id = \"ci\"", "id = 7"),
                "token[0]: id: must be a string, not a integer",
            ),
            (
                good.replace("id = \"ci\"", "id = \"\""),
                "token[0]: id: must not be empty",
            ),
            (
                good.replace("id = \"ci\"", "id = \"c i\""),
                "token[0]: id: may only contain A-Z, a-z, 0-9, '.', '_' and '-'; found ' '",
            ),
            (
                good.replace("id = \"ci\"", &format!("id = {:?}", "i".repeat(65))),
                "token[0]: id: must be at most 64 bytes; got 65",
            ),
            (
                good.replace("role = \"agent\"\n", ""),
                "token[0] (id \"ci\"): role: missing",
            ),
            (
                good.replace("\"agent\"", "\"admin\""),
                "token[0] (id \"ci\"): role: must be one of agent, watcher, operator; got \"admin\"",
            ),
            (
                good.replace("tenant = \"acme\"\n", ""),
                "token[0] (id \"ci\"): tenant: required for role agent",
            ),
            (
                good.replace("\"agent\"", "\"watcher\"")
                    .replace("tenant = \"acme\"\n", ""),
                "token[0] (id \"ci\"): tenant: required for role watcher",
            ),
            (
                good.replace("\"agent\"", "\"operator\""),
                "token[0] (id \"ci\"): tenant: must be absent for role operator",
            ),
            (
                good.replace("\"acme\"", "\"a/b\""),
                "token[0] (id \"ci\"): tenant: tenant may only contain",
            ),
            (
                good.replace("\"acme\"", "\"\""),
                "token[0] (id \"ci\"): tenant: tenant must not be empty",
            ),
            (
                good.replace(&digest, "abc"),
                "token[0] (id \"ci\"): sha256: must be 64 hexadecimal digits, the SHA-256 of the token (`ctxbrokerd token hash`); got 3 characters",
            ),
            (
                good.replace(&digest, &"g".repeat(64)),
                "token[0] (id \"ci\"): sha256: must be 64 hexadecimal digits, the SHA-256 of the token (`ctxbrokerd token hash`); got characters that are not hexadecimal digits",
            ),
            (
                good.replace("sha256", "sha"),
                "token[0] (id \"ci\"): unknown field `sha`; the fields are id, role, tenant, sha256",
            ),
            (
                file(&[
                    ("a", "agent", Some("t"), "x"),
                    ("a", "watcher", Some("t"), "y"),
                ]),
                "token[1] (id \"a\"): id: \"a\" is also the id of token[0]",
            ),
            (
                file(&[("a", "agent", Some("t"), "x"), ("b", "operator", None, "x")]),
                "token[1] (id \"b\"): sha256: the same token as \"a\"",
            ),
        ] {
            let err = refused(&text);
            assert!(
                err.starts_with("invalid setting auth_tokens_file (tokens.toml): "),
                "{err}"
            );
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        }
        // A value that does not look like a digest is never repeated: it
        // may be a token pasted in the wrong place.
        let secret = "s3cret-token-pasted-in-place-of-its-digest";
        let err = refused(&good.replace(&digest, secret));
        assert!(!err.contains(secret), "{err}");
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case_and_anything_else_is_refused_without_echo() {
        assert_eq!(bearer_token(&headers("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer_token(&headers("bearer abc")).unwrap(), "abc");
        assert_eq!(bearer_token(&headers("BEARER   abc  ")).unwrap(), "abc");
        let reason = |headers: &http::HeaderMap| match bearer_token(headers) {
            Err(err @ ApiError::Unauthenticated(_)) => err.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(reason(&http::HeaderMap::new()).contains("no credentials"));
        for (value, expected) in [
            (
                "Basic dXNlcjpwYXNz",
                "the authorization scheme is not Bearer",
            ),
            (
                "Token sekrit-value",
                "the authorization scheme is not Bearer",
            ),
            ("sekrit-value", "has no scheme"),
            ("Bearer ", "the bearer token is empty"),
            ("bearer  \t", "the bearer token is empty"),
            (" ", "has no scheme"),
        ] {
            let got = reason(&headers(value));
            assert!(got.contains(expected), "{value:?}: {got}");
            assert!(!got.contains("sekrit") && !got.contains("dXNl"), "{got}");
        }
        let mut twice = headers("Bearer a");
        twice.append(http::header::AUTHORIZATION, "Bearer b".parse().unwrap());
        assert!(reason(&twice).contains("more than one authorization header"));
        let mut binary = http::HeaderMap::new();
        binary.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_bytes(b"Bearer \xff").unwrap(),
        );
        assert!(reason(&binary).contains("not visible ASCII"));
    }

    #[test]
    fn authorize_knows_the_token_and_checks_its_role_against_the_rpc() {
        let tokens = sample();
        let code = |token: &str, method: &str| {
            authorize(&tokens, &headers(&format!("Bearer {token}")), method)
                .map(|caller| caller.token_id.as_deref().unwrap_or("").to_owned())
                .map_err(|err| tonic::Status::from(err).code())
        };
        let agent = "agent-secret-0123456789";
        let watcher = "watcher-secret-0123456789";
        let operator = "operator-secret-0123456789";
        assert_eq!(code("guess", "GetServerInfo"), Err(Code::Unauthenticated));
        assert_eq!(code(agent, "Admit"), Ok("ci-bot".into()));
        assert_eq!(code(agent, "ExportSession"), Err(Code::PermissionDenied));
        assert_eq!(code(agent, "Nope"), Err(Code::PermissionDenied));
        assert_eq!(code(watcher, "ListSessions"), Ok("dash".into()));
        assert_eq!(code(watcher, "Admit"), Err(Code::PermissionDenied));
        assert_eq!(code(operator, "ImportSession"), Ok("ops".into()));
        assert_eq!(code(operator, "Nope"), Ok("ops".into()));

        let denied =
            authorize(&tokens, &headers(&format!("Bearer {watcher}")), "Admit").unwrap_err();
        let status = tonic::Status::from(denied);
        assert_eq!(
            status.message(),
            "permission denied: the watcher token \"dash\" may not call Admit; it is for agent and operator tokens"
        );
        let info = status.get_error_details().error_info().unwrap().clone();
        assert_eq!(info.reason, "PERMISSION_DENIED");
        assert_eq!(info.domain, crate::error::ERROR_DOMAIN);
        assert_eq!(
            info.metadata.get("role").map(String::as_str),
            Some("watcher")
        );
        assert_eq!(info.metadata.get("rpc").map(String::as_str), Some("Admit"));
        let unknown =
            tonic::Status::from(authorize(&tokens, &headers("Bearer guess"), "Admit").unwrap_err());
        let info = unknown.get_error_details().error_info().unwrap().clone();
        assert_eq!(info.reason, "UNAUTHENTICATED");
    }

    /// The table against the contract: every RPC of the service, as the
    /// descriptor set compiled from the `.proto` files has them, has its
    /// roles, and the table names no RPC the service lacks.
    #[test]
    fn every_rpc_of_the_service_is_in_the_table_once() {
        let set =
            prost_types::FileDescriptorSet::decode(ctxbroker_proto::FILE_DESCRIPTOR_SET).unwrap();
        let services: Vec<_> = set
            .file
            .iter()
            .filter(|file| file.package() == "ctxbroker.v1")
            .flat_map(|file| file.service.iter())
            .collect();
        assert_eq!(services.len(), 1, "one service in ctxbroker.v1");
        let service = services[0];
        assert_eq!(
            BROKER_PATH,
            format!("/ctxbroker.v1.{}/", service.name()),
            "the path prefix names the service"
        );
        assert_eq!(
            BROKER_PATH,
            format!(
                "/{}/",
                <ctxbroker_proto::v1::context_broker_server::ContextBrokerServer<
                    crate::service::BrokerService,
                > as tonic::server::NamedService>::NAME
            )
        );
        let contract: BTreeSet<&str> = service.method.iter().map(|m| m.name()).collect();
        let table: BTreeSet<&str> = RPCS.iter().map(|(name, _)| *name).collect();
        assert_eq!(table.len(), RPCS.len(), "an RPC is in the table twice");
        let missing: Vec<_> = contract.difference(&table).collect();
        assert!(
            missing.is_empty(),
            "RPCs with no roles in auth::RPCS: {missing:?}"
        );
        let extra: Vec<_> = table.difference(&contract).collect();
        assert!(
            extra.is_empty(),
            "auth::RPCS names RPCs the service lacks: {extra:?}"
        );
    }

    #[test]
    fn each_role_may_call_exactly_what_it_says() {
        let calls = |role: Role| -> BTreeSet<&str> {
            RPCS.iter()
                .map(|(name, _)| *name)
                .filter(|name| may_call(role, name))
                .collect()
        };
        let all: BTreeSet<&str> = RPCS.iter().map(|(name, _)| *name).collect();
        assert_eq!(calls(Role::Operator), all);
        let mut agent = all.clone();
        agent.remove("ExportSession");
        agent.remove("ImportSession");
        assert_eq!(calls(Role::Agent), agent);
        let watcher: BTreeSet<&str> = [
            "GetSession",
            "ListSessions",
            "GetContext",
            "GetSpan",
            "SearchSpans",
            "ListSpans",
            "WatchCompactions",
            "SelectTrigger",
            "GetServerInfo",
        ]
        .into_iter()
        .collect();
        assert_eq!(calls(Role::Watcher), watcher);
        // A method the service lacks: the operator reaches UNIMPLEMENTED,
        // the others are refused.
        assert!(may_call(Role::Operator, "Nope"));
        assert!(!may_call(Role::Agent, "Nope"));
        assert!(!may_call(Role::Watcher, "Nope"));
        assert!(!may_call(Role::Agent, ""));
    }

    #[test]
    fn a_reload_takes_a_good_file_and_keeps_the_tokens_in_force_on_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, file(&[("a", "agent", Some("t"), "one")])).unwrap();
        let tokens = Tokens::load(&path).unwrap();
        assert_eq!(tokens.path(), path);
        assert!(tokens.table().caller("one").is_some());
        std::fs::write(&path, file(&[("b", "watcher", Some("t"), "two")])).unwrap();
        assert_eq!(
            tokens.reload(),
            Ok(RoleCounts {
                watcher: 1,
                ..RoleCounts::default()
            })
        );
        assert!(tokens.table().caller("one").is_none());
        assert!(tokens.table().caller("two").is_some());
        std::fs::write(&path, "[[token]]\nid = 3\n").unwrap();
        let err = tokens.reload().unwrap_err();
        assert_eq!(err.key(), "auth_tokens_file");
        assert!(err.detail.contains("token[0]: id"), "{err}");
        assert!(
            tokens.table().caller("two").is_some(),
            "a bad file replaced the tokens"
        );
        std::fs::remove_file(&path).unwrap();
        let gone = tokens.reload().unwrap_err();
        assert!(gone.detail.contains("cannot read"), "{gone}");
        assert!(tokens.table().caller("two").is_some());
    }

    #[test]
    fn a_new_token_is_32_random_bytes_and_its_entry_reads_back() {
        let one = new_token().unwrap();
        let two = new_token().unwrap();
        assert_eq!(one.len(), 64);
        assert!(one.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(one, two);
        let entry = entry_toml("ci", Role::Agent, Some("acme"), &token_sha256_hex(&one));
        let table = TokenTable::parse(&entry, Path::new("t")).unwrap();
        assert_eq!(table.caller(&one).unwrap().tenant.as_deref(), Some("acme"));
        assert_eq!(
            token_sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_token_commands_print_a_token_and_its_entry_or_a_digest() {
        use crate::config::TokenCommand;
        let run = |command: &TokenCommand, input: &str| {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = token_command(command, &mut input.as_bytes(), &mut out, &mut err);
            (
                code,
                String::from_utf8(out).unwrap(),
                String::from_utf8(err).unwrap(),
            )
        };
        let new = TokenCommand::New {
            id: "ci-bot".into(),
            role: Role::Agent,
            tenant: Some("acme".into()),
        };
        let (code, out, err) = run(&new, "");
        assert_eq!(code, 0, "{err}");
        let token = out.strip_suffix('\n').unwrap();
        assert_eq!(token.len(), 64, "{out:?}");
        // stderr is the entry, ready to append: it reads back to the token.
        let table = TokenTable::parse(&err, Path::new("t")).unwrap();
        let caller = table.caller(token).unwrap();
        assert_eq!(caller.actor(), "ci-bot@acme");
        assert!(!err.contains(token), "the token is not in the entry");

        for (command, expected) in [
            (
                TokenCommand::New {
                    id: "ops".into(),
                    role: Role::Operator,
                    tenant: Some("acme".into()),
                },
                "--tenant: must be absent for role operator",
            ),
            (
                TokenCommand::New {
                    id: "w".into(),
                    role: Role::Watcher,
                    tenant: None,
                },
                "--tenant: required for role watcher",
            ),
            (
                TokenCommand::New {
                    id: "a b".into(),
                    role: Role::Operator,
                    tenant: None,
                },
                "--id: may only contain",
            ),
        ] {
            let (code, out, err) = run(&command, "");
            assert_eq!(code, 2, "{command:?}");
            assert!(out.is_empty());
            assert!(err.contains(expected), "{err}");
        }

        let (code, out, err) = run(&TokenCommand::Hash, "my-own-token-0123456789\n");
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out,
            format!("{}\n", token_sha256_hex("my-own-token-0123456789"))
        );
        let (_, crlf, _) = run(&TokenCommand::Hash, "my-own-token-0123456789\r\n");
        assert_eq!(crlf, out);
        let (code, _, err) = run(&TokenCommand::Hash, "short\n");
        assert_eq!(code, 2);
        assert!(err.contains("fewer than 16"), "{err}");
        let (code, _, err) = run(&TokenCommand::Hash, "two words of a token here\n");
        assert_eq!(code, 2);
        assert!(err.contains("visible ASCII"), "{err}");
    }

    /// The layer in front of a service that answers with the caller it
    /// was given: what passes, what is refused, what is left alone.
    #[tokio::test]
    async fn the_layer_refuses_with_a_grpc_status_or_passes_the_caller_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(
            &path,
            file(&[("dash", "watcher", Some("acme"), "watcher-token-0123456789")]),
        )
        .unwrap();
        let tokens = Arc::new(Tokens::load(&path).unwrap());
        let echo = tower::service_fn(|request: http::Request<()>| async move {
            let caller = request.extensions().get::<Caller>().cloned();
            let leaked = request.headers().contains_key(http::header::AUTHORIZATION);
            let body = format!(
                "{}|{}",
                caller.map(|c| c.actor()).unwrap_or_else(|| "none".into()),
                leaked
            );
            Ok::<_, Infallible>(http::Response::new(body))
        });
        let call = |layer: AuthLayer, path: &str, auth: Option<&str>| {
            let mut service = layer.layer(echo);
            let mut request = http::Request::builder().uri(path);
            if let Some(auth) = auth {
                request = request.header("authorization", auth);
            }
            let request = request.body(()).unwrap();
            async move {
                let response = service.call(request).await.unwrap();
                let status = tonic::Status::from_header_map(response.headers());
                (status, response.into_body())
            }
        };
        let on = AuthLayer::new(Some(tokens));
        let broker = |method: &str| format!("{BROKER_PATH}{method}");

        let (status, body) = call(
            on.clone(),
            &broker("ListSessions"),
            Some("Bearer watcher-token-0123456789"),
        )
        .await;
        assert!(status.is_none());
        assert_eq!(
            body, "dash@acme|false",
            "the caller passes, the token does not"
        );

        let (status, _) = call(on.clone(), &broker("ListSessions"), None).await;
        let status = status.unwrap();
        assert_eq!(status.code(), Code::Unauthenticated);
        let info = status.get_error_details().error_info().unwrap().clone();
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("UNAUTHENTICATED", "ctxbroker.v1")
        );
        let (status, _) = call(
            on.clone(),
            &broker("Admit"),
            Some("Bearer watcher-token-0123456789"),
        )
        .await;
        assert_eq!(status.unwrap().code(), Code::PermissionDenied);
        let (status, _) = call(on.clone(), &broker("Admit"), Some("Basic abc")).await;
        assert_eq!(status.unwrap().code(), Code::Unauthenticated);

        // Health and reflection need no token, and get no caller.
        for open in [
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        ] {
            let (status, body) = call(on.clone(), open, None).await;
            assert!(status.is_none(), "{open}");
            assert_eq!(body, "none|false");
        }

        // Off: every broker call is an operator over everything.
        let (status, body) = call(AuthLayer::new(None), &broker("ExportSession"), None).await;
        assert!(status.is_none());
        assert_eq!(body, "|false", "Caller::open has an empty actor");
    }
}
