//! The data directory is private: created 0700, its files 0600, and a
//! directory others may write to is refused before anything is served.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use ctxbroker_proto::v1 as pb;

use crate::support::{Daemon, admit, create, refused_start, span, window};

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// Every file and directory under `dir`, `dir` included.
fn tree(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if all[i].is_dir() {
            let entries: Vec<_> = std::fs::read_dir(&all[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            all.extend(entries);
        }
        i += 1;
    }
    all
}

#[tokio::test]
async fn the_data_directory_is_0700_and_its_files_0600() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "private", window(10_000)).await;
    admit(
        &mut client,
        "private",
        vec![span(
            pb::Role::User,
            "the staging password is in vault, never paste it",
        )],
    )
    .await
    .unwrap();
    daemon.restart().await;
    let dir = daemon.data_dir().to_path_buf();
    assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    let files = tree(&dir);
    assert!(files.len() > 2, "the store wrote files: {files:?}");
    for path in files {
        let m = mode(&path);
        if path.is_dir() {
            assert_eq!(m & 0o077, 0, "{} is {m:04o}", path.display());
        } else {
            assert_eq!(m, 0o600, "{} is {m:04o}", path.display());
        }
    }
}

#[test]
fn a_data_directory_others_may_write_to_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(&dir);
    let (status, stderr) = refused_start(command, "the daemon started on a 0777 data directory");
    assert!(!status.success(), "exit status {status:?}");
    assert!(
        stderr.contains("writable by its group or by others (mode 0777)"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing written"
    );
    assert_eq!(mode(&dir), 0o777);
}
