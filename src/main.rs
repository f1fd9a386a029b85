//! `ctxbrokerd`: the ctxbroker daemon. Parses its flags and hands over to
//! `ctxbroker-server`, which tests drive the same way.

use std::process::ExitCode;

use ctxbroker_server::BuildInfo;

/// jemalloc rather than the system's malloc: on the storage run
/// (docs/benchmarks.md), with the options below, it held less than glibc
/// capped at two arenas after populating and once serving after a restart,
/// and as much after reading every session back; compactions, admissions
/// and the read-back were faster.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts, before `main`: two arenas
/// (by default four per core, each keeping pages it freed), and freed
/// pages returned to the system after one second instead of ten. The
/// `_RJEM_MALLOC_CONF` environment variable is read after these and
/// overrides them.
#[allow(unsafe_code)]
// SAFETY: jemalloc reads this symbol as a `const char *` to a
// NUL-terminated string and never writes through it; a `&[u8; N]` is
// such a pointer, and the bytes end in NUL.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; 30] = b"narenas:2,dirty_decay_ms:1000\0";

fn main() -> ExitCode {
    let build = BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        git_commit: env!("CTXBROKER_GIT_COMMIT"),
        contract_digest: env!("CTXBROKER_CONTRACT_DIGEST"),
    };
    ctxbroker_server::main_with_args(std::env::args_os(), build)
}
