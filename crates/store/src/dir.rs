//! The data directory is private to the user the daemon runs as.
//!
//! Sessions hold what agents were told and what their tools printed:
//! instructions, code, credentials pasted into a chat. So the directory is
//! created `0700`, and an existing one is refused when another user owns
//! it or when others may write to it (they could replace its files). One
//! that others may only read, as earlier versions created it, is tightened
//! to `0700` and its files to `0600`, with a warning. New files get
//! `0600` from the daemon's umask (`077`, set at start).

use std::path::Path;

use crate::error::StoreError;

/// Permission bits that let anyone but the owner in.
#[cfg(unix)]
const OTHERS: u32 = 0o077;
/// Permission bits that let anyone but the owner write.
#[cfg(unix)]
const OTHERS_WRITE: u32 = 0o022;

/// Creates `dir` (`0700`, with any missing parents) or checks an existing
/// one: owned by this process's effective user, writable by nobody else.
/// An existing directory others may read is made private, with its files.
#[cfg(unix)]
pub(crate) fn make_private(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};

    let io = |what: &str, e: std::io::Error| {
        StoreError::Io(format!("data directory {}: {what}: {e}", dir.display()))
    };
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io("creating it", e))?;
            return Ok(());
        }
        Err(e) => return Err(io("reading its metadata", e)),
    };
    if !meta.is_dir() {
        return Err(StoreError::Io(format!(
            "data directory {} is not a directory",
            dir.display()
        )));
    }
    let euid = effective_uid();
    if meta.uid() != euid {
        return Err(StoreError::Io(format!(
            "data directory {} is owned by uid {}, not by the daemon's user (uid {euid}); \
             give it to that user (chown) or choose another directory",
            dir.display(),
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & OTHERS_WRITE != 0 {
        return Err(StoreError::Io(format!(
            "data directory {} is writable by its group or by others (mode {mode:04o}); \
             run `chmod 700 {}` or choose another directory",
            dir.display(),
            dir.display()
        )));
    }
    if mode & OTHERS != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("making it private", e))?;
        let files = tighten_files(dir).map_err(|e| io("making its files private", e))?;
        tracing::warn!(
            dir = %dir.display(),
            was = %format!("{mode:04o}"),
            files,
            "the data directory was readable by others: made it 0700 and its files 0600"
        );
    }
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn make_private(dir: &Path) -> Result<(), StoreError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| StoreError::Io(format!("creating {}: {e}", dir.display())))
}

/// Removes every permission but the owner's from the files and
/// directories under `dir`; returns how many it changed. Symbolic links
/// are left alone (the engine makes none).
#[cfg(unix)]
fn tighten_files(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::PermissionsExt;

    let mut changed = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.is_dir() {
                pending.push(entry.path());
            }
            let mode = meta.permissions().mode() & 0o7777;
            if mode & OTHERS != 0 {
                let private = mode & !OTHERS;
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(private))?;
                changed += 1;
            }
        }
    }
    Ok(changed)
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory
    // of ours.
    unsafe { libc::geteuid() }
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        match std::fs::metadata(path) {
            Ok(meta) => meta.permissions().mode() & 0o7777,
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }

    #[test]
    fn a_new_directory_is_created_private_with_its_parents() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a").join("data");
        make_private(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn a_directory_others_may_write_is_refused_and_left_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        for bad in [0o770, 0o707, 0o777, 0o720] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(bad)).unwrap();
            let err = make_private(&dir).unwrap_err().to_string();
            assert!(err.contains("writable by its group or by others"), "{err}");
            assert!(err.contains(&format!("{bad:04o}")), "{err}");
            assert!(err.contains("chmod 700"), "{err}");
            assert_eq!(mode(&dir), bad);
        }
    }

    #[test]
    fn a_directory_others_may_read_is_made_private_with_its_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir_all(dir.join("blobs")).unwrap();
        std::fs::write(dir.join("db"), b"x").unwrap();
        std::fs::write(dir.join("blobs").join("1"), b"y").unwrap();
        std::fs::set_permissions(dir.join("db"), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(dir.join("blobs"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        make_private(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("db")), 0o600);
        assert_eq!(mode(&dir.join("blobs")), 0o700);
        assert_eq!(mode(&dir.join("blobs").join("1")) & 0o077, 0);
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("data");
        std::fs::write(&file, b"").unwrap();
        let err = make_private(&file).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
    }
}
