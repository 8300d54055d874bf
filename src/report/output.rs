//! Writing an output file (a trace, a calibration, a sweep's results) so
//! that what is at the path the user named is respected:
//!
//! - a regular file (or nothing) is replaced atomically: the path holds
//!   either its old contents or all of the new ones, never a prefix;
//! - a symlink stays a symlink: the file it points at is replaced, in its
//!   own directory;
//! - a character device or a FIFO (`/dev/null`, `/dev/stdout`, a named
//!   pipe a consumer reads) is written through, never replaced by a file;
//! - a directory, a socket or a block device is refused with an error;
//! - a temporary file still being filled when the process receives SIGINT
//!   or SIGTERM is removed ([`remove_temporaries`], which the command-line
//!   tool's signal handler calls).

use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Temporary files being filled now, for the signal handler.
static IN_PROGRESS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// How many symlinks are followed before giving up (Linux's own limit for
/// one path lookup is 40).
const MAX_LINKS: usize = 40;

/// Removes every temporary file a write in progress has open. Meant for a
/// signal handler: the process is about to end, so the files are never
/// renamed into place.
pub fn remove_temporaries() {
    // A poisoned lock still holds the list: a panicking writer must not
    // keep its temporary file alive.
    let list = match IN_PROGRESS.lock() {
        Ok(l) => l,
        Err(p) => p.into_inner(),
    };
    for tmp in list.iter() {
        let _ = std::fs::remove_file(tmp);
    }
}

/// Registers a temporary file for [`remove_temporaries`] while it lives.
struct Temporary(PathBuf);

impl Temporary {
    fn register(path: PathBuf) -> Self {
        if let Ok(mut l) = IN_PROGRESS.lock() {
            l.push(path.clone());
        }
        Temporary(path)
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Ok(mut l) = IN_PROGRESS.lock() {
            l.retain(|p| p != &self.0);
        }
    }
}

/// What `path` leads to once its symlinks are followed.
enum Target {
    /// A regular file or nothing yet: replace atomically at this path.
    Replace(PathBuf),
    /// A character device or a FIFO: write through.
    WriteThrough(PathBuf),
}

/// Follows `path`'s symlinks (a dangling one too: the file it names is
/// created) and classifies what is at the end.
fn resolve(path: &Path) -> std::io::Result<Target> {
    use std::os::unix::fs::FileTypeExt;
    let mut p = path.to_path_buf();
    for _ in 0..=MAX_LINKS {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Target::Replace(p)),
            Err(e) => return Err(e),
        };
        let t = meta.file_type();
        if t.is_symlink() {
            let link = std::fs::read_link(&p)?;
            p = if link.is_absolute() {
                link
            } else {
                p.parent().unwrap_or(Path::new(".")).join(link)
            };
            continue;
        }
        if t.is_file() {
            return Ok(Target::Replace(p));
        }
        if t.is_char_device() || t.is_fifo() {
            return Ok(Target::WriteThrough(p));
        }
        let what = if t.is_dir() {
            "a directory"
        } else if t.is_block_device() {
            "a block device"
        } else {
            "a socket"
        };
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{} is {what}, not a file to write", p.display()),
        ));
    }
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!("more than {MAX_LINKS} symlinks from {}", path.display()),
    ))
}

/// Writes `write`'s output to `path` as the module documentation says.
/// For a regular file: a temporary file in the same directory is filled,
/// flushed to disk and renamed over the target (rename(2) replaces it
/// atomically within a file system); if `write` fails or the process is
/// interrupted, the target is untouched and the temporary file removed.
pub fn write_file_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let target = match resolve(path)? {
        Target::WriteThrough(dev) => {
            let f = std::fs::OpenOptions::new().write(true).open(&dev)?;
            let mut out = std::io::BufWriter::new(f);
            write(&mut out)?;
            return out.into_inner().map(drop).map_err(|e| e.into_error());
        }
        Target::Replace(p) => p,
    };
    let name = target
        .file_name()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // create_new: never follow or clobber something already there (a
    // shared directory such as /tmp may hold a planted symlink).
    let mut attempt = 0u32;
    let (tmp, file) = loop {
        let mut n = std::ffi::OsString::from(".");
        n.push(name);
        n.push(format!(".{}-{attempt}.tmp", std::process::id()));
        let tmp = dir.join(n);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => break (Temporary::register(tmp), f),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let mut out = std::io::BufWriter::new(file);
    let done = write(&mut out)
        .and_then(|_| out.into_inner().map_err(|e| e.into_error()))
        .and_then(|f| f.sync_all())
        .and_then(|_| std::fs::rename(&tmp.0, &target));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp.0);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("exitless-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn an_interrupted_write_leaves_the_old_file_whole_and_no_temporary() {
        let dir = scratch_dir("atomic-fail");
        let path = dir.join("trace.json");
        std::fs::write(&path, "old, complete").unwrap();
        // The writer dies half-way, as a run interrupted while writing would.
        let r = write_file_atomically(&path, |w| {
            w.write_all(b"{\"traceEvents\":[")?;
            Err(Error::other("interrupted"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old, complete");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "temporary file left behind");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_finished_write_replaces_the_file() {
        let dir = scratch_dir("atomic-ok");
        let path = dir.join("out.json");
        std::fs::write(&path, "old").unwrap();
        write_file_atomically(&path, |w| w.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A directory is not a file name to write.
        assert!(write_file_atomically(&dir.join(".."), |w| w.write_all(b"x")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_symlink_stays_a_symlink_and_its_target_is_replaced() {
        let dir = scratch_dir("atomic-link");
        let real = dir.join("sub").join("real.json");
        std::fs::create_dir_all(real.parent().unwrap()).unwrap();
        std::fs::write(&real, "old").unwrap();
        let link = dir.join("link.json");
        std::os::unix::fs::symlink("sub/real.json", &link).unwrap();
        write_file_atomically(&link, |w| w.write_all(b"new")).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        // A dangling link: the file it names is created.
        let dangling = dir.join("dangling.json");
        std::os::unix::fs::symlink(dir.join("made.json"), &dangling).unwrap();
        write_file_atomically(&dangling, |w| w.write_all(b"made")).unwrap();
        assert!(std::fs::symlink_metadata(&dangling)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read_to_string(dir.join("made.json")).unwrap(),
            "made"
        );
        // A loop is an error, not a hang.
        let a = dir.join("a");
        let b = dir.join("b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let e = write_file_atomically(&a, |w| w.write_all(b"x")).unwrap_err();
        assert!(e.to_string().contains("symlinks"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_character_device_is_written_through_not_replaced() {
        let null = Path::new("/dev/null");
        if !null.exists() {
            return;
        }
        write_file_atomically(null, |w| w.write_all(b"discarded")).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(null)
            .unwrap()
            .file_type()
            .is_char_device());
        // No temporary was made next to it either.
        let dev_tmp = std::fs::read_dir("/dev")
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with(".null."));
        assert!(!dev_tmp);
    }

    #[test]
    fn a_fifo_is_written_through_to_its_reader() {
        let dir = scratch_dir("atomic-fifo");
        let fifo = dir.join("pipe");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            std::fs::remove_dir_all(&dir).ok();
            return;
        }
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        write_file_atomically(&fifo, |w| w.write_all(b"through the pipe")).unwrap();
        assert_eq!(reader.join().unwrap(), "through the pipe");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Runs in a child process (below): `remove_temporaries` acts on the
    /// whole process, so it must not race the other tests' writes.
    #[test]
    #[ignore = "run by temporaries_in_progress_are_removed_on_request in a child process"]
    fn child_removes_temporaries_mid_write() {
        let Ok(dir) = std::env::var("EXITLESS_TMP_TEST_DIR") else {
            return;
        };
        let path = Path::new(&dir).join("big.json");
        // remove_temporaries runs while the writer is still writing, as the
        // signal handler would; the rename then fails and nothing is left.
        let r = write_file_atomically(&path, |w| {
            w.write_all(b"partial")?;
            w.flush()?;
            assert_eq!(IN_PROGRESS.lock().unwrap().len(), 1);
            remove_temporaries();
            Ok(())
        });
        assert!(r.is_err(), "the temporary vanished: the rename must fail");
        assert!(IN_PROGRESS.lock().unwrap().is_empty());
    }

    #[test]
    fn temporaries_in_progress_are_removed_on_request() {
        let dir = scratch_dir("atomic-signal");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "report::output::tests::child_removes_temporaries_mid_write",
                "--ignored",
                "--nocapture",
            ])
            .env("EXITLESS_TMP_TEST_DIR", &dir)
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{log}");
        assert!(
            log.contains("1 passed"),
            "the child test did not run: {log}"
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).ok();
    }
}
