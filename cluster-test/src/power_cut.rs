//! A directory that can lose power: a FUSE pass-through onto a backing directory which remembers,
//! for every file, what each write since that file's last `fsync` / `fdatasync` overwrote, so
//! that [`PowerCut::cut`] can put every file back to what was last made durable.
//!
//! SIGKILL leaves the kernel's page cache intact, so a crash test with SIGKILL alone cannot tell
//! a write that reached the disk from one that only reached the cache. A real power loss drops
//! the cache; so does a cut here.
//!
//! The model is the weakest a program may rely on for file data: bytes written to a file are
//! durable only once a sync of that file returns. Names are treated as durable at once (a file
//! created, renamed or removed stays so across a cut), so the model checks the syncing of data,
//! not of directories. It serves one test at a time: no hard links, symlinks or special files.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

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

/// What a cut undid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files put back to their last synced content.
    pub files: usize,
    /// Writes and truncations undone.
    pub writes: usize,
}

/// The handle a test keeps: cuts the power of the mounted directory.
#[derive(Clone)]
pub struct PowerCut {
    books: Arc<Mutex<Books>>,
}

impl PowerCut {
    /// Puts every file back to what it held when it was last synced (undoing, newest first,
    /// every write since). Call it only once nothing writes any more (the writers are dead).
    pub fn cut(&self) -> io::Result<CutReport> {
        let mut books = lock(&self.books);
        let mut report = CutReport::default();
        let unsynced = std::mem::take(&mut books.unsynced);
        for (inode, undos) in unsynced {
            let Some(path) = books.paths.get(&inode) else {
                continue;
            };
            let file = OpenOptions::new().write(true).open(path)?;
            report.files += 1;
            for undo in undos.iter().rev() {
                file.set_len(undo.len_before)?;
                file.write_all_at(&undo.old, undo.offset)?;
                report.writes += 1;
            }
        }
        Ok(report)
    }
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
        let fs = PowerCutFs {
            books: books.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("baton-power-cut".into())];
        config.n_threads = Some(2);
        let session = fuser::spawn_mount(fs, mountpoint, &config)?;
        Ok(Self {
            session: Some(session),
            power: PowerCut { books },
        })
    }

    /// The handle that cuts the power.
    pub fn power(&self) -> PowerCut {
        self.power.clone()
    }

    /// Unmounts and waits for the file system's thread.
    pub fn unmount(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(session) => session.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
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
    let meta = std::fs::symlink_metadata(path)?;
    let kind = if meta.is_dir() {
        FileType::Directory
    } else {
        FileType::RegularFile
    };
    let time = |secs: i64, nanos: i64| {
        UNIX_EPOCH + Duration::new(u64::try_from(secs).unwrap_or(0), nanos as u32)
    };
    Ok(FileAttr {
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
    })
}

/// The FUSE side. Every call takes the bookkeeping lock for its whole length, so writes and
/// their undo records are in one order.
struct PowerCutFs {
    books: Arc<Mutex<Books>>,
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

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let path = lock(&self.books).path(ino);
        match path.and_then(|path| attr(ino.0, &path).map_err(Errno::from)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(errno) => reply.error(errno),
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
            let path = books.path(ino)?;
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
    /// synced for real: the cut is simulated, and skipping it keeps the tests fast.)
    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
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
