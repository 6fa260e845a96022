//! Crash-safe persistence of the agent's records: one JSON file per record.
//! Durable writes go to a temporary file, fsync'ed, renamed over the old one
//! and the directory fsync'ed. Volatile writes (records whose subject dies
//! with the machine: endpoint leases) survive a crash of the agent, not of
//! the machine: a new record is renamed into place, an existing one is
//! rewritten with one sub-page write. Either way a reader never sees a torn
//! record after an agent crash. Files that do not parse are reported and
//! skipped (the kernel state and live interfaces are the ground truth the
//! agent reconciles to).

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use serde::{Serialize, de::DeserializeOwned};

/// Store errors.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct StoreError {
    /// What was being done.
    pub what: &'static str,
    /// Path.
    pub path: PathBuf,
    /// Cause.
    #[source]
    pub source: io::Error,
}

fn err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Creates `dir` (and parents) with mode 0700.
pub fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err("creating", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(err("chmod", dir))
}

/// Writes `bytes` to `path` atomically (temp + fsync + rename + dir fsync), mode 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_atomic_mode(path, bytes, 0o600)
}

/// Like [`write_atomic`] with the given file mode. A running copy of the old
/// file (an executing binary) is never modified in place: readers see the
/// old inode or the new one.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    write_synced_and_rename(path, bytes, mode)?;
    sync_dir(dir)
}

/// Up to this many files [`write_atomic_all`] fsyncs one by one; more
/// are synced with one `syncfs` (one fsync ≈ 1 ms here: 10,000 took 14 s).
const FSYNC_EACH_MAX: usize = 32;

/// [`write_atomic`] for many files at once: each written to a temporary
/// file, the filesystem synced once for all of them (`syncfs`: one journal
/// commit instead of one per file; up to [`FSYNC_EACH_MAX`] files are
/// fsync'ed each instead), each renamed into place, then each directory
/// fsync'ed once. After an error some files may be the new ones and others
/// the old ones; none is torn.
pub fn write_atomic_all<'a>(
    files: impl IntoIterator<Item = (&'a Path, &'a [u8])>,
) -> Result<(), StoreError> {
    let files: Vec<(&Path, &[u8])> = files.into_iter().collect();
    if let [(path, bytes)] = files.as_slice() {
        return write_atomic(path, bytes);
    }
    prepare_atomic_all(files)?.finish()
}

/// Files written and synced beside their places, not yet renamed into
/// them ([`prepare_atomic_all`]): the first half of [`write_atomic_all`],
/// which can run while something else decides whether the second
/// ([`Prepared::finish`]) or [`Prepared::abandon`] follows.
#[derive(Debug, Default)]
#[must_use = "finish or abandon the prepared files"]
pub struct Prepared {
    /// (temporary file, its place).
    written: Vec<(PathBuf, PathBuf)>,
    dirs: std::collections::BTreeSet<PathBuf>,
}

/// Writes each file to a temporary file beside its place and syncs them
/// ([`write_atomic_all`]'s way); nothing is renamed. On an error the
/// temporary files written are removed.
pub fn prepare_atomic_all<'a>(
    files: impl IntoIterator<Item = (&'a Path, &'a [u8])>,
) -> Result<Prepared, StoreError> {
    let files: Vec<(&Path, &[u8])> = files.into_iter().collect();
    let parent = |p: &Path| p.parent().unwrap_or(Path::new(".")).to_owned();
    let mut prepared = Prepared {
        written: Vec::with_capacity(files.len()),
        dirs: files.iter().map(|(p, _)| parent(p)).collect(),
    };
    // A few files: each fsync'ed (a filesystem sync also flushes whatever
    // else is dirty on it — 100+ ms on a busy machine for 4 files).
    let each = files.len() <= FSYNC_EACH_MAX;
    for (path, bytes) in &files {
        match write_tmp(path, bytes, 0o600, each) {
            Ok(tmp) => prepared.written.push((tmp, path.to_path_buf())),
            Err(e) => {
                prepared.abandon();
                return Err(e);
            }
        }
    }
    if !each {
        let synced = prepared.dirs.iter().try_for_each(|dir| {
            let d = File::open(dir).map_err(err("opening", dir))?;
            nix::unistd::syncfs(&d).map_err(|e| err("syncing the filesystem of", dir)(e.into()))
        });
        if let Err(e) = synced {
            prepared.abandon();
            return Err(e);
        }
    }
    Ok(prepared)
}

impl Prepared {
    /// Renames each file into place, then fsyncs each directory once.
    pub fn finish(self) -> Result<(), StoreError> {
        for (tmp, path) in &self.written {
            fs::rename(tmp, path).map_err(err("renaming into place", path))?;
        }
        self.dirs.iter().try_for_each(|d| sync_dir(d))
    }

    /// Removes the temporary files (the places keep what they held).
    pub fn abandon(self) {
        for (tmp, _) in &self.written {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// Removes files durably: each unlinked (a missing one is no error), then
/// each directory fsync'ed once.
pub fn remove_all_synced<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<(), StoreError> {
    let mut dirs = std::collections::BTreeSet::new();
    for path in paths {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("removing", path)(e)),
        }
        dirs.insert(path.parent().unwrap_or(Path::new(".")).to_owned());
    }
    dirs.iter().try_for_each(|d| sync_dir(d))
}

/// Writes `bytes` to a temporary file beside `path` (mode `mode`),
/// fsync's it and renames it over `path`; the directory is not synced.
fn write_synced_and_rename(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StoreError> {
    let tmp = write_tmp(path, bytes, mode, true)?;
    fs::rename(&tmp, path).map_err(err("renaming into place", path))
}

/// Writes `bytes` to `.<name>.tmp` beside `path` (mode `mode`), fsync'ed
/// when `sync`; returns the temporary file's path.
fn write_tmp(path: &Path, bytes: &[u8], mode: u32, sync: bool) -> Result<PathBuf, StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err("creating", &tmp))?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(err("chmod", &tmp))?;
    f.write_all(bytes).map_err(err("writing", &tmp))?;
    if sync {
        f.sync_all().map_err(err("syncing", &tmp))?;
    }
    Ok(tmp)
}

/// fsync's the directory `dir` (what makes a rename or unlink in it durable).
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err("syncing directory", dir))
}

/// Size below which one `pwrite` at offset 0 is not torn by a crash of the
/// writing process (it stays within one page of the page cache).
const PAGE: usize = 4096;

/// Overwrites `f` with `bytes`, padded with spaces (which JSON readers
/// skip) to the file's current length, in one write — only when the result
/// fits in one page. Returns the bytes back, unwritten, when it does not
/// (the new content or the old file is larger than a page: padding to the
/// old length would not be one sub-page write, and padding less would leave
/// the old file's tail behind the new record).
fn write_padded(f: &File, path: &Path, mut bytes: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
    use std::os::unix::fs::FileExt as _;
    let old = f
        .metadata()
        .map_err(err("reading metadata of", path))?
        .len();
    let old = usize::try_from(old).unwrap_or(usize::MAX);
    if bytes.len().max(old) > PAGE {
        return Ok(Some(bytes));
    }
    if bytes.len() < old {
        bytes.resize(old, b' ');
    }
    f.write_all_at(&bytes, 0).map_err(err("writing", path))?;
    Ok(None)
}

/// Replaces `path` with `bytes` (mode 0600) by a rename, without fsync: a
/// reader sees the old file or the new one, never a mix.
fn replace_volatile(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, bytes).map_err(err("writing", &tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).map_err(err("chmod", &tmp))?;
    fs::rename(&tmp, path).map_err(err("renaming into place", path))
}

/// Writes `bytes` to the small file `path` in place (created if missing),
/// without rename or fsync: for hints that may be lost or garbled by a
/// machine crash, where a torn or missing file is read as "no hint".
pub fn write_hint(path: &Path, bytes: Vec<u8>) -> Result<(), StoreError> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(err("opening", path))?;
    match write_padded(&f, path, bytes)? {
        None => Ok(()),
        Some(bytes) => replace_volatile(path, &bytes),
    }
}

/// Records that parsed (with their keys) and files that did not.
pub type Loaded<T> = (Vec<(String, T)>, Vec<PathBuf>);

/// A directory of JSON records, one file per key.
#[derive(Debug, Clone)]
pub struct RecordDir {
    dir: PathBuf,
}

impl RecordDir {
    /// Opens (creating, 0700) the directory.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        create_private_dir(&dir)?;
        Ok(Self { dir })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// Writes the record `key` durably (fsync'ed before and after the rename).
    pub fn save<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let path = self.path(key);
        let bytes = serde_json::to_vec_pretty(value)
            .map_err(|e| err("serializing", &path)(io::Error::other(e)))?;
        write_atomic(&path, &bytes)
    }

    /// Writes the record `key` atomically but without fsync: it survives a
    /// crash of this process (the page cache is the kernel's), not one of
    /// the machine. Used for records whose subject dies with the machine
    /// anyway (a pending attachment: its veth and netns do not survive a
    /// reboot either).
    pub fn save_volatile<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let path = self.path(key);
        let bytes = serde_json::to_vec_pretty(value)
            .map_err(|e| err("serializing", &path)(io::Error::other(e)))?;
        replace_volatile(&path, &bytes)
    }

    /// Rewrites the existing record `key` in place, without fsync: one
    /// write of at most 4096 bytes at offset 0, padded with spaces to the
    /// old length, which a crash of this process cannot tear. Much cheaper
    /// than a rename over the old file (which makes ext4 start writeback of
    /// the new one, `auto_da_alloc`). Falls back to [`Self::save_volatile`]
    /// when the record is missing or the new or the old one is larger than
    /// a page.
    pub fn rewrite_volatile<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let path = self.path(key);
        let bytes = serde_json::to_vec_pretty(value)
            .map_err(|e| err("serializing", &path)(io::Error::other(e)))?;
        if bytes.len() >= PAGE {
            return self.save_volatile(key, value);
        }
        match OpenOptions::new().write(true).open(&path) {
            Ok(f) => match write_padded(&f, &path, bytes)? {
                None => Ok(()),
                Some(bytes) => replace_volatile(&path, &bytes),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.save_volatile(key, value),
            Err(e) => Err(err("opening", &path)(e)),
        }
    }

    /// Removes the record `key`; false if it did not exist.
    pub fn remove(&self, key: &str) -> Result<bool, StoreError> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(err("removing", &path)(e)),
        }
    }

    /// Every record that parses, with its key; unreadable or corrupt files
    /// are returned separately by path (and left in place for inspection).
    pub fn load_all<T: DeserializeOwned>(&self) -> Result<Loaded<T>, StoreError> {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(err("listing", &self.dir))? {
            let entry = entry.map_err(err("listing", &self.dir))?;
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.starts_with('.') && name.ends_with(".tmp") {
                // A temporary file from an interrupted write: the rename never
                // happened, so the old record (if any) is still in place.
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(key) = name.strip_suffix(".json") else {
                continue;
            };
            match fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(v) => good.push((key.to_owned(), v)),
                Err(_) => bad.push(path),
            }
        }
        good.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((good, bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rivet-store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn save_load_remove() {
        let d = tmpdir("slr");
        let store = RecordDir::open(&d).expect("open");
        store.save("a", &vec![1, 2, 3]).expect("save");
        store.save("b", &vec![4]).expect("save");
        store.save("a", &vec![9]).expect("overwrite");
        let (good, bad) = store.load_all::<Vec<u32>>().expect("load");
        assert_eq!(good, vec![("a".into(), vec![9]), ("b".into(), vec![4])]);
        assert!(bad.is_empty());
        assert!(store.remove("a").expect("remove"));
        assert!(!store.remove("a").expect("remove twice"));
        let mode = fs::metadata(d.join("b.json"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let dmode = fs::metadata(&d).expect("meta").permissions().mode();
        assert_eq!(dmode & 0o777, 0o700);
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn rewrite_in_place_pads_a_shorter_record() {
        let d = tmpdir("rw");
        let store = RecordDir::open(&d).expect("open");
        store.save_volatile("a", &"x".repeat(40)).expect("save");
        store
            .rewrite_volatile("a", &"y".repeat(10))
            .expect("shorter");
        let (good, _) = store.load_all::<String>().expect("load");
        assert_eq!(good, vec![("a".into(), "y".repeat(10))]);
        store
            .rewrite_volatile("a", &"z".repeat(60))
            .expect("longer");
        store
            .rewrite_volatile("new", &"n".to_owned())
            .expect("missing");
        let (good, _) = store.load_all::<String>().expect("load");
        assert_eq!(
            good,
            vec![("a".into(), "z".repeat(60)), ("new".into(), "n".into())]
        );
        let hint = d.join("hint");
        write_hint(&hint, b"[1,2,3]".to_vec()).expect("hint");
        write_hint(&hint, b"[4]".to_vec()).expect("shorter hint");
        let v: Vec<u32> = serde_json::from_slice(&fs::read(&hint).expect("read")).expect("parse");
        assert_eq!(v, vec![4]);
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn rewriting_a_record_larger_than_a_page_leaves_no_tail() {
        // A pending record over a page whose ready version fits in one
        // (`"ready"` is shorter than `"pending"`): the in-place rewrite
        // must not leave the old record's last bytes behind.
        let d = tmpdir("page");
        let store = RecordDir::open(&d).expect("open");
        for (old, new) in [(PAGE + 1, PAGE - 2), (PAGE + 40, PAGE - 10), (3 * PAGE, 10)] {
            // A JSON string of n bytes is n - 2 characters between quotes.
            store
                .save_volatile("a", &"o".repeat(old - 2))
                .expect("save");
            assert_eq!(
                fs::metadata(d.join("a.json")).expect("meta").len(),
                old as u64
            );
            store
                .rewrite_volatile("a", &"n".repeat(new - 2))
                .expect("rewrite");
            let (good, bad) = store.load_all::<String>().expect("load");
            assert!(
                bad.is_empty(),
                "{old} -> {new}: the record no longer parses"
            );
            assert_eq!(good.len(), 1, "{old} -> {new}");
            assert!(good[0].1 == "n".repeat(new - 2), "{old} -> {new}");
        }
        let hint = d.join("hint");
        write_hint(&hint, serde_json::to_vec(&vec![7u32; 2000]).expect("json")).expect("big");
        write_hint(&hint, b"[4]".to_vec()).expect("shorter hint");
        let v: Vec<u32> = serde_json::from_slice(&fs::read(&hint).expect("read")).expect("parse");
        assert_eq!(v, vec![4]);
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn many_files_at_once() {
        let d = tmpdir("all");
        create_private_dir(&d.join("a")).expect("dir");
        create_private_dir(&d.join("b")).expect("dir");
        let (a1, a2, b1) = (d.join("a/1.json"), d.join("a/2.json"), d.join("b/1.json"));
        fs::write(&a1, b"old").expect("an old file");
        write_atomic_all([
            (a1.as_path(), b"[1]".as_slice()),
            (a2.as_path(), b"[2]".as_slice()),
            (b1.as_path(), b"[3]".as_slice()),
        ])
        .expect("write");
        for (path, text) in [(&a1, "[1]"), (&a2, "[2]"), (&b1, "[3]")] {
            assert_eq!(fs::read_to_string(path).expect("read"), text);
            let mode = fs::metadata(path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
        let left: Vec<_> = fs::read_dir(d.join("a"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left.len(), 2, "temporary files left: {left:?}");
        // One file alone, then a directory that does not exist.
        write_atomic_all([(a2.as_path(), b"[4]".as_slice())]).expect("one");
        assert_eq!(fs::read_to_string(&a2).expect("read"), "[4]");
        let nowhere = d.join("none/1.json");
        assert!(
            write_atomic_all([
                (a1.as_path(), b"".as_slice()),
                (nowhere.as_path(), b"".as_slice())
            ])
            .is_err()
        );
        assert_eq!(
            fs::read_to_string(&a1).expect("read"),
            "[1]",
            "nothing renamed"
        );
        assert_eq!(
            fs::read_dir(d.join("a")).expect("list").count(),
            2,
            "temporary files cleaned"
        );

        remove_all_synced([
            a1.as_path(),
            a2.as_path(),
            d.join("a/missing.json").as_path(),
        ])
        .expect("remove");
        assert!(!a1.exists() && !a2.exists() && b1.exists());
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn corrupt_and_truncated_files_are_reported() {
        let d = tmpdir("bad");
        let store = RecordDir::open(&d).expect("open");
        store.save("ok", &vec![1]).expect("save");
        fs::write(d.join("torn.json"), b"[1, 2").expect("write");
        fs::write(d.join(".ok.json.tmp"), b"[7]").expect("write");
        let (good, bad) = store.load_all::<Vec<u32>>().expect("load");
        assert_eq!(good, vec![("ok".into(), vec![1])]);
        assert_eq!(bad, vec![d.join("torn.json")]);
        assert!(!d.join(".ok.json.tmp").exists());
        fs::remove_dir_all(&d).expect("cleanup");
    }
}
