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
            let f = open_write_through(&dev)?;
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
    // A run killed by a signal no handler sees (SIGKILL, SIGXCPU, ...)
    // leaves its temporary behind: the next write of the same target
    // removes those of processes that no longer exist.
    remove_stale_temporaries(dir, name);
    // create_new: never follow or clobber something already there (a
    // shared directory such as /tmp may hold a planted symlink).
    let mut attempt = 0u32;
    let (tmp, file) = loop {
        let tmp = dir.join(temporary_name(name, std::process::id(), attempt));
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

/// How long a FIFO may wait for its reader before the write is an error.
const FIFO_READER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens a character device or FIFO for writing. open(2) of a FIFO
/// without a reader blocks until one comes, forever if none does: it is
/// opened non-blocking (ENXIO while no reader has it open) and retried
/// for [`FIFO_READER_WAIT`], then made blocking again for the writes.
fn open_write_through(dev: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let t0 = std::time::Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(dev)
        {
            Ok(f) => {
                // SAFETY: fcntl on a descriptor this function owns.
                unsafe {
                    let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
                    if fl >= 0 {
                        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
                    }
                }
                return Ok(f);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && t0.elapsed() < FIFO_READER_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!(
                        "{} is a FIFO nobody reads (waited {} s): start its reader first",
                        dev.display(),
                        FIFO_READER_WAIT.as_secs()
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Longest part of the target's name a temporary file's name repeats: a
/// legal target name of up to 255 bytes must leave room for the rest
/// (`~hash.pid-attempt.tmp`) under NAME_MAX.
const TMP_NAME_PREFIX: usize = 64;

/// The part of a temporary file's name that names its target: a dot, the
/// target name's first [`TMP_NAME_PREFIX`] bytes (whole characters), `~`
/// and a hash of the whole name, then `.`.
fn temporary_stem(name: &std::ffi::OsStr) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    let mut cut = bytes.len().min(TMP_NAME_PREFIX);
    if let Ok(text) = std::str::from_utf8(bytes) {
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
    }
    // FNV-1a, 32 bits: two names sharing their first bytes get different
    // temporaries, and the stem stays stable across runs.
    let hash = bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let mut stem = b".".to_vec();
    stem.extend_from_slice(&bytes[..cut]);
    stem.extend_from_slice(format!("~{hash:08x}.").as_bytes());
    stem
}

/// A temporary file's name for target `name`, written by process `pid`.
fn temporary_name(name: &std::ffi::OsStr, pid: u32, attempt: u32) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let mut n = temporary_stem(name);
    n.extend_from_slice(format!("{pid}-{attempt}.tmp").as_bytes());
    std::ffi::OsString::from_vec(n)
}

/// Whether process `pid` exists (signal 0 checks without sending one; a
/// process of another user exists too: EPERM).
fn process_exists(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 sends nothing and touches no memory.
    let r = unsafe { libc::kill(p, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes the temporaries of target `name` in `dir` that processes no
/// longer running left (this and the earlier `.NAME.PID-N.tmp` form).
fn remove_stale_temporaries(dir: &Path, name: &std::ffi::OsStr) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let stem = temporary_stem(name);
    let mut old_stem = b".".to_vec();
    old_stem.extend_from_slice(name.as_bytes());
    old_stem.push(b'.');
    for e in entries.flatten() {
        let file = e.file_name();
        let b = file.as_bytes();
        let Some(rest) = [&stem, &old_stem]
            .iter()
            .find_map(|s| b.strip_prefix(s.as_slice()))
            .and_then(|r| r.strip_suffix(b".tmp"))
        else {
            continue;
        };
        // PID-ATTEMPT, nothing else.
        let Some(pid) = std::str::from_utf8(rest)
            .ok()
            .and_then(|r| r.split_once('-'))
            .filter(|(_, a)| a.parse::<u32>().is_ok())
            .and_then(|(p, _)| p.parse::<u32>().ok())
        else {
            continue;
        };
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if is_file && pid != std::process::id() && !process_exists(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether `a` and `b` name the same existing file (same device and
/// inode, through symlinks and hard links): an output path that is one of
/// the command's inputs would overwrite it.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// An error if output `out` is one of the command's `inputs` (each with
/// what it is, e.g. "the scenario file"): writing it would destroy it.
pub fn refuse_overwriting_input(
    what: &str,
    out: &Path,
    inputs: &[(&str, &Path)],
) -> Result<(), String> {
    match inputs.iter().find(|(_, p)| same_file(out, p)) {
        Some((which, p)) => Err(format!(
            "{what} {} is {which} ({}): writing it would overwrite that input; give another path",
            out.display(),
            p.display()
        )),
        None => Ok(()),
    }
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

    #[test]
    fn a_250_byte_target_name_gets_a_temporary_under_name_max() {
        let dir = scratch_dir("atomic-long");
        let name = format!("{}.json", "n".repeat(245));
        assert_eq!(name.len(), 250);
        let path = dir.join(&name);
        write_file_atomically(&path, |w| w.write_all(b"ok")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "ok");
        let t = temporary_name(std::ffi::OsStr::new(&name), u32::MAX, u32::MAX);
        assert!(t.len() <= 255, "{} bytes", t.len());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn stale_temporaries_of_the_target_are_removed_by_the_next_write() {
        let dir = scratch_dir("atomic-stale");
        let name = std::ffi::OsStr::new("trace.json");
        // A pid above pid_max (2^22) never runs: its temporaries are stale.
        let dead = 4_194_305;
        let stale = dir.join(temporary_name(name, dead, 0));
        let old_form = dir.join(format!(".trace.json.{dead}-3.tmp"));
        // A live process's (ours: the parent of this test, pid 1) stays,
        // as does another target's.
        let live = dir.join(temporary_name(name, 1, 0));
        let other = dir.join(temporary_name(std::ffi::OsStr::new("t.json"), dead, 0));
        for p in [&stale, &old_form, &live, &other] {
            std::fs::write(p, "partial").unwrap();
        }
        write_file_atomically(&dir.join(name), |w| w.write_all(b"whole")).unwrap();
        assert!(!stale.exists() && !old_form.exists());
        assert!(live.exists() && other.exists());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_output_that_is_an_input_is_refused() {
        let dir = scratch_dir("atomic-same");
        let input = dir.join("scenario.toml");
        std::fs::write(&input, "x").unwrap();
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let e = refuse_overwriting_input("--trace", &link, &[("the scenario file", &input)])
            .unwrap_err();
        assert!(e.contains("the scenario file"), "{e}");
        assert!(
            refuse_overwriting_input("--trace", &dir.join("new.json"), &[("s", &input)]).is_ok()
        );
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
