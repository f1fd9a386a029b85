//! Per-tenant quotas: sessions held, text bytes stored, the admission rate
//! and open streams.
//!
//! A session's tenant is the part of its full id before the separator
//! (`tenant::tenant_of`); sessions with bare ids have no tenant and no
//! quota. Each tenant's quotas are the `[quota]` defaults with its
//! `[quota.tenants.NAME]` overrides over them (see
//! [`QuotaSettings::for_tenant`]); 0 is unlimited.
//!
//! The state of every tenant with a quota sits behind one mutex, held for
//! a hash lookup and a few arithmetic operations, never across an await;
//! a known tenant costs no allocation. What each quota counts:
//!
//! - **admissions**: a token bucket per tenant, `admits_per_second` refill
//!   and `admit_burst` size. A refusal's retry delay is when the bucket
//!   holds a whole token again.
//! - **sessions**: counted from the store (a prefix scan of the sessions
//!   tree for `tenant/`) the first time the tenant is seen, then kept by
//!   creates, imports and deletes.
//! - **stored bytes**: the UTF-8 bytes of span text the tenant's sessions
//!   hold, live and archived (`ctxbroker_store::text_bytes`): summed from
//!   the store the first time, then kept by every change the broker
//!   persists (a turn's spans, a compaction's summary, a compressed span)
//!   and by deletes. Text bytes, not the engine's bytes on disk: sled's
//!   pages mix sessions, so its bytes cannot be attributed to a session,
//!   and they move with its own compaction of the log, not with what the
//!   tenant did. A compaction is never refused for its summary, so a
//!   tenant can stand a summary's bytes above its quota; its admissions
//!   are then refused until it deletes sessions.
//! - **streams**: counted while held ([`StreamPermit`]).
//!
//! Sessions and bytes are freed only by a delete, so their refusals carry
//! a fixed retry delay ([`SESSIONS_RETRY`], [`BYTES_RETRY`]); a stream is
//! freed when another of the tenant's ends ([`STREAMS_RETRY`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxbroker_store::Store;

use crate::blocking;
use crate::config::{QuotaSettings, TenantQuota};
use crate::error::ApiError;
use crate::sessions::lock;
use crate::tenant::SEPARATOR;

/// The retry delay of a refusal at `max_sessions`: a slot is freed only
/// when the tenant deletes a session, which the refusal cannot foresee.
pub const SESSIONS_RETRY: Duration = Duration::from_secs(30);
/// The retry delay of a refusal at `max_stored_bytes`: bytes are freed only
/// by a delete, as for sessions.
pub const BYTES_RETRY: Duration = Duration::from_secs(30);
/// The retry delay of a refusal at `max_streams`: streams are long-lived,
/// but watchers reconnect, so a slot may come free soon.
pub const STREAMS_RETRY: Duration = Duration::from_secs(5);

/// Which quota refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// `max_sessions`.
    Sessions,
    /// `max_stored_bytes`.
    StoredBytes,
    /// `admits_per_second` (with `admit_burst`).
    AdmitRate,
    /// `max_streams`.
    Streams,
}

impl QuotaKind {
    /// The setting's key, as the metadata and the file name it.
    pub fn key(self) -> &'static str {
        match self {
            QuotaKind::Sessions => "max_sessions",
            QuotaKind::StoredBytes => "max_stored_bytes",
            QuotaKind::AdmitRate => "admits_per_second",
            QuotaKind::Streams => "max_streams",
        }
    }
}

impl fmt::Display for QuotaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// A token bucket, in admissions.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Takes one token at `now`, or says how long until one is there.
    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        if now > self.at {
            let elapsed = now.duration_since(self.at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(burst);
            self.at = now;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        // Rounded up to the nanosecond, so that a retry after it finds the
        // token.
        let nanos = ((1.0 - self.tokens) / rate * 1e9).ceil();
        Err(Duration::from_nanos(nanos.min(u64::MAX as f64) as u64))
    }
}

/// One tenant's quotas and what it holds.
#[derive(Debug)]
struct TenantState {
    limits: TenantQuota,
    /// The admission bucket; `None` when the rate is unlimited.
    bucket: Option<Bucket>,
    /// Sessions held (reservations included); `None` until counted from
    /// the store, or when unlimited (never counted).
    sessions: Option<u64>,
    /// Text bytes held (reservations included); as `sessions`.
    bytes: Option<u64>,
    /// Streams open.
    streams: u64,
}

impl TenantState {
    fn new(limits: TenantQuota, now: Instant) -> Self {
        let bucket = (limits.admits_per_second > 0.0).then(|| Bucket {
            tokens: burst(&limits),
            at: now,
        });
        TenantState {
            limits,
            bucket,
            sessions: None,
            bytes: None,
            streams: 0,
        }
    }

    /// Which counts the tenant's quotas need that are not counted yet.
    fn missing(&self) -> (bool, bool) {
        (
            self.limits.max_sessions > 0 && self.sessions.is_none(),
            self.limits.max_stored_bytes > 0 && self.bytes.is_none(),
        )
    }
}

/// The bucket's size: `admit_burst`, or one second's worth (at least 1).
fn burst(limits: &TenantQuota) -> f64 {
    if limits.admit_burst > 0 {
        limits.admit_burst as f64
    } else {
        limits.admits_per_second.ceil().max(1.0)
    }
}

/// Every tenant's quotas and counts.
pub struct Quotas {
    settings: QuotaSettings,
    /// No quota is set anywhere: every check passes at once.
    unlimited: bool,
    tenants: Mutex<HashMap<Arc<str>, TenantState>>,
}

impl fmt::Debug for Quotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quotas")
            .field("settings", &self.settings)
            .field("tenants", &lock(&self.tenants).len())
            .finish()
    }
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas::new(QuotaSettings::default())
    }
}

fn is_unlimited(q: &TenantQuota) -> bool {
    q.max_sessions == 0
        && q.max_stored_bytes == 0
        && q.admits_per_second == 0.0
        && q.max_streams == 0
}

impl Quotas {
    /// The quotas the settings give.
    pub fn new(settings: QuotaSettings) -> Self {
        let unlimited = is_unlimited(&settings.defaults())
            && settings
                .tenants
                .keys()
                .all(|name| is_unlimited(&settings.for_tenant(name)));
        Quotas {
            settings,
            unlimited,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// The quotas in force for `tenant`.
    pub fn limits(&self, tenant: &str) -> TenantQuota {
        self.settings.for_tenant(tenant)
    }

    /// Runs `f` on the tenant's state, made on first use; `None` (and
    /// `f` not run) when the tenant has no quota at all.
    fn with<T>(
        &self,
        tenant: &str,
        now: Instant,
        f: impl FnOnce(&Arc<str>, &mut TenantState) -> T,
    ) -> Option<T> {
        if self.unlimited {
            return None;
        }
        let mut tenants = lock(&self.tenants);
        if let Some((name, _)) = tenants.get_key_value(tenant) {
            let name = name.clone();
            let state = tenants.get_mut(tenant)?;
            return Some(f(&name, state));
        }
        let limits = self.settings.for_tenant(tenant);
        if is_unlimited(&limits) {
            return None;
        }
        let name: Arc<str> = Arc::from(tenant);
        let state = tenants
            .entry(name.clone())
            .or_insert_with(|| TenantState::new(limits, now));
        Some(f(&name, state))
    }

    /// Takes one admission from the tenant's bucket now; see
    /// [`Quotas::admit_at`].
    pub fn admit(&self, tenant: Option<&str>) -> Result<(), ApiError> {
        self.admit_at(tenant, Instant::now())
    }

    /// Takes one admission from the tenant's bucket at `now`, or refuses
    /// with the delay until the bucket holds one again. A session without
    /// a tenant always passes.
    pub fn admit_at(&self, tenant: Option<&str>, now: Instant) -> Result<(), ApiError> {
        let Some(tenant) = tenant else {
            return Ok(());
        };
        let refused = self.with(tenant, now, |_, state| {
            let rate = state.limits.admits_per_second;
            let size = burst(&state.limits);
            match state.bucket.as_mut() {
                Some(bucket) => bucket
                    .take(rate, size, now)
                    .err()
                    .map(|wait| (wait, rate, size)),
                None => None,
            }
        });
        match refused.flatten() {
            None => Ok(()),
            Some((retry_after, rate, size)) => Err(exceeded(
                tenant,
                QuotaKind::AdmitRate,
                rate.to_string(),
                retry_after,
                format!("admissions come faster than {rate} a second (bursts of {size})"),
            )),
        }
    }

    /// Counts what the tenant's quotas need from the store (its sessions,
    /// its text bytes), once: every change to a tenant's sessions calls it
    /// before it writes, so that no write the count misses can be in
    /// flight while it runs. Free for a tenant counted already or without
    /// such quotas.
    pub async fn load(&self, store: &Store, tenant: Option<&str>) -> Result<(), ApiError> {
        let Some(tenant) = tenant else {
            return Ok(());
        };
        let now = Instant::now();
        let Some((sessions, bytes)) = self.with(tenant, now, |_, state| state.missing()) else {
            return Ok(());
        };
        if !sessions && !bytes {
            return Ok(());
        }
        let prefix = format!("{tenant}{SEPARATOR}");
        let (sessions, bytes) = blocking::read(store, move |store| {
            let sessions = match sessions {
                true => Some(store.session_count_with_prefix(&prefix)?),
                false => None,
            };
            let bytes = match bytes {
                true => Some(store.text_bytes_with_prefix(&prefix)?),
                false => None,
            };
            Ok::<_, ctxbroker_store::StoreError>((sessions, bytes))
        })
        .await?;
        self.counted(tenant, sessions, bytes);
        Ok(())
    }

    /// Records the counts a store scan found, unless another scan's are
    /// in already.
    pub(crate) fn counted(&self, tenant: &str, sessions: Option<u64>, bytes: Option<u64>) {
        self.with(tenant, Instant::now(), |_, state| {
            let (want_sessions, want_bytes) = state.missing();
            if want_sessions {
                state.sessions = sessions;
            }
            if want_bytes {
                state.bytes = bytes;
            }
        });
    }

    /// Reserves a session slot for a create or an import, with the bytes
    /// it brings (0 for a new session). Dropped, the hold gives them back;
    /// [`Hold::keep`] once the session is written.
    pub fn reserve_session(&self, tenant: Option<&str>, bytes: u64) -> Result<Hold<'_>, ApiError> {
        self.reserve(tenant, 1, bytes)
    }

    /// Reserves `bytes` of text for a turn about to be admitted. Dropped,
    /// the hold gives them back; [`Quotas::settle`] turns them into the
    /// change's charge.
    pub fn reserve_bytes(&self, tenant: Option<&str>, bytes: u64) -> Result<Hold<'_>, ApiError> {
        self.reserve(tenant, 0, bytes)
    }

    /// Reserves `sessions` (0 or 1) session slots and `bytes` of text,
    /// checking both quotas first.
    fn reserve(
        &self,
        tenant: Option<&str>,
        sessions: u64,
        bytes: u64,
    ) -> Result<Hold<'_>, ApiError> {
        let Some(tenant) = tenant else {
            return Ok(Hold::none(self));
        };
        let outcome = self.with(tenant, Instant::now(), |name, state| {
            let limits = state.limits;
            if sessions > 0
                && let Some(held) = state.sessions
                && limits.max_sessions > 0
                && held >= limits.max_sessions
            {
                return Err(exceeded(
                    tenant,
                    QuotaKind::Sessions,
                    limits.max_sessions.to_string(),
                    SESSIONS_RETRY,
                    format!("it holds {held} sessions; delete one first"),
                ));
            }
            check_bytes(tenant, state, bytes)?;
            if let Some(held) = state.sessions.as_mut() {
                *held += sessions;
            }
            if let Some(held) = state.bytes.as_mut() {
                *held += bytes;
            }
            Ok(Hold {
                quotas: self,
                tenant: Some(name.clone()),
                sessions,
                bytes,
            })
        });
        outcome.unwrap_or_else(|| Ok(Hold::none(self)))
    }

    /// Charges a persisted change's text bytes (`delta`, negative when it
    /// shrank the text), less what `hold` reserved for it.
    pub fn settle(&self, tenant: Option<&str>, delta: i64, hold: Option<Hold<'_>>) {
        let reserved = hold.map_or(0, Hold::keep_bytes);
        let Some(tenant) = tenant else {
            return;
        };
        let delta = delta - i64::try_from(reserved).unwrap_or(i64::MAX);
        if delta == 0 {
            return;
        }
        self.with(tenant, Instant::now(), |_, state| {
            if let Some(held) = state.bytes.as_mut() {
                *held = held.saturating_add_signed(delta);
            }
        });
    }

    /// Whether the tenant's stored bytes are counted: worth computing a
    /// change's bytes for.
    pub fn counts_bytes(&self, tenant: Option<&str>) -> bool {
        match tenant {
            None => false,
            Some(tenant) => !self.unlimited && self.limits(tenant).max_stored_bytes > 0,
        }
    }

    /// A session and its text bytes were deleted.
    pub fn session_deleted(&self, tenant: Option<&str>, bytes: u64) {
        let Some(tenant) = tenant else {
            return;
        };
        self.with(tenant, Instant::now(), |_, state| {
            if let Some(held) = state.sessions.as_mut() {
                *held = held.saturating_sub(1);
            }
            if let Some(held) = state.bytes.as_mut() {
                *held = held.saturating_sub(bytes);
            }
        });
    }

    /// What the tenant holds as counted: (sessions, bytes, streams);
    /// `None` for counts not kept.
    pub fn usage(&self, tenant: &str) -> (Option<u64>, Option<u64>, u64) {
        self.with(tenant, Instant::now(), |_, s| {
            (s.sessions, s.bytes, s.streams)
        })
        .unwrap_or((None, None, 0))
    }

    /// Opens one of the tenant's streams, refused at its `max_streams`;
    /// the permit closes it when dropped. `None` (no tenant) is never
    /// refused.
    ///
    /// Must be called by the service where a stream starts, beside the
    /// server-wide stream permit and held for as long as it: in
    /// `AdmitStream` (moved into the stream's task with the server-wide
    /// permit) and in `WatchCompactions` (kept in the `WatchStream`), with
    /// the caller's tenant (`Caller::tenant`).
    pub fn open_stream(self: &Arc<Self>, tenant: Option<&str>) -> Result<StreamPermit, ApiError> {
        let Some(tenant) = tenant else {
            return Ok(StreamPermit { held: None });
        };
        let outcome = self.with(tenant, Instant::now(), |name, state| {
            let max = state.limits.max_streams;
            if max > 0 && state.streams >= max {
                return Err(exceeded(
                    tenant,
                    QuotaKind::Streams,
                    max.to_string(),
                    STREAMS_RETRY,
                    format!("it holds {} streams open", state.streams),
                ));
            }
            state.streams += 1;
            Ok(name.clone())
        });
        match outcome {
            None => Ok(StreamPermit { held: None }),
            Some(Err(err)) => Err(err),
            Some(Ok(name)) => Ok(StreamPermit {
                held: Some((self.clone(), name)),
            }),
        }
    }
}

fn check_bytes(tenant: &str, state: &TenantState, bytes: u64) -> Result<(), ApiError> {
    let max = state.limits.max_stored_bytes;
    match state.bytes {
        Some(held) if max > 0 && held.saturating_add(bytes) > max => Err(exceeded(
            tenant,
            QuotaKind::StoredBytes,
            max.to_string(),
            BYTES_RETRY,
            format!("it holds {held} bytes of text and the request brings {bytes}"),
        )),
        _ => Ok(()),
    }
}

fn exceeded(
    tenant: &str,
    quota: QuotaKind,
    limit: String,
    retry_after: Duration,
    detail: String,
) -> ApiError {
    ApiError::QuotaExceeded {
        tenant: tenant.to_owned(),
        quota,
        limit,
        retry_after,
        detail,
    }
}

/// Sessions or bytes reserved for a write not yet made: given back when
/// dropped, unless kept.
#[must_use = "a hold dropped at once gives its reservation back"]
pub struct Hold<'a> {
    quotas: &'a Quotas,
    tenant: Option<Arc<str>>,
    sessions: u64,
    bytes: u64,
}

impl fmt::Debug for Hold<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("tenant", &self.tenant)
            .field("sessions", &self.sessions)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl<'a> Hold<'a> {
    fn none(quotas: &'a Quotas) -> Self {
        Hold {
            quotas,
            tenant: None,
            sessions: 0,
            bytes: 0,
        }
    }

    /// The write was made: what was reserved is held for good.
    pub fn keep(mut self) {
        self.tenant = None;
    }

    /// As [`Hold::keep`], returning the bytes reserved.
    fn keep_bytes(mut self) -> u64 {
        let bytes = if self.tenant.is_some() { self.bytes } else { 0 };
        self.tenant = None;
        bytes
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let Some(tenant) = self.tenant.take() else {
            return;
        };
        let (sessions, bytes) = (self.sessions, self.bytes);
        self.quotas.with(&tenant, Instant::now(), |_, state| {
            if let Some(held) = state.sessions.as_mut() {
                *held = held.saturating_sub(sessions);
            }
            if let Some(held) = state.bytes.as_mut() {
                *held = held.saturating_sub(bytes);
            }
        });
    }
}

/// One open stream of a tenant, counted against its `max_streams` until
/// dropped.
pub struct StreamPermit {
    held: Option<(Arc<Quotas>, Arc<str>)>,
}

impl fmt::Debug for StreamPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamPermit")
            .field("tenant", &self.held.as_ref().map(|(_, t)| t))
            .finish()
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        if let Some((quotas, tenant)) = self.held.take() {
            quotas.with(&tenant, Instant::now(), |_, state| {
                state.streams = state.streams.saturating_sub(1);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tonic::Code;

    use super::*;
    use crate::config::QuotaOverride;

    fn settings(default: TenantQuota, overrides: &[(&str, QuotaOverride)]) -> QuotaSettings {
        QuotaSettings {
            max_sessions: default.max_sessions,
            max_stored_bytes: default.max_stored_bytes,
            admits_per_second: default.admits_per_second,
            admit_burst: default.admit_burst,
            max_streams: default.max_streams,
            tenants: overrides
                .iter()
                .map(|(name, o)| ((*name).to_owned(), o.clone()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn refused(result: Result<impl fmt::Debug, ApiError>) -> (QuotaKind, String, Duration) {
        match result {
            Err(ApiError::QuotaExceeded {
                quota,
                limit,
                retry_after,
                ..
            }) => (quota, limit, retry_after),
            other => panic!("expected a quota refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_bucket_refills_at_its_rate_and_says_exactly_when() {
        let quotas = Quotas::new(settings(
            TenantQuota {
                admits_per_second: 2.0,
                admit_burst: 3,
                ..TenantQuota::default()
            },
            &[],
        ));
        let t0 = Instant::now();
        let acme = Some("acme");
        for _ in 0..3 {
            quotas.admit_at(acme, t0).unwrap();
        }
        let (kind, limit, wait) = refused(quotas.admit_at(acme, t0));
        assert_eq!(kind, QuotaKind::AdmitRate);
        assert_eq!(limit, "2");
        assert_eq!(wait, Duration::from_millis(500));
        // Halfway there: half the wait is left, and nothing was taken.
        let (_, _, wait) = refused(quotas.admit_at(acme, t0 + Duration::from_millis(250)));
        assert_eq!(wait, Duration::from_millis(250));
        quotas
            .admit_at(acme, t0 + Duration::from_millis(500))
            .unwrap();
        let (_, _, wait) = refused(quotas.admit_at(acme, t0 + Duration::from_millis(500)));
        assert_eq!(wait, Duration::from_millis(500));
        // A long quiet spell refills to the burst, no more.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            quotas.admit_at(acme, later).unwrap();
        }
        assert!(quotas.admit_at(acme, later).is_err());
        // Another tenant has its own bucket.
        quotas.admit_at(Some("beta"), t0).unwrap();
    }

    #[test]
    fn a_fractional_rate_with_no_burst_allows_one_at_a_time() {
        let quotas = Quotas::new(settings(
            TenantQuota {
                admits_per_second: 0.5,
                ..TenantQuota::default()
            },
            &[],
        ));
        let t0 = Instant::now();
        quotas.admit_at(Some("acme"), t0).unwrap();
        let (_, limit, wait) = refused(quotas.admit_at(Some("acme"), t0));
        assert_eq!(limit, "0.5");
        assert_eq!(wait, Duration::from_secs(2));
        quotas
            .admit_at(Some("acme"), t0 + Duration::from_secs(2))
            .unwrap();
    }

    #[test]
    fn sessions_without_a_tenant_have_no_quota() {
        let quotas = Arc::new(Quotas::new(settings(
            TenantQuota {
                max_sessions: 1,
                max_stored_bytes: 1,
                admits_per_second: 0.001,
                admit_burst: 1,
                max_streams: 1,
            },
            &[],
        )));
        let t0 = Instant::now();
        let mut permits = Vec::new();
        for _ in 0..10 {
            quotas.admit_at(None, t0).unwrap();
            quotas.reserve_session(None, 100).unwrap().keep();
            quotas.reserve_bytes(None, 100).unwrap().keep();
            permits.push(quotas.open_stream(None).unwrap());
        }
        assert!(lock(&quotas.tenants).is_empty());
    }

    #[test]
    fn sessions_and_bytes_are_counted_and_reservations_given_back() {
        let quotas = Quotas::new(settings(
            TenantQuota {
                max_sessions: 2,
                max_stored_bytes: 100,
                ..TenantQuota::default()
            },
            &[],
        ));
        let acme = Some("acme");
        // The store held one session of 40 bytes.
        quotas.counted("acme", Some(1), Some(40));
        // A create that fails gives its slot back.
        drop(quotas.reserve_session(acme, 0).unwrap());
        assert_eq!(quotas.usage("acme"), (Some(1), Some(40), 0));
        // An import of 50 bytes takes the second slot.
        quotas.reserve_session(acme, 50).unwrap().keep();
        assert_eq!(quotas.usage("acme"), (Some(2), Some(90), 0));
        let (kind, limit, wait) = refused(quotas.reserve_session(acme, 0));
        assert_eq!(
            (kind, limit.as_str(), wait),
            (QuotaKind::Sessions, "2", SESSIONS_RETRY)
        );
        // 10 more bytes fit, 11 do not.
        let (kind, limit, wait) = refused(quotas.reserve_bytes(acme, 11));
        assert_eq!(
            (kind, limit.as_str(), wait),
            (QuotaKind::StoredBytes, "100", BYTES_RETRY)
        );
        let hold = quotas.reserve_bytes(acme, 10).unwrap();
        assert_eq!(quotas.usage("acme"), (Some(2), Some(100), 0));
        // The turn was admitted with a summary of 5 bytes: charged on top.
        quotas.settle(acme, 15, Some(hold));
        assert_eq!(quotas.usage("acme"), (Some(2), Some(105), 0));
        // A compression that shrank the text gives bytes back.
        quotas.settle(acme, -5, None);
        assert_eq!(quotas.usage("acme"), (Some(2), Some(100), 0));
        // A refused turn gives its reservation back.
        quotas.session_deleted(acme, 60);
        let hold = quotas.reserve_bytes(acme, 30).unwrap();
        assert_eq!(quotas.usage("acme"), (Some(1), Some(70), 0));
        drop(hold);
        assert_eq!(quotas.usage("acme"), (Some(1), Some(40), 0));
        // A later scan does not overwrite the kept counts.
        quotas.counted("acme", Some(9), Some(9));
        assert_eq!(quotas.usage("acme"), (Some(1), Some(40), 0));
    }

    #[test]
    fn a_tenants_override_beats_the_default() {
        let quotas = Arc::new(Quotas::new(settings(
            TenantQuota {
                max_streams: 1,
                max_sessions: 1,
                ..TenantQuota::default()
            },
            &[
                (
                    "big",
                    QuotaOverride {
                        max_streams: Some(3),
                        max_sessions: Some(0),
                        ..QuotaOverride::default()
                    },
                ),
                (
                    "free",
                    QuotaOverride {
                        max_streams: Some(0),
                        max_sessions: Some(0),
                        ..QuotaOverride::default()
                    },
                ),
            ],
        )));
        let small = quotas.open_stream(Some("small")).unwrap();
        assert_eq!(
            refused(quotas.open_stream(Some("small"))).0,
            QuotaKind::Streams
        );
        let big: Vec<_> = (0..3)
            .map(|_| quotas.open_stream(Some("big")).unwrap())
            .collect();
        let (kind, limit, wait) = refused(quotas.open_stream(Some("big")));
        assert_eq!(
            (kind, limit.as_str(), wait),
            (QuotaKind::Streams, "3", STREAMS_RETRY)
        );
        // 0 in an override lifts the default; a tenant with no quota at
        // all is not even tracked.
        let free: Vec<_> = (0..10)
            .map(|_| quotas.open_stream(Some("free")).unwrap())
            .collect();
        quotas.counted("big", Some(7), None);
        quotas.reserve_session(Some("big"), 0).unwrap().keep();
        assert_eq!(quotas.usage("big"), (None, None, 3));
        assert_eq!(quotas.usage("free"), (None, None, 0));
        drop((small, big, free));
    }

    #[test]
    fn a_stream_permit_is_given_back_when_dropped() {
        let quotas = Arc::new(Quotas::new(settings(
            TenantQuota {
                max_streams: 2,
                ..TenantQuota::default()
            },
            &[],
        )));
        let first = quotas.open_stream(Some("acme")).unwrap();
        let second = quotas.open_stream(Some("acme")).unwrap();
        assert!(quotas.open_stream(Some("acme")).is_err());
        assert_eq!(quotas.usage("acme").2, 2);
        drop(first);
        assert_eq!(quotas.usage("acme").2, 1);
        let third = quotas.open_stream(Some("acme")).unwrap();
        drop((second, third));
        assert_eq!(quotas.usage("acme").2, 0);
    }

    #[test]
    fn a_refusal_carries_quota_failure_retry_info_and_error_info() {
        use tonic_types::StatusExt;
        let err = exceeded(
            "acme",
            QuotaKind::AdmitRate,
            "2".into(),
            Duration::from_millis(250),
            "too fast".into(),
        );
        let status: tonic::Status = err.into();
        assert_eq!(status.code(), Code::ResourceExhausted);
        let details = status.get_error_details();
        let info = details.error_info().unwrap();
        assert_eq!(info.reason, crate::error::reason::QUOTA_EXCEEDED);
        assert_eq!(info.metadata["tenant"], "acme");
        assert_eq!(info.metadata["quota"], "admits_per_second");
        assert_eq!(info.metadata["limit"], "2");
        let failure = details.quota_failure().unwrap();
        assert_eq!(failure.violations.len(), 1);
        assert_eq!(failure.violations[0].subject, "acme");
        assert!(
            failure.violations[0]
                .description
                .contains("admits_per_second of 2"),
            "{failure:?}"
        );
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_millis(250))
        );
    }
}

/// The quotas as the broker enforces them, over a real store.
#[cfg(test)]
mod broker_tests {
    use std::sync::Arc;

    use ctxbroker_core::SessionConfig;
    use ctxbroker_proto::v1 as pb;
    use ctxbroker_store::{Store, StoreOptions};

    use super::*;
    use crate::broker::{Broker, TurnSpan};
    use crate::config::{Limits, QuotaSettings};

    fn broker(store: &Store, quota: QuotaSettings) -> Broker {
        Broker::new(store.clone(), Limits::default()).with_quotas(Arc::new(Quotas::new(quota)))
    }

    fn turn(text: &str, key: &str) -> Vec<TurnSpan> {
        crate::convert::turn_from_pb(vec![pb::SpanInput {
            role: pb::Role::Tool as i32,
            text: text.to_owned(),
            idempotency_key: key.to_owned(),
            ..Default::default()
        }])
    }

    fn config() -> SessionConfig {
        SessionConfig::with_window(100_000)
    }

    fn quota_of(err: ApiError) -> (QuotaKind, Duration) {
        match err {
            ApiError::QuotaExceeded {
                quota, retry_after, ..
            } => (quota, retry_after),
            other => panic!("expected a quota refusal, got {other}"),
        }
    }

    async fn stored_bytes(store: &Store, prefix: &str) -> u64 {
        let prefix = prefix.to_owned();
        crate::blocking::read(store, move |s| s.text_bytes_with_prefix(&prefix))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_create_over_the_session_quota_is_refused_and_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let broker = broker(
            &store,
            QuotaSettings {
                max_sessions: 2,
                ..QuotaSettings::default()
            },
        );
        for id in ["acme/s1", "acme/s2"] {
            broker.create_session(id, config()).await.unwrap();
        }
        let err = broker
            .create_session("acme/s3", config())
            .await
            .unwrap_err();
        assert_eq!(quota_of(err), (QuotaKind::Sessions, SESSIONS_RETRY));
        assert_eq!(store.session_count(), 2);
        assert!(matches!(
            broker.session("acme/s3").await,
            Err(ApiError::SessionNotFound(_))
        ));
        // Another tenant and the bare ids are not touched by acme's quota.
        for id in ["beta/x", "beta/y", "bare1", "bare2", "bare3"] {
            broker.create_session(id, config()).await.unwrap();
        }
        // A taken id is refused as such, not for the quota.
        assert!(matches!(
            broker.create_session("acme/s1", config()).await,
            Err(ApiError::SessionExists(_))
        ));
        // A delete frees the slot.
        broker.delete_session("acme/s1").await.unwrap();
        broker.create_session("acme/s3", config()).await.unwrap();
        assert_eq!(broker.quotas().usage("acme").0, Some(2));
    }

    #[tokio::test]
    async fn a_turn_over_the_bytes_quota_changes_nothing_and_a_delete_frees_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let broker = broker(
            &store,
            QuotaSettings {
                max_stored_bytes: 100,
                ..QuotaSettings::default()
            },
        );
        broker.create_session("acme/a", config()).await.unwrap();
        broker.create_session("acme/b", config()).await.unwrap();
        broker
            .admit("acme/a", turn(&"x".repeat(60), "k1"))
            .await
            .unwrap();
        let before = broker.session("acme/b").await.unwrap();
        let err = broker
            .admit("acme/b", turn(&"y".repeat(41), "k2"))
            .await
            .unwrap_err();
        assert_eq!(quota_of(err), (QuotaKind::StoredBytes, BYTES_RETRY));
        // Nothing changed: no turn, no span, no key.
        assert_eq!(broker.session("acme/b").await.unwrap(), before);
        let keys = crate::blocking::read(&store, |s| s.spans_by_keys("acme/b", &["k2".into()]))
            .await
            .unwrap();
        assert_eq!(keys, [None]);
        assert_eq!(broker.quotas().usage("acme").1, Some(60));
        // 40 fit exactly; a replay of k1 stores nothing and passes even at
        // the quota.
        broker
            .admit("acme/b", turn(&"y".repeat(40), "k2"))
            .await
            .unwrap();
        let replay = broker
            .admit("acme/a", turn(&"x".repeat(60), "k1"))
            .await
            .unwrap();
        assert!(replay.replayed);
        assert_eq!(broker.quotas().usage("acme").1, Some(100));
        // Bare ids and other tenants are not held to it.
        broker.create_session("free", config()).await.unwrap();
        broker
            .admit("free", turn(&"z".repeat(500), ""))
            .await
            .unwrap();
        broker.create_session("beta/x", config()).await.unwrap();
        broker
            .admit("beta/x", turn(&"z".repeat(99), ""))
            .await
            .unwrap();
        // A delete gives the session's bytes back.
        broker.delete_session("acme/a").await.unwrap();
        assert_eq!(broker.quotas().usage("acme").1, Some(40));
        broker
            .admit("acme/b", turn(&"w".repeat(60), ""))
            .await
            .unwrap();
        assert_eq!(stored_bytes(&store, "acme/").await, 100);
    }

    #[tokio::test]
    async fn a_flood_gets_its_burst_then_a_retry_delay_and_spends_no_turn() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let broker = broker(
            &store,
            QuotaSettings {
                admits_per_second: 1.0,
                admit_burst: 3,
                ..QuotaSettings::default()
            },
        );
        broker.create_session("acme/s", config()).await.unwrap();
        for i in 0..3 {
            broker
                .admit("acme/s", turn(&format!("turn {i}"), &format!("k{i}")))
                .await
                .unwrap();
        }
        let before = broker.session("acme/s").await.unwrap();
        let err = broker
            .admit("acme/s", turn("turn 3", "k3"))
            .await
            .unwrap_err();
        let (kind, wait) = quota_of(err);
        assert_eq!(kind, QuotaKind::AdmitRate);
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert_eq!(broker.session("acme/s").await.unwrap(), before);
        let keys = crate::blocking::read(&store, |s| s.spans_by_keys("acme/s", &["k3".into()]))
            .await
            .unwrap();
        assert_eq!(keys, [None]);
        // Another tenant and a bare id are served meanwhile.
        for (id, turns) in [("beta/x", 3), ("bare", 10)] {
            broker.create_session(id, config()).await.unwrap();
            for i in 0..turns {
                broker
                    .admit(id, turn(&format!("turn {i}"), ""))
                    .await
                    .unwrap();
            }
        }
    }

    /// The counts kept by the broker stay equal to what a scan of the
    /// store finds, through admissions that compact (summaries), an
    /// import and a delete; a broker started over the store counts the
    /// same from it.
    #[tokio::test]
    async fn kept_counts_match_the_store_through_compactions_imports_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let quota = QuotaSettings {
            max_sessions: 100,
            max_stored_bytes: 1 << 30,
            ..QuotaSettings::default()
        };
        let first = broker(&store, quota.clone());
        for id in ["acme/a", "acme/b"] {
            first
                .create_session(id, SessionConfig::with_window(400))
                .await
                .unwrap();
        }
        let mut n = 0;
        while first.session("acme/a").await.unwrap().marker_count < 3 {
            n += 1;
            let text = format!("tool run {n}: {}", "build output line ".repeat(12));
            first.admit("acme/a", turn(&text, "")).await.unwrap();
            first.admit("acme/b", turn(&text, "")).await.unwrap();
        }
        let (sessions, bytes, _) = first.quotas().usage("acme");
        assert_eq!(sessions, Some(2));
        assert_eq!(bytes, Some(stored_bytes(&store, "acme/").await));

        // Export a and import it on another server: the import brings
        // its bytes. (Through the broker: the service's id checks are not
        // what is tested here.)
        let exported = crate::blocking::read(&store, |s| s.export_session("acme/a"))
            .await
            .unwrap();
        let other_dir = tempfile::tempdir().unwrap();
        let other_store = Store::open(other_dir.path(), StoreOptions::default()).unwrap();
        let other = broker(&other_store, quota.clone());
        let import = ctxbroker_store::SessionImport::open(
            exported.format_version,
            &exported.session_id,
            &exported.body,
            exported.checksum,
        )
        .unwrap();
        let session = ctxbroker_core::session::Session::new(
            import.record().clone(),
            import.live_spans().to_vec(),
        );
        let text_bytes = import.text_bytes();
        let writer = other_store.clone();
        other
            .adopt_session(session, text_bytes, async move {
                writer.import_session(import).await
            })
            .await
            .unwrap();
        let imported = stored_bytes(&other_store, "acme/").await;
        assert!(imported > 0);
        assert_eq!(other.quotas().usage("acme"), (Some(1), Some(imported), 0));

        first.delete_session("acme/b").await.unwrap();
        let (sessions, bytes, _) = first.quotas().usage("acme");
        assert_eq!(sessions, Some(1));
        assert_eq!(bytes, Some(stored_bytes(&store, "acme/").await));
        assert_eq!(bytes, Some(imported));

        // A fresh broker counts the same from the store.
        let second = broker(&store, quota);
        second.create_session("acme/d", config()).await.unwrap();
        assert_eq!(second.quotas().usage("acme"), (Some(2), bytes, 0));
    }
}
