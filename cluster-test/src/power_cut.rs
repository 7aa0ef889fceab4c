//! A directory that can lose power: a FUSE pass-through onto a backing directory which remembers,
//! for every file, what each write since that file's last `fsync` / `fdatasync` overwrote, so
//! that [`PowerCut::cut`] can put every file back to what was last made durable.
//!
//! SIGKILL leaves the kernel's page cache intact, so a crash test with SIGKILL alone cannot tell
//! a write that reached the disk from one that only reached the cache. A real power loss drops
//! the cache; so does a cut here.
//!
//! The model is the weakest a program may rely on for file data: bytes written to a file are
//! durable only once a sync of that file returns. What a cut keeps of the rest is the caller's
//! choice ([`Unsynced`]): nothing, or a random part of it, page by page and in no order, as the
//! kernel's writeback may have left it. Names are treated as durable at once (a file created,
//! renamed or removed stays so across a cut), so the model checks the syncing of data, not of
//! directories. It serves one test at a time: no hard links, symlinks or special files.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, MountOption, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

/// Attributes are never cached by the kernel: the backing files are the only truth.
const TTL: Duration = Duration::ZERO;

/// What one write (or truncation) replaced: enough to undo it.
struct Undo {
    /// The file's length before.
    len_before: u64,
    /// Where the replaced bytes start.
    offset: u64,
    /// The bytes that were there (only those inside the old length).
    old: Vec<u8>,
}

/// The file system's bookkeeping, shared with the [`PowerCut`] handle.
#[derive(Default)]
struct Books {
    /// Backing path of every inode handed to the kernel.
    paths: HashMap<u64, PathBuf>,
    /// The inverse of `paths`.
    inodes: HashMap<PathBuf, u64>,
    next_inode: u64,
    /// Open files by handle, with their inode.
    open: HashMap<u64, (u64, Arc<File>)>,
    /// Open directories by handle: the listing taken when each was opened, so that a directory
    /// read in several replies lists every entry once even while files come and go.
    listings: HashMap<u64, Arc<Vec<Listed>>>,
    next_handle: u64,
    /// Per inode, what the writes since its last sync replaced, oldest first.
    unsynced: HashMap<u64, Vec<Undo>>,
}

impl Books {
    fn new(root: &Path) -> Self {
        let mut books = Self {
            next_inode: INodeNo::ROOT.0 + 1,
            next_handle: 1,
            ..Self::default()
        };
        books.paths.insert(INodeNo::ROOT.0, root.to_path_buf());
        books.inodes.insert(root.to_path_buf(), INodeNo::ROOT.0);
        books
    }

    fn path(&self, inode: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.get(&inode.0).cloned().ok_or(Errno::ENOENT)
    }

    fn inode_of(&mut self, path: &Path) -> u64 {
        if let Some(inode) = self.inodes.get(path) {
            return *inode;
        }
        let inode = self.next_inode;
        self.next_inode += 1;
        self.paths.insert(inode, path.to_path_buf());
        self.inodes.insert(path.to_path_buf(), inode);
        inode
    }

    fn forget_path(&mut self, path: &Path) {
        if let Some(inode) = self.inodes.remove(path) {
            self.paths.remove(&inode);
            self.unsynced.remove(&inode);
        }
    }

    /// Moves `from` (and, for a directory, everything under it) to `to`.
    fn moved(&mut self, from: &Path, to: &Path) {
        if from == to {
            return;
        }
        self.forget_path(to);
        let moved: Vec<(PathBuf, u64)> = self
            .inodes
            .iter()
            .filter(|(path, _)| path.starts_with(from))
            .map(|(path, inode)| (path.clone(), *inode))
            .collect();
        for (old, inode) in moved {
            self.inodes.remove(&old);
            let new = match old.strip_prefix(from) {
                Ok(rest) if rest.as_os_str().is_empty() => to.to_path_buf(),
                Ok(rest) => to.join(rest),
                Err(_) => continue,
            };
            self.paths.insert(inode, new.clone());
            self.inodes.insert(new, inode);
        }
    }

    fn file(&self, handle: FileHandle) -> Result<(u64, Arc<File>), Errno> {
        self.open.get(&handle.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_open(&mut self, inode: u64, file: File) -> FileHandle {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.open.insert(handle, (inode, Arc::new(file)));
        FileHandle(handle)
    }

    /// Records what writing `len` bytes at `offset` of `file` (or cutting it to `offset`, when
    /// `len` is `None`) is about to replace.
    fn remember(
        &mut self,
        inode: u64,
        file: &File,
        offset: u64,
        len: Option<u64>,
    ) -> io::Result<()> {
        let len_before = file.metadata()?.len();
        let end = match len {
            Some(len) => offset.saturating_add(len).min(len_before),
            None => len_before,
        };
        let mut old = vec![0; end.saturating_sub(offset) as usize];
        if !old.is_empty() {
            file.read_exact_at(&mut old, offset)?;
        }
        self.unsynced.entry(inode).or_default().push(Undo {
            len_before,
            offset,
            old,
        });
        Ok(())
    }
}

/// One directory entry as `readdir` hands it out: inode, kind, name.
type Listed = (u64, FileType, std::ffi::OsString);

/// What a power loss keeps of the data written since a file's last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsynced {
    /// Nothing: every file goes back to what it held when it was last synced. The harshest case,
    /// and the one that shows a missing sync.
    Lost,
    /// A part, drawn from a generator seeded with `seed`: each 4 KiB page wholly inside both a
    /// file's synced and its current length that differs from its synced content keeps the new
    /// bytes or goes back, independently, and each file keeps its synced length or its current
    /// one, with the pages past the shorter of the two following the length (data is written
    /// before the length that covers it, as ext4 and XFS order them). The kernel writes dirty
    /// pages back in no order a program may rely on, so a later write can survive where an
    /// earlier one is lost: recovery must still find a prefix of what was written, which
    /// [`Unsynced::Lost`] cannot show.
    PartlyKept {
        /// Seeds the choices, so that the same unsynced state is cut the same way.
        seed: u64,
    },
}

/// The page size the kernel writes back in.
const PAGE: usize = 4096;

/// What a cut found unsynced and what it did with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files written since their last sync.
    pub files: usize,
    /// Writes and truncations since those syncs.
    pub writes: usize,
    /// Pages that differed from their synced content and went back to it.
    pub pages_lost: usize,
    /// Pages that differed from their synced content and kept what was written.
    pub pages_kept: usize,
    /// Whether the cut kept a random part ([`Unsynced::PartlyKept`]) rather than losing all.
    pub partly_kept: bool,
}

impl CutReport {
    /// Adds `other`'s counts to this one's.
    pub fn add(&mut self, other: CutReport) {
        self.files += other.files;
        self.writes += other.writes;
        self.pages_lost += other.pages_lost;
        self.pages_kept += other.pages_kept;
        self.partly_kept |= other.partly_kept;
    }
}

impl std::fmt::Display for CutReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        write!(
            f,
            "{} not yet synced in {}, ",
            count(self.writes, "write"),
            count(self.files, "file"),
        )?;
        let lost = count(self.pages_lost, "changed page");
        if self.partly_kept {
            write!(
                f,
                "a random part kept: {lost} lost, {} kept",
                self.pages_kept
            )
        } else {
            write!(f, "all lost: {lost}")
        }
    }
}

/// The handle a test keeps: cuts the power of the mounted directory.
#[derive(Clone)]
pub struct PowerCut {
    books: Arc<Mutex<Books>>,
    gate: Arc<SyncGate>,
    full: Arc<AtomicBool>,
}

/// Where syncs stand: whether they complete, wait, or fail because the power went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Syncs {
    /// A sync makes the file's data durable and returns.
    Complete,
    /// A sync waits, as one does on a slow disk, until the power goes.
    Held,
    /// The power went: a sync that was waiting returns an error and makes nothing durable.
    Failed,
}

/// Lets a test hold every sync in flight, so that the power goes while writes wait for theirs.
struct SyncGate {
    state: Mutex<Syncs>,
    changed: Condvar,
}

impl SyncGate {
    fn set(&self, syncs: Syncs) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = syncs;
        self.changed.notify_all();
    }

    /// Waits while syncs are held; whether the sync may then complete.
    fn pass(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = self
            .changed
            .wait_while(state, |syncs| *syncs == Syncs::Held)
            .unwrap_or_else(|e| e.into_inner());
        *state == Syncs::Complete
    }
}

impl PowerCut {
    /// Whether the disk is full from now on: every write that would make a file longer fails
    /// with `ENOSPC`, as on a disk with no free block left (a file's blocks count as allocated
    /// up to its length, so writes within it succeed, and files can still be created empty, as
    /// with inodes to spare), until it is emptied again (`false`).
    pub fn fill(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// From now on every `fsync` / `fdatasync` waits, until the power goes: call it shortly
    /// before killing the writers, so that writes in flight are caught between their `write`
    /// and their sync instead of only by chance.
    pub fn hold_syncs(&self) {
        self.gate.set(Syncs::Held);
    }

    /// Syncs held by [`PowerCut::hold_syncs`] fail from now on: call it right after killing the
    /// writer, whose exit waits until its sync in flight is answered (FUSE does not abandon a
    /// request the file system has taken). Does nothing while syncs are not held.
    pub fn fail_held_syncs(&self) {
        let mut state = self.gate.state.lock().unwrap_or_else(|e| e.into_inner());
        if *state == Syncs::Held {
            *state = Syncs::Failed;
            self.gate.changed.notify_all();
        }
    }

    /// Throws away what [`Unsynced`] says of every write since each file's last sync. Call it
    /// only once nothing writes any more (the writers are dead, the directory unmounted).
    pub fn cut(&self, unsynced: Unsynced) -> io::Result<CutReport> {
        let mut books = lock(&self.books);
        let mut report = CutReport {
            partly_kept: matches!(unsynced, Unsynced::PartlyKept { .. }),
            ..CutReport::default()
        };
        let mut rng = match unsynced {
            Unsynced::Lost => None,
            Unsynced::PartlyKept { seed } => Some(StdRng::seed_from_u64(seed)),
        };
        // In inode order, so that a seed draws the same choices for the same files.
        let files: BTreeMap<u64, Vec<Undo>> =
            std::mem::take(&mut books.unsynced).into_iter().collect();
        for (inode, undos) in files {
            let Some(path) = books.paths.get(&inode) else {
                continue;
            };
            let file = OpenOptions::new().read(true).write(true).open(path)?;
            report.files += 1;
            report.writes += undos.len();
            let now = std::fs::read(path)?;
            let synced = synced_content(&now, &undos);
            // The length on disk moves only with the data: a file system that orders data before
            // metadata (ext4's default, XFS) writes appended pages before it records the new
            // length, so a file that kept its new length kept what was appended too, and one
            // that kept its old length after shrinking kept the data past the new end.
            let new_len = rng.as_mut().is_some_and(|rng| rng.random_bool(0.5));
            let len = if new_len { now.len() } else { synced.len() };
            let both = now.len().min(synced.len());
            // Every page that differs from its synced content counts, even one past the chosen
            // length (lost with it), so that the report says what there was to lose.
            let mut after = vec![0; now.len().max(synced.len())];
            for start in (0..after.len()).step_by(PAGE) {
                let end = (start + PAGE).min(after.len());
                let (was, is) = (padded(&synced, start, end), padded(&now, start, end));
                let keep = if was == is {
                    true
                } else if end > both {
                    new_len
                } else {
                    rng.as_mut().is_some_and(|rng| rng.random_bool(0.5))
                };
                if was != is {
                    if keep && start < len {
                        report.pages_kept += 1;
                    } else {
                        report.pages_lost += 1;
                    }
                }
                after[start..end].copy_from_slice(if keep { &is } else { &was });
            }
            after.truncate(len);
            file.set_len(len as u64)?;
            file.write_all_at(&after, 0)?;
        }
        Ok(report)
    }
}

/// A file's content at its last sync: `now` with `undos` (oldest first) undone, newest first.
fn synced_content(now: &[u8], undos: &[Undo]) -> Vec<u8> {
    let mut content = now.to_vec();
    for undo in undos.iter().rev() {
        content.resize(undo.len_before as usize, 0);
        // A write or growing truncation past the old end replaced nothing (and starts past it).
        if !undo.old.is_empty() {
            let start = undo.offset as usize;
            content[start..start + undo.old.len()].copy_from_slice(&undo.old);
        }
    }
    content
}

/// `content[start..end]`, with zeros past its end.
fn padded(content: &[u8], start: usize, end: usize) -> Vec<u8> {
    let mut bytes = vec![0; end - start];
    if start < content.len() {
        let have = end.min(content.len()) - start;
        bytes[..have].copy_from_slice(&content[start..start + have]);
    }
    bytes
}

/// Set to `1` to fail, instead of skip, the power-cut tests on a machine without FUSE.
pub const REQUIRE_ENV: &str = "BATON_REQUIRE_FUSE";

/// Whether this machine can mount a power-cut directory (FUSE, and the right to mount): tries
/// one in a temporary directory. The error says why not.
pub fn available() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse".into());
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (backing, mountpoint) = (dir.path().join("backing"), dir.path().join("mounted"));
    for path in [&backing, &mountpoint] {
        std::fs::create_dir(path).map_err(|e| e.to_string())?;
    }
    let mounted =
        Mounted::mount(&backing, &mountpoint).map_err(|e| format!("cannot mount: {e}"))?;
    let probe = mountpoint.join("probe");
    std::fs::write(&probe, b"x").map_err(|e| format!("cannot write through the mount: {e}"))?;
    mounted
        .unmount()
        .map_err(|e| format!("cannot unmount: {e}"))
}

/// [`available`], except that it is an error when [`REQUIRE_ENV`]=1 and FUSE is unusable.
pub fn available_unless_required() -> anyhow::Result<Result<(), String>> {
    match available() {
        Err(why) if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") => {
            anyhow::bail!("FUSE is required ({REQUIRE_ENV}=1) but unusable: {why}")
        }
        usable => Ok(usable),
    }
}

/// `Ok(true)` when the power-cut tests can run here; `Ok(false)` after printing
/// `<test>: skipped: ...` when they cannot. Fails instead with [`REQUIRE_ENV`]=1.
pub fn available_or_skip(test: &str) -> anyhow::Result<bool> {
    match available_unless_required().map_err(|e| e.context(test.to_string()))? {
        Ok(()) => Ok(true),
        Err(why) => {
            println!("{test}: skipped: cannot mount a FUSE directory ({why})");
            Ok(false)
        }
    }
}

/// A mounted power-cut directory; unmounted when dropped.
pub struct Mounted {
    session: Option<BackgroundSession>,
    power: PowerCut,
}

impl Mounted {
    /// Mounts `backing` at `mountpoint` (an existing, empty directory). Needs FUSE: root (or
    /// `fusermount3`) and `/dev/fuse`.
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<Self> {
        let books = Arc::new(Mutex::new(Books::new(backing)));
        let gate = Arc::new(SyncGate {
            state: Mutex::new(Syncs::Complete),
            changed: Condvar::new(),
        });
        let full = Arc::new(AtomicBool::new(false));
        let fs = PowerCutFs {
            books: books.clone(),
            gate: gate.clone(),
            full: full.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("baton-power-cut".into())];
        config.n_threads = Some(2);
        let session = fuser::spawn_mount(fs, mountpoint, &config)?;
        Ok(Self {
            session: Some(session),
            power: PowerCut { books, gate, full },
        })
    }

    /// The handle that cuts the power.
    pub fn power(&self) -> PowerCut {
        self.power.clone()
    }

    /// The power goes (call it once the writers are dead): syncs still waiting fail, the
    /// directory is unmounted, so nothing reaches the backing files after the cut, and the cut
    /// throws away what `unsynced` says.
    pub fn lose_power(self, unsynced: Unsynced) -> io::Result<CutReport> {
        let power = self.power();
        power.gate.set(Syncs::Failed);
        self.unmount()?;
        power.cut(unsynced)
    }

    /// Unmounts and waits for the file system's thread (failing any sync still held).
    pub fn unmount(mut self) -> io::Result<()> {
        self.power.fail_held_syncs();
        match self.session.take() {
            Some(session) => session.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // A sync still held would keep the file system's thread, and so the unmount, waiting.
        self.power.fail_held_syncs();
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

fn lock(books: &Mutex<Books>) -> MutexGuard<'_, Books> {
    books
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn attr(inode: u64, path: &Path) -> io::Result<FileAttr> {
    Ok(attr_of(inode, &std::fs::symlink_metadata(path)?))
}

fn attr_of(inode: u64, meta: &std::fs::Metadata) -> FileAttr {
    let kind = if meta.is_dir() {
        FileType::Directory
    } else {
        FileType::RegularFile
    };
    let time = |secs: i64, nanos: i64| {
        UNIX_EPOCH + Duration::new(u64::try_from(secs).unwrap_or(0), nanos as u32)
    };
    FileAttr {
        ino: INodeNo(inode),
        size: meta.len(),
        blocks: meta.blocks(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: time(meta.ctime(), meta.ctime_nsec()),
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The FUSE side. Every call takes the bookkeeping lock for its whole length, so writes and
/// their undo records are in one order.
struct PowerCutFs {
    books: Arc<Mutex<Books>>,
    gate: Arc<SyncGate>,
    full: Arc<AtomicBool>,
}

impl PowerCutFs {
    fn entry(&self, parent: INodeNo, name: &OsStr) -> Result<(u64, PathBuf), Errno> {
        let mut books = lock(&self.books);
        let path = books.path(parent)?.join(name);
        std::fs::symlink_metadata(&path)?;
        Ok((books.inode_of(&path), path))
    }

    /// Removes `name` from `parent` with `remove` (a file or an empty directory).
    fn remove(
        &self,
        parent: INodeNo,
        name: &OsStr,
        remove: fn(&Path) -> io::Result<()>,
    ) -> Result<(), Errno> {
        let mut books = lock(&self.books);
        let path = books.path(parent)?.join(name);
        remove(&path)?;
        books.forget_path(&path);
        Ok(())
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(errno) => reply.error(errno),
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self
            .entry(parent, name)
            .and_then(|(inode, path)| attr(inode, &path).map_err(Errno::from))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let books = lock(&self.books);
        // A file still open is still there when a rename replaced or an unlink removed its name
        // (the books then forgot its inode), as on any file system: an `fstat` of it (the kernel
        // asks by inode, seldom with the handle) answers from an open handle of that inode.
        let open = fh.and_then(|fh| books.file(fh).ok()).or_else(|| {
            books
                .open
                .values()
                .find(|(inode, _)| *inode == ino.0)
                .cloned()
        });
        let result = match (books.path(ino), open) {
            (Ok(path), _) => attr(ino.0, &path),
            (Err(_), Some((_, file))) => file.metadata().map(|meta| attr_of(ino.0, &meta)),
            // Looked up just before a rename replaced its name: ESTALE makes the kernel walk
            // the path again and stat the file now there, as a local file system would.
            (Err(_), None) => return reply.error(Errno::ESTALE),
        };
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(error) => reply.error(Errno::from(error)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = (|| -> Result<FileAttr, Errno> {
            let mut books = lock(&self.books);
            let path = books.path(ino)?;
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if let Some(size) = size {
                // Read as well: the undo record keeps the bytes a shrinking cut drops.
                let file = OpenOptions::new().read(true).write(true).open(&path)?;
                books.remember(ino.0, &file, size, None)?;
                file.set_len(size)?;
            }
            Ok(attr(ino.0, &path)?)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let result = (|| -> Result<FileAttr, Errno> {
            let mut books = lock(&self.books);
            let path = books.path(parent)?.join(name);
            std::fs::create_dir(&path)?;
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(mode & !umask & 0o7777),
            )?;
            let inode = books.inode_of(&path);
            Ok(attr(inode, &path)?)
        })();
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            reply,
            self.remove(parent, name, |path| std::fs::remove_file(path)),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            reply,
            self.remove(parent, name, |path| std::fs::remove_dir(path)),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let result = (|| -> Result<(), Errno> {
            let mut books = lock(&self.books);
            let from = books.path(parent)?.join(name);
            let to = books.path(newparent)?.join(newname);
            std::fs::rename(&from, &to)?;
            books.moved(&from, &to);
            Ok(())
        })();
        reply_empty(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = (|| -> Result<FileHandle, Errno> {
            let mut books = lock(&self.books);
            // Looked up just before a rename replaced (or an unlink removed) its name: ESTALE
            // makes the kernel look the path up again and open what is there now (or answer
            // ENOENT itself), as a local file system's open would.
            let path = books.path(ino).map_err(|_| Errno::ESTALE)?;
            let file = OpenOptions::new()
                .read(true)
                .write(flags.acc_mode() != OpenAccMode::O_RDONLY)
                .open(&path)?;
            Ok(books.add_open(ino.0, file))
        })();
        match result {
            Ok(handle) => reply.opened(handle, FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = (|| -> Result<(FileAttr, FileHandle), Errno> {
            let mut books = lock(&self.books);
            let path = books.path(parent)?.join(name);
            let existed = path.exists();
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .create_new(flags & libc::O_EXCL != 0)
                .mode(mode & !umask & 0o7777)
                .open(&path)?;
            let inode = books.inode_of(&path);
            if existed && flags & libc::O_TRUNC != 0 {
                books.remember(inode, &file, 0, None)?;
                file.set_len(0)?;
            }
            let attr = attr(inode, &path)?;
            Ok((attr, books.add_open(inode, file)))
        })();
        match result {
            Ok((attr, handle)) => {
                reply.created(&TTL, &attr, Generation(0), handle, FopenFlags::empty())
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let result = (|| -> Result<Vec<u8>, Errno> {
            let (_, file) = lock(&self.books).file(fh)?;
            let mut buf = vec![0; size as usize];
            let mut filled = 0;
            while filled < buf.len() {
                match file.read_at(&mut buf[filled..], offset + filled as u64)? {
                    0 => break,
                    n => filled += n,
                }
            }
            buf.truncate(filled);
            Ok(buf)
        })();
        match result {
            Ok(data) => reply.data(&data),
            Err(errno) => reply.error(errno),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = (|| -> Result<(), Errno> {
            let mut books = lock(&self.books);
            let (inode, file) = books.file(fh)?;
            let end = offset + data.len() as u64;
            if self.full.load(Ordering::SeqCst) && end > file.metadata()?.len() {
                return Err(Errno::ENOSPC);
            }
            books.remember(inode, &file, offset, Some(data.len() as u64))?;
            file.write_all_at(data, offset)?;
            Ok(())
        })();
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.books).open.remove(&fh.0);
        reply.ok();
    }

    /// The file's data is durable from here on: forget how to undo it. (The backing file is not
    /// synced for real: the cut is simulated, and skipping it keeps the tests fast.) While syncs
    /// are held it waits first, and fails if the power goes meanwhile.
    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if !self.gate.pass() {
            return reply.error(Errno::EIO);
        }
        lock(&self.books).unsynced.remove(&ino.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let result = (|| -> Result<FileHandle, Errno> {
            let mut books = lock(&self.books);
            let path = books.path(ino)?;
            let mut entries: Vec<Listed> = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            let mut names: Vec<_> = std::fs::read_dir(&path)?.collect::<io::Result<_>>()?;
            names.sort_by_key(|entry| entry.file_name());
            for entry in names {
                let kind = if entry.file_type()?.is_dir() {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                let inode = books.inode_of(&entry.path());
                entries.push((inode, kind, entry.file_name()));
            }
            let handle = books.next_handle;
            books.next_handle += 1;
            books.listings.insert(handle, Arc::new(entries));
            Ok(FileHandle(handle))
        })();
        match result {
            Ok(handle) => reply.opened(handle, FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(entries) = lock(&self.books).listings.get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        for (index, (inode, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*inode), index as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.books).listings.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const SYNCED_LEN: usize = 3 * PAGE + PAGE / 2;

    fn gate() -> Arc<SyncGate> {
        Arc::new(SyncGate {
            state: Mutex::new(Syncs::Complete),
            changed: Condvar::new(),
        })
    }

    /// A file synced with `SYNCED_LEN` bytes of `a`, then written as the file system records
    /// writes: page 1 overwritten, two pages appended, a few bytes of page 0 overwritten, a few
    /// more a page past the end (leaving a hole). Returns the handle, the file, and its synced
    /// and current contents.
    fn written(dir: &Path) -> (PowerCut, PathBuf, Vec<u8>, Vec<u8>) {
        let synced = vec![b'a'; SYNCED_LEN];
        let (mut books, inode, file, path) = synced_file(dir, &synced);
        let writes: [(usize, Vec<u8>); 4] = [
            (PAGE, vec![b'b'; PAGE]),
            (SYNCED_LEN, vec![b'c'; 2 * PAGE]),
            (100, vec![b'd'; 10]),
            (SYNCED_LEN + 3 * PAGE, vec![b'e'; 10]),
        ];
        for (offset, bytes) in &writes {
            books
                .remember(inode, &file, *offset as u64, Some(bytes.len() as u64))
                .unwrap();
            file.write_all_at(bytes, *offset as u64).unwrap();
        }
        let now = std::fs::read(&path).unwrap();
        (power_cut(books), path, synced, now)
    }

    /// A file `f` under `dir` synced with `content`: the books that track it, its inode, a
    /// handle to write it through as the file system would, and its path.
    fn synced_file(dir: &Path, content: &[u8]) -> (Books, u64, File, PathBuf) {
        let path = dir.join("f");
        std::fs::write(&path, content).unwrap();
        let mut books = Books::new(dir);
        let inode = books.inode_of(&path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (books, inode, file, path)
    }

    /// A file replaced by a rename while open, as the node's snapshot file is when a snapshot is
    /// built while the last one is being read: the open handle still reads and stats the old
    /// file, and the name opens the new one — as on any local file system. (The replaced file's
    /// inode was forgotten at the rename, so a stat through the handle answered ENOENT and the
    /// node's Raft stopped.)
    #[test]
    fn a_file_replaced_by_a_rename_stays_readable_through_its_open_handle() {
        if let Err(why) = available_unless_required().unwrap() {
            println!("skipped: cannot mount a FUSE directory ({why})");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (backing, mountpoint) = (dir.path().join("backing"), dir.path().join("mounted"));
        for path in [&backing, &mountpoint] {
            std::fs::create_dir(path).unwrap();
        }
        let mounted = Mounted::mount(&backing, &mountpoint).unwrap();
        let (name, temp) = (mountpoint.join("image"), mountpoint.join("image.tmp"));
        std::fs::write(&name, b"old image").unwrap();
        let mut old = File::open(&name).unwrap();
        std::fs::write(&temp, b"the new image").unwrap();
        std::fs::rename(&temp, &name).unwrap();
        assert_eq!(old.metadata().unwrap().len(), 9);
        let mut read = Vec::new();
        std::io::Read::read_to_end(&mut old, &mut read).unwrap();
        assert_eq!(read, b"old image");
        assert_eq!(std::fs::read(&name).unwrap(), b"the new image");
        drop(old);
        mounted.unmount().unwrap();
    }

    fn power_cut(books: Books) -> PowerCut {
        PowerCut {
            books: Arc::new(Mutex::new(books)),
            gate: gate(),
            full: Arc::default(),
        }
    }

    /// Pages that differ between the synced and the current content: 0, 1, the three the
    /// append touches (3 straddles the synced end) and the one past the hole.
    const CHANGED_PAGES: usize = 6;

    #[test]
    fn losing_everything_puts_back_the_synced_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (power, path, synced, _) = written(dir.path());
        let report = power.cut(Unsynced::Lost).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), synced);
        assert_eq!(
            report,
            CutReport {
                files: 1,
                writes: 4,
                pages_lost: CHANGED_PAGES,
                pages_kept: 0,
                partly_kept: false,
            }
        );
        assert_eq!(
            report.to_string(),
            "4 writes not yet synced in 1 file, all lost: 6 changed pages"
        );
        // What was undone is forgotten: a second cut finds nothing.
        assert_eq!(power.cut(Unsynced::Lost).unwrap(), CutReport::default());
    }

    #[test]
    fn keeping_a_part_keeps_or_loses_whole_pages_and_appends_only_with_the_length() {
        let (mut grown, mut kept_page_1, mut lost_page_1) = (0, 0, 0);
        for seed in 0..64 {
            let dir = tempfile::tempdir().unwrap();
            let (power, path, synced, now) = written(dir.path());
            let report = power.cut(Unsynced::PartlyKept { seed }).unwrap();
            let after = std::fs::read(&path).unwrap();
            assert_eq!(report.pages_kept + report.pages_lost, CHANGED_PAGES);
            assert!(
                after.len() == synced.len() || after.len() == now.len(),
                "seed {seed}: length {}",
                after.len()
            );
            for start in (0..after.len()).step_by(PAGE) {
                let end = (start + PAGE).min(after.len());
                let page = &after[start..end];
                let (was, is) = (padded(&synced, start, end), padded(&now, start, end));
                if end > synced.len() {
                    assert_eq!(page, is, "seed {seed}: an appended page without its data");
                } else {
                    assert!(page == was || page == is, "seed {seed}: page {start} mixed");
                }
            }
            grown += usize::from(after.len() == now.len());
            match &after[PAGE..2 * PAGE] {
                page if page == &now[PAGE..2 * PAGE] => kept_page_1 += 1,
                _ => lost_page_1 += 1,
            }
        }
        assert!(
            grown > 0 && grown < 64,
            "the length was always or never kept"
        );
        assert!(
            kept_page_1 > 0 && lost_page_1 > 0,
            "page 1 was always or never kept"
        );
    }

    #[test]
    fn a_shrunk_file_that_keeps_its_old_length_keeps_its_old_data() {
        let (mut shrunk, mut whole) = (0, 0);
        for seed in 0..32 {
            let dir = tempfile::tempdir().unwrap();
            let synced = vec![b'a'; 3 * PAGE];
            let (mut books, inode, file, path) = synced_file(dir.path(), &synced);
            books.remember(inode, &file, PAGE as u64, None).unwrap();
            file.set_len(PAGE as u64).unwrap();
            power_cut(books).cut(Unsynced::PartlyKept { seed }).unwrap();
            match std::fs::read(&path).unwrap() {
                after if after == synced => whole += 1,
                after if after == synced[..PAGE] => shrunk += 1,
                after => panic!(
                    "seed {seed}: {} bytes, neither length's content",
                    after.len()
                ),
            }
        }
        assert!(
            shrunk > 0 && whole > 0,
            "the length was always or never kept"
        );
    }

    #[test]
    fn the_same_seed_cuts_the_same_way() {
        let cut = |seed| {
            let dir = tempfile::tempdir().unwrap();
            let (power, path, _, _) = written(dir.path());
            let report = power.cut(Unsynced::PartlyKept { seed }).unwrap();
            (report, std::fs::read(&path).unwrap())
        };
        assert_eq!(cut(7), cut(7));
    }

    /// A sync while syncs are held blocks until the power goes, and then fails; without a hold
    /// a sync goes through.
    #[test]
    fn a_held_sync_waits_until_the_power_goes_and_then_fails() {
        let dir = tempfile::tempdir().unwrap();
        let power = power_cut(Books::new(dir.path()));
        // Not held: failing held syncs changes nothing, and a sync completes.
        power.fail_held_syncs();
        assert!(power.gate.pass());
        power.hold_syncs();
        let gate = power.gate.clone();
        let (calling_tx, calling_rx) = std::sync::mpsc::channel();
        let sync = std::thread::spawn(move || {
            calling_tx.send(()).unwrap();
            gate.pass()
        });
        // The sync is under way (not merely a thread not yet started): one that did not wait
        // would be done well within the pause.
        calling_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!sync.is_finished(), "a held sync returned");
        power.fail_held_syncs();
        assert!(
            !sync.join().unwrap(),
            "a sync held until the power went completed"
        );
    }
}
