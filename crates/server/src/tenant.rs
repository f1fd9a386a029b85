//! Who is calling and which sessions they may see.
//!
//! Every session belongs to a tenant. The store keys a tenant's session by
//! its full id, `tenant/session`; sessions created without a tenant (auth
//! off, or an operator naming a bare id) have bare full ids. A caller
//! bound to a tenant names its sessions by their bare ids and sees nothing
//! else: its ids are qualified on the way in and stripped on the way out,
//! so another tenant's session is, to it, a session that does not exist.
//! An operator sees the whole key space and names sessions by full id.

use std::borrow::Cow;
use std::sync::Arc;

use crate::error::BadField;

/// Separates the tenant from the session in a full id. Session ids cannot
/// contain it, so the mapping is one to one.
pub const SEPARATOR: char = '/';
/// The longest tenant name, in bytes.
pub const MAX_TENANT_BYTES: usize = 64;

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Admits, reads, plans, commits and pins its tenant's sessions.
    Agent,
    /// Reads and watches its tenant's sessions.
    Watcher,
    /// Everything, over every tenant, export and import included.
    Operator,
}

impl Role {
    /// The role's name as the token file spells it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Watcher => "watcher",
            Role::Operator => "operator",
        }
    }
}

/// The authenticated caller of one request, put in the request's
/// extensions by the authentication layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's id from the token file; `None` when auth is off.
    pub token_id: Option<Arc<str>>,
    /// The caller's tenant; `None` for an operator (every tenant).
    pub tenant: Option<Arc<str>>,
    /// What the caller may do.
    pub role: Role,
}

impl Caller {
    /// The caller when authentication is off: an operator over everything,
    /// with no token.
    pub fn open() -> Caller {
        Caller {
            token_id: None,
            tenant: None,
            role: Role::Operator,
        }
    }

    /// Who did it, for markers and the audit: `token-id@tenant`,
    /// `token-id` for an operator, empty when auth is off.
    pub fn actor(&self) -> String {
        match (&self.token_id, &self.tenant) {
            (Some(id), Some(tenant)) => format!("{id}@{tenant}"),
            (Some(id), None) => id.to_string(),
            (None, _) => String::new(),
        }
    }

    /// The part of the key space the caller sees.
    pub fn scope(&self) -> Scope {
        Scope {
            tenant: self.tenant.clone(),
        }
    }
}

/// The part of the session key space one caller sees: one tenant's
/// sessions, or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    tenant: Option<Arc<str>>,
}

impl Scope {
    /// Every session, named by full id.
    pub fn all() -> Scope {
        Scope { tenant: None }
    }

    /// One tenant's sessions, named by bare id.
    pub fn tenant(name: &str) -> Scope {
        Scope {
            tenant: Some(Arc::from(name)),
        }
    }

    /// The tenant, when the scope is one.
    pub fn tenant_name(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The full id of the session the caller names `id` (already checked
    /// as a session id the caller may write): `id` itself, not copied, for
    /// an operator.
    pub fn full_id<'a>(&self, id: &'a str) -> Cow<'a, str> {
        match &self.tenant {
            Some(tenant) => Cow::Owned(format!("{tenant}{SEPARATOR}{id}")),
            None => Cow::Borrowed(id),
        }
    }

    /// The id the caller knows a session by, or `None` when the session
    /// is outside the scope.
    pub fn local_id<'a>(&self, full_id: &'a str) -> Option<&'a str> {
        match &self.tenant {
            None => Some(full_id),
            Some(tenant) => full_id
                .strip_prefix(&**tenant)
                .and_then(|rest| rest.strip_prefix(SEPARATOR)),
        }
    }

    /// The prefix every full id in the scope starts with (empty for all).
    pub fn prefix(&self) -> String {
        match &self.tenant {
            Some(tenant) => format!("{tenant}{SEPARATOR}"),
            None => String::new(),
        }
    }
}

/// The tenant a full id belongs to, `None` for a bare id.
pub fn tenant_of(full_id: &str) -> Option<&str> {
    full_id.split_once(SEPARATOR).map(|(tenant, _)| tenant)
}

/// Checks a tenant name: 1 to 64 bytes of `[A-Za-z0-9._-]`.
pub fn check_tenant(field: &str, name: &str) -> Result<(), BadField> {
    if name.is_empty() {
        return Err(BadField::new(field, "tenant must not be empty"));
    }
    if name.len() > MAX_TENANT_BYTES {
        return Err(BadField::new(
            field,
            format!(
                "tenant must be at most {MAX_TENANT_BYTES} bytes; got {}",
                name.len()
            ),
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(BadField::new(
            field,
            format!("tenant may only contain A-Z, a-z, 0-9, '.', '_' and '-'; found {bad:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_its_own_sessions_by_bare_id_and_nothing_else() {
        let acme = Scope::tenant("acme");
        assert_eq!(acme.full_id("s1"), "acme/s1");
        assert_eq!(acme.local_id("acme/s1"), Some("s1"));
        assert_eq!(acme.local_id("acmex/s1"), None);
        assert_eq!(acme.local_id("acme"), None);
        assert_eq!(acme.local_id("s1"), None);
        assert_eq!(acme.local_id("beta/s1"), None);
        assert_eq!(acme.prefix(), "acme/");
    }

    #[test]
    fn every_session_is_in_the_scope_of_all() {
        let all = Scope::all();
        assert_eq!(all.full_id("acme/s1"), "acme/s1");
        assert_eq!(all.local_id("acme/s1"), Some("acme/s1"));
        assert_eq!(all.local_id("s1"), Some("s1"));
        assert_eq!(all.prefix(), "");
        assert_eq!(tenant_of("acme/s1"), Some("acme"));
        assert_eq!(tenant_of("s1"), None);
    }

    #[test]
    fn tenant_names_are_checked() {
        assert!(check_tenant("tenant", "acme-1.prod_x").is_ok());
        for bad in ["", "a/b", "a b", "a:b", &"x".repeat(65)] {
            assert!(check_tenant("tenant", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_actor_names_the_token_and_its_tenant() {
        let agent = Caller {
            token_id: Some(Arc::from("ci-bot")),
            tenant: Some(Arc::from("acme")),
            role: Role::Agent,
        };
        assert_eq!(agent.actor(), "ci-bot@acme");
        assert_eq!(Caller::open().actor(), "");
        assert_eq!(Caller::open().scope(), Scope::all());
    }

    #[test]
    fn an_operator_names_a_tenants_session_by_its_full_id() {
        let limits = crate::config::Limits::default();
        for good in ["s1", "acme/s1", "acme-1.x/agent:7"] {
            assert!(
                crate::validate::full_session_id("session_id", good, &limits).is_ok(),
                "{good}"
            );
        }
        for bad in ["", "/s1", "acme/", "acme/s/1", "a b/s1", "acme/s 1"] {
            let err = crate::validate::full_session_id("session_id", bad, &limits).expect_err(bad);
            assert_eq!(err.field, "session_id", "{bad}");
        }
        // A tenant's caller names bare ids only.
        assert!(crate::validate::session_id("session_id", "acme/s1", &limits).is_err());
    }

    #[test]
    fn errors_name_sessions_as_the_caller_knows_them() {
        use crate::error::ApiError;
        let acme = Scope::tenant("acme");
        let local = ApiError::SessionNotFound("acme/s1".into()).localized(&acme);
        assert!(matches!(&local, ApiError::SessionNotFound(id) if id == "s1"));
        let span = ApiError::SpanNotLive {
            session_id: "acme/s1".into(),
            span_id: 3,
        }
        .localized(&acme);
        assert!(!span.to_string().contains("acme"), "{span}");
        let parts = span.parts();
        assert_eq!(
            parts.metadata.get("session_id").map(String::as_str),
            Some("s1")
        );
        // An operator reads full ids.
        let full = ApiError::SessionNotFound("acme/s1".into()).localized(&Scope::all());
        assert!(matches!(&full, ApiError::SessionNotFound(id) if id == "acme/s1"));
    }
}
