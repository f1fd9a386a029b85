//! The tower service timing `ContextBroker` calls into
//! `ctxbroker_rpc_duration_seconds`, by method and gRPC code.
//!
//! Latency is measured from the request's arrival at the service to its
//! response headers: for a unary call the whole handler, for a stream its
//! opening. A call dropped before it answered (client gone, or the
//! request timeout) counts as `CANCELLED`, or `DEADLINE_EXCEEDED` when its
//! deadline had passed. Only the (method, code) pairs that happened are
//! written: 18 methods × 17 codes of zeros would drown the rest.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use prost::Message as _;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use super::Metrics;

/// RPC latency buckets, in seconds: 250 µs to 10 s.
const RPC_BUCKETS: [f64; 15] = [
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The path prefix of the service whose calls are timed.
const PREFIX: &str = "/ctxbroker.v1.ContextBroker/";
/// The gRPC status codes, by number.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];
const CODE_UNKNOWN: usize = 2;
const CODE_CANCELLED: usize = 1;
const CODE_DEADLINE_EXCEEDED: usize = 4;

/// `method` and `code`.
type RpcLabels = [(&'static str, &'static str); 2];

/// The contract's methods, read once.
static METHODS: LazyLock<Vec<String>> = LazyLock::new(contract_methods);

/// Latency of the contract's RPCs, by method and status code.
#[derive(Debug)]
pub(super) struct RpcTable {
    /// The contract's methods; index `methods.len()` is `other`.
    methods: &'static [String],
    /// A series is created on its (method, code) pair's first call.
    family: Family<RpcLabels, Histogram, fn() -> Histogram>,
}

impl RpcTable {
    /// The table, its family registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> RpcTable {
        let family: Family<RpcLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(RPC_BUCKETS));
        registry.register(
            "ctxbroker_rpc_duration_seconds",
            "ContextBroker calls from arrival to response headers (a stream: until it opened), by method and gRPC code",
            family.clone(),
        );
        RpcTable {
            methods: &METHODS,
            family,
        }
    }

    pub(super) fn method_index(&self, path: &str) -> usize {
        path.strip_prefix(PREFIX)
            .and_then(|name| self.methods.iter().position(|m| m == name))
            .unwrap_or(self.methods.len())
    }

    fn method_name(&self, index: usize) -> &'static str {
        self.methods.get(index).map_or("other", String::as_str)
    }

    pub(super) fn observe(&self, method: usize, code: usize, elapsed: Duration) {
        if let Some(code) = CODES.get(code) {
            let labels = [("method", self.method_name(method)), ("code", *code)];
            self.family
                .get_or_create(&labels)
                .observe(elapsed.as_secs_f64());
        }
    }
}

/// The RPC names of `ContextBroker`, from the contract's descriptor set.
fn contract_methods() -> Vec<String> {
    let Ok(set) = prost_types::FileDescriptorSet::decode(ctxbroker_proto::FILE_DESCRIPTOR_SET)
    else {
        return Vec::new();
    };
    set.file
        .iter()
        .filter(|file| file.package() == "ctxbroker.v1")
        .flat_map(|file| &file.service)
        .filter(|service| service.name() == "ContextBroker")
        .flat_map(|service| &service.method)
        .map(|method| method.name().to_owned())
        .collect()
}

/// A `ContextBroker` service whose calls are timed into
/// `ctxbroker_rpc_duration_seconds`.
#[derive(Debug, Clone)]
pub struct Timed<S> {
    inner: S,
    metrics: Arc<Metrics>,
    /// The server's own request timeout: a call dropped after it counts as
    /// DEADLINE_EXCEEDED.
    timeout: Duration,
}

impl<S> Timed<S> {
    /// Times `inner`'s calls; `timeout` is the server's request timeout.
    pub fn new(inner: S, metrics: Arc<Metrics>, timeout: Duration) -> Timed<S> {
        Timed {
            inner,
            metrics,
            timeout,
        }
    }
}

impl<S: NamedService> NamedService for Timed<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Timed<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = TimedCall<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = self.metrics.rpc.method_index(request.uri().path());
        let deadline = request
            .headers()
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .and_then(grpc_timeout)
            .map_or(self.timeout, |client| client.min(self.timeout));
        TimedCall {
            inner: self.inner.call(request),
            metrics: self.metrics.clone(),
            method,
            started: Instant::now(),
            deadline,
            done: false,
        }
    }
}

/// A timed call in flight.
#[derive(Debug)]
pub struct TimedCall<F> {
    inner: F,
    metrics: Arc<Metrics>,
    method: usize,
    started: Instant,
    deadline: Duration,
    done: bool,
}

impl<F, R, E> Future for TimedCall<F>
where
    F: Future<Output = Result<http::Response<R>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let result = match Pin::new(&mut this.inner).poll(cx) {
            Poll::Ready(result) => result,
            Poll::Pending => return Poll::Pending,
        };
        let code = match &result {
            // A handler's error is a trailers-only response: its status is
            // in the headers. Without one, the call succeeded.
            Ok(response) => response
                .headers()
                .get("grpc-status")
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<usize>().ok())
                .filter(|&code| code < CODES.len())
                .unwrap_or(0),
            Err(_) => CODE_UNKNOWN,
        };
        this.done = true;
        this.metrics
            .rpc
            .observe(this.method, code, this.started.elapsed());
        Poll::Ready(result)
    }
}

impl<F> Drop for TimedCall<F> {
    fn drop(&mut self) {
        if !self.done {
            let elapsed = self.started.elapsed();
            let code = if elapsed >= self.deadline {
                CODE_DEADLINE_EXCEEDED
            } else {
                CODE_CANCELLED
            };
            self.metrics.rpc.observe(self.method, code, elapsed);
        }
    }
}

/// A `grpc-timeout` header: up to 8 digits and a unit.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let unit_at = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(unit_at);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn rpc_methods_come_from_the_contract() {
        let table = RpcTable::register(&mut Registry::default());
        assert!(table.methods.iter().any(|m| m == "Admit"));
        assert!(table.methods.iter().any(|m| m == "WatchCompactions"));
        let admit = table.method_index("/ctxbroker.v1.ContextBroker/Admit");
        assert_eq!(table.method_name(admit), "Admit");
        let other = table.method_index("/ctxbroker.v1.ContextBroker/NoSuchThing");
        assert_eq!(table.method_name(other), "other");
        assert_eq!(table.method_index("/grpc.health.v1.Health/Check"), other);
    }

    #[test]
    fn grpc_timeouts_parse_and_nonsense_does_not() {
        assert_eq!(grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("m"), None);
        assert_eq!(grpc_timeout(""), None);
        assert_eq!(grpc_timeout("123456789S"), None);
        assert_eq!(grpc_timeout("10x"), None);
    }

    #[test]
    fn code_names_follow_the_grpc_numbering() {
        assert_eq!(
            CODES[tonic::Code::FailedPrecondition as usize],
            "FAILED_PRECONDITION"
        );
        assert_eq!(
            CODES[tonic::Code::Unauthenticated as usize],
            "UNAUTHENTICATED"
        );
        assert_eq!(CODES[CODE_CANCELLED], "CANCELLED");
        assert_eq!(CODES[CODE_DEADLINE_EXCEEDED], "DEADLINE_EXCEEDED");
        assert_eq!(CODES[CODE_UNKNOWN], "UNKNOWN");
    }
}
