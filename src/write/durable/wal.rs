//! The WAL as group commit syncs it: the way SQLite's own handle would.
//!
//! SQLite syncs its WAL through the descriptor it opened the file with, read-write, for the
//! connection's whole life. Opening the path afresh for each fsync (what an earlier design did)
//! differs from that in three ways that matter on a failing or changing disk:
//!
//! - **Writeback errors.** Linux reports a failed writeback once to each descriptor that was
//!   open when it happened (or, if nobody had heard it yet, to the first one opened after). A
//!   descriptor opened for one fsync misses an error another descriptor (the checkpointer's
//!   connection, say) heard first; one kept open since the writer connection opened hears every
//!   error from then on.
//! - **Windows.** `FlushFileBuffers`, which `sync_data` is there, needs write access: a file
//!   opened read-only cannot be flushed at all.
//! - **A WAL gone or replaced.** A file no longer at its path (the directory renamed, the WAL
//!   deleted and made again by another process) is not the file SQLite recovers from after a
//!   power loss. Syncing "whatever is at the path", or nothing when nothing is there, would
//!   acknowledge writes recovery will not find. So the descriptor's identity (device and inode,
//!   or volume and file index on Windows) is checked against the file at the path before each
//!   fsync is trusted, and a mismatch is an error, never a success.
//!
//! And as SQLite does on its handle's first sync of a file it created, the WAL's directory is
//! synced once (on Unix; its result ignored, as SQLite ignores it: some file systems refuse an
//! fsync of a directory), so that the WAL's directory entry survives a power loss too.
//!
//! On macOS std's `sync_data` is `fcntl(F_FULLFSYNC)`, which flushes the drive's own cache:
//! stricter than SQLite's default there (a plain `fsync`, unless `PRAGMA fullfsync = ON`), and
//! slower (not measured here: no macOS machine).
//!
//! What this does not do: `psow=0` (a file system whose sector writes may tear the bytes around
//! them) makes SQLite pad a syncing commit's frames to a sector boundary; commits whose fsync
//! is shared run at `NORMAL` and are not padded. The write path's docs say to turn group commit
//! off on such a device.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Which file a descriptor or a path is: what must match before an fsync is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    device: u64,
    file: u64,
}

/// Why a WAL could not be synced.
#[derive(Debug)]
pub enum SyncError {
    /// The disk refused: the fsync (or a read of the file's identity) failed.
    Disk(io::Error),
    /// The file at the WAL's path is no longer the one the writer connection writes (gone,
    /// renamed, replaced).
    Moved(String),
    /// The fsync did not run to its end: its blocking task panicked, or the runtime shut down
    /// under it. Its waiters are not known durable, but the disk refused nothing: group commit
    /// goes on, and the file is not refused.
    NotRun(String),
}

impl SyncError {
    /// Whether the disk (or the file system) refused the WAL: what stops group commit and
    /// refuses the file's writes.
    pub(crate) fn is_the_disks(&self) -> bool {
        !matches!(self, SyncError::NotRun(_))
    }
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Disk(error) => write!(f, "the disk refused a write of the WAL: {error}"),
            SyncError::Moved(why) => write!(f, "the WAL is no longer at its path: {why}"),
            SyncError::NotRun(why) => {
                write!(f, "the fsync of the WAL did not run to its end: {why}")
            }
        }
    }
}

/// One database's WAL, opened read-write with the writer connection and kept for its life.
pub struct Wal {
    path: PathBuf,
    file: File,
    identity: Identity,
    /// The directory's sync ran (once per descriptor, as SQLite's once per handle).
    dir_synced: AtomicBool,
}

impl Wal {
    /// Opens the WAL at `path` read-write (never creating it: SQLite made it already, for the
    /// connection that just asked which file it writes).
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let identity = os::of_file(&file)?;
        Ok(Self {
            path: path.to_owned(),
            file,
            identity,
            dir_synced: AtomicBool::new(false),
        })
    }

    /// Whether the file at the WAL's path is still the one this descriptor has open.
    pub(crate) fn is_at_path(&self) -> bool {
        check(self.identity, os::at_path(&self.path)).is_ok()
    }

    /// The header's checkpoint sequence number (bytes 12 to 15, big-endian): SQLite changes it
    /// each time the WAL restarts. `None` if it cannot be read (no header yet).
    pub(crate) fn checkpoint_sequence(&self) -> Option<u32> {
        let mut bytes = [0; 4];
        os::read_at(&self.file, &mut bytes, 12).ok()?;
        Some(u32::from_be_bytes(bytes))
    }

    /// fsyncs the WAL (its data, and the size that reads need), once the file at its path is
    /// known to be this one; the directory too, the first time. Blocking. The identity is
    /// checked again after the fsync: a file replaced at the path while it ran is not the one
    /// recovery reads, whatever the fsync made durable.
    pub(crate) fn sync(&self) -> Result<(), SyncError> {
        check(self.identity, os::at_path(&self.path))?;
        self.file.sync_data().map_err(SyncError::Disk)?;
        if !self.dir_synced.swap(true, Ordering::AcqRel) {
            os::sync_directory(&self.path);
        }
        check(self.identity, os::at_path(&self.path))
    }
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("path", &self.path).finish()
    }
}

/// Whether an fsync of the descriptor whose identity is `kept` makes durable what recovery
/// reads at the path, whose identity is `now`: only if the two are one file.
pub(crate) fn check(kept: Identity, now: io::Result<Identity>) -> Result<(), SyncError> {
    match now {
        Ok(now) if now == kept => Ok(()),
        Ok(_) => Err(SyncError::Moved(
            "another file is at its path (replaced, or deleted and made again)".to_owned(),
        )),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Err(SyncError::Moved(
            "no file is at its path (deleted, or its directory renamed)".to_owned(),
        )),
        Err(error) => Err(SyncError::Disk(error)),
    }
}

#[cfg(unix)]
mod os {
    use std::fs::File;
    use std::io;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    use super::Identity;

    pub(crate) fn of_file(file: &File) -> io::Result<Identity> {
        let meta = file.metadata()?;
        Ok(Identity {
            device: meta.dev(),
            file: meta.ino(),
        })
    }

    pub(crate) fn at_path(path: &Path) -> io::Result<Identity> {
        let meta = std::fs::metadata(path)?;
        Ok(Identity {
            device: meta.dev(),
            file: meta.ino(),
        })
    }

    pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }

    /// SQLite's `UNIXFILE_DIRSYNC`: the directory synced once, its result ignored.
    pub(crate) fn sync_directory(path: &Path) {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }
    }
}

#[cfg(windows)]
mod os {
    use std::fs::File;
    use std::hash::{Hash, Hasher};
    use std::io;
    use std::path::Path;

    use super::Identity;

    /// Windows: `same_file`'s handle identity (volume serial number and file index), folded
    /// into the same two numbers.
    fn identity(handle: &same_file::Handle) -> Identity {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        handle.hash(&mut hasher);
        Identity {
            device: 0,
            file: hasher.finish(),
        }
    }

    pub(crate) fn of_file(file: &File) -> io::Result<Identity> {
        let handle = same_file::Handle::from_file(file.try_clone()?)?;
        Ok(identity(&handle))
    }

    pub(crate) fn at_path(path: &Path) -> io::Result<Identity> {
        Ok(identity(&same_file::Handle::from_path(path)?))
    }

    pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let offset = offset + done as u64;
            match std::os::windows::fs::FileExt::seek_read(file, &mut buf[done..], offset)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => done += n,
            }
        }
        Ok(())
    }

    /// Windows has no directory sync (NTFS journals its metadata).
    pub(crate) fn sync_directory(_: &Path) {}
}

#[cfg(not(any(unix, windows)))]
mod os {
    use std::fs::File;
    use std::io;
    use std::path::Path;

    use super::Identity;

    pub(crate) fn of_file(_: &File) -> io::Result<Identity> {
        Ok(Identity { device: 0, file: 0 })
    }

    /// No identity to compare on this platform: the file at the path must at least exist.
    pub(crate) fn at_path(path: &Path) -> io::Result<Identity> {
        std::fs::metadata(path).map(|_| Identity { device: 0, file: 0 })
    }

    pub(crate) fn read_at(_: &File, _: &mut [u8], _: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub(crate) fn sync_directory(_: &Path) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(device: u64, file: u64) -> Identity {
        Identity { device, file }
    }

    #[test]
    fn the_same_file_is_trusted() {
        assert!(check(id(1, 2), Ok(id(1, 2))).is_ok());
    }

    #[test]
    fn another_file_at_the_path_is_moved() {
        for other in [id(1, 3), id(2, 2)] {
            match check(id(1, 2), Ok(other)) {
                Err(SyncError::Moved(why)) => assert!(why.contains("another file"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn nothing_at_the_path_is_moved_not_synced() {
        let gone = Err(io::Error::from(io::ErrorKind::NotFound));
        assert!(matches!(check(id(1, 2), gone), Err(SyncError::Moved(_))));
    }

    #[test]
    fn an_error_reading_the_path_is_the_disk_s() {
        let denied = Err(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(matches!(check(id(1, 2), denied), Err(SyncError::Disk(_))));
    }

    #[test]
    fn a_real_wal_syncs_until_its_directory_is_renamed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("d");
        std::fs::create_dir(&db).unwrap();
        let path = db.join("x.db-wal");
        std::fs::write(&path, b"frames").unwrap();
        let wal = Wal::open(&path).unwrap();
        wal.sync().unwrap();
        std::fs::rename(&db, dir.path().join("e")).unwrap();
        assert!(matches!(wal.sync(), Err(SyncError::Moved(_))));
    }

    #[test]
    fn a_replaced_wal_is_not_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db-wal");
        std::fs::write(&path, b"frames").unwrap();
        let wal = Wal::open(&path).unwrap();
        let other = dir.path().join("y");
        std::fs::write(&other, b"other").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(matches!(wal.sync(), Err(SyncError::Moved(_))));
    }

    #[test]
    fn a_wal_is_opened_for_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db-wal");
        std::fs::write(&path, b"frames").unwrap();
        let wal = Wal::open(&path).unwrap();
        // Windows' FlushFileBuffers needs write access; on every platform the descriptor has it.
        use std::io::Write;
        (&wal.file).write_all(b"").unwrap();
        assert!(Wal::open(&dir.path().join("missing")).is_err());
    }
}
