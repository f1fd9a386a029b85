//! Build metadata for `GetServerInfo`: the git commit the binary was built
//! from and a digest of the wire contract in `proto/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let proto = root.join("proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    // Re-run when HEAD moves, so the commit stays true.
    for git_file in [".git/HEAD", ".git/index"] {
        let path = root.join(git_file);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }

    println!("cargo:rustc-env=CTXBROKER_GIT_COMMIT={}", git_commit(&root));
    println!(
        "cargo:rustc-env=CTXBROKER_CONTRACT_DIGEST={}",
        contract_digest(&proto)
    );
}

/// The commit of the checkout, with "-dirty" when the work tree differs;
/// "unknown" outside a checkout.
fn git_commit(root: &Path) -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    match run(&["rev-parse", "HEAD"]) {
        Some(commit) if !commit.is_empty() => {
            // Without optional locks, git leaves the index as it is: a
            // refreshed index would make the next build run this script
            // again and rebuild the binary, which for a release build
            // means the whole link-time optimisation again.
            let dirty = run(&[
                "--no-optional-locks",
                "status",
                "--porcelain",
                "--untracked-files=no",
            ])
            .is_some_and(|status| !status.is_empty());
            if dirty {
                format!("{commit}-dirty")
            } else {
                commit
            }
        }
        _ => "unknown".to_owned(),
    }
}

/// SHA-256 over every `.proto` file under `dir`, in path order, each as its
/// relative path, a NUL, its bytes and a NUL: the same contract always gives
/// the same digest, and any change to it gives another.
fn contract_digest(dir: &Path) -> String {
    let mut files = Vec::new();
    collect_protos(dir, &mut files);
    files.sort();
    let mut hasher = Sha256::new();
    for file in &files {
        let relative = file.strip_prefix(dir).unwrap_or(file);
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update([0]);
        match std::fs::read(file) {
            Ok(bytes) => hasher.update(&bytes),
            Err(err) => panic!("cannot read {}: {err}", file.display()),
        }
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())
}

fn collect_protos(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_protos(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "proto") {
            files.push(path);
        }
    }
}
