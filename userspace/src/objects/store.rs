//! The durable store of objects: one JSON file per object under
//! `<state_dir>/objects/` (layout in the [module docs](super)), the whole
//! set in memory. A change is staged first ([`ObjectStore::stage_apply`],
//! [`ObjectStore::stage_delete`]: the resulting set and each object's
//! outcome, nothing written), then committed ([`ObjectStore::commit`]:
//! files written and synced, the set swapped).

use std::{
    collections::BTreeSet,
    fmt, fs,
    io::Read as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::{Kind, Object, ObjectKey, ObjectSet, parse_object_text};
use crate::store::{self, StoreError};

/// What a change did to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It was new.
    Created,
    /// It replaced a different stored object.
    Configured,
    /// It equals the stored object (nothing written).
    Unchanged,
    /// It was removed.
    Deleted,
    /// A removal found nothing to remove.
    NotFound,
}

impl Outcome {
    /// `created`, `configured`, `unchanged`, `deleted`, `not found`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Configured => "configured",
            Self::Unchanged => "unchanged",
            Self::Deleted => "deleted",
            Self::NotFound => "not found",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a commit failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    /// A file could not be written or removed. The set then holds what
    /// the files hold (read back).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The change was staged against a set that changed since.
    #[error("the change was staged against an older state of the object store")]
    Stale,
}

/// A change computed but not written: the set it leads to and what it
/// does to each object.
#[derive(Debug)]
pub struct Staged {
    base: u64,
    next: ObjectSet,
    results: Vec<(ObjectKey, Outcome)>,
    writes: BTreeSet<ObjectKey>,
    removes: BTreeSet<ObjectKey>,
}

impl Staged {
    /// The set the store holds once this is committed.
    pub fn objects(&self) -> &ObjectSet {
        &self.next
    }

    /// Each object named by the change, in the order given, with its outcome.
    pub fn results(&self) -> &[(ObjectKey, Outcome)] {
        &self.results
    }

    /// Files the commit writes or removes (0: the change changes nothing).
    pub fn changes(&self) -> usize {
        self.writes.len() + self.removes.len()
    }
}

/// The objects, in memory and on disk.
#[derive(Debug)]
pub struct ObjectStore {
    dir: PathBuf,
    set: ObjectSet,
    /// Commits so far (what a [`Staged`] was computed against).
    generation: u64,
    skipped: Vec<(PathBuf, String)>,
}

impl ObjectStore {
    /// Opens (creating, 0700) the store in `dir` and reads every object
    /// back. A file that does not parse or validate, or does not sit where
    /// its object belongs, is logged and skipped (left in place).
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        store::create_private_dir(&dir)?;
        let (set, skipped) = load(&dir)?;
        for (path, why) in &skipped {
            tracing::warn!(file = %path.display(), reason = %why, "object file skipped");
        }
        Ok(Self {
            dir,
            set,
            generation: 0,
            skipped,
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The objects stored.
    pub fn objects(&self) -> &ObjectSet {
        &self.set
    }

    /// Files `open` skipped, with the reason.
    pub fn skipped(&self) -> &[(PathBuf, String)] {
        &self.skipped
    }

    /// Where the object `key` is kept.
    pub fn path_of(&self, key: &ObjectKey) -> PathBuf {
        path_in(&self.dir, key)
    }

    /// Stages storing `objects` (validated ones: see
    /// [`super::parse_document`]): each is created, configured or
    /// unchanged. A new object gets a `metadata.uid` and
    /// `metadata.creationTimestamp` unless it has them; a replaced one
    /// keeps the stored object's.
    pub fn stage_apply(&self, objects: Vec<Object>) -> Staged {
        let mut staged = self.staged();
        Self::apply_into(&mut staged, objects);
        staged
    }

    /// Stages removing the objects `keys` name: each deleted or not found.
    pub fn stage_delete(&self, keys: Vec<ObjectKey>) -> Staged {
        let mut staged = self.staged();
        Self::delete_into(&mut staged, keys);
        staged
    }

    /// Stages one batch of a source's changes: `applied` stored as
    /// [`Self::stage_apply`] does, then `deleted` removed.
    pub fn stage_changes(&self, applied: Vec<Object>, deleted: Vec<ObjectKey>) -> Staged {
        let mut staged = self.staged();
        Self::apply_into(&mut staged, applied);
        Self::delete_into(&mut staged, deleted);
        staged
    }

    /// Stages `objects` as the complete set of `kind` (a source's list):
    /// each stored as [`Self::stage_apply`] does, and every stored object
    /// of `kind` not among them removed. Objects equal to the stored ones
    /// change nothing.
    pub fn stage_replace(&self, kind: Kind, objects: Vec<Object>) -> Staged {
        let listed: BTreeSet<ObjectKey> = objects.iter().map(Object::key).collect();
        let gone: Vec<ObjectKey> = self
            .set
            .of_kind(kind)
            .map(|o| o.key())
            .filter(|k| !listed.contains(k))
            .collect();
        self.stage_changes(objects, gone)
    }

    fn apply_into(staged: &mut Staged, objects: Vec<Object>) {
        for mut object in objects {
            let key = object.key();
            let outcome = match staged.next.get(&key) {
                None => {
                    stamp(&mut object);
                    Outcome::Created
                }
                Some(old) => {
                    let (uid, created) = {
                        let meta = old.metadata();
                        (meta.uid.clone(), meta.creation_timestamp.clone())
                    };
                    let meta = object.metadata_mut();
                    meta.uid = uid;
                    meta.creation_timestamp = created;
                    stamp(&mut object);
                    if **old == object {
                        Outcome::Unchanged
                    } else {
                        Outcome::Configured
                    }
                }
            };
            if outcome != Outcome::Unchanged {
                staged.removes.remove(&key);
                staged.writes.insert(key.clone());
                staged.next.insert(Arc::new(object));
            }
            staged.results.push((key, outcome));
        }
    }

    fn delete_into(staged: &mut Staged, keys: Vec<ObjectKey>) {
        for key in keys {
            let outcome = if staged.next.remove(&key).is_some() {
                staged.writes.remove(&key);
                staged.removes.insert(key.clone());
                Outcome::Deleted
            } else {
                Outcome::NotFound
            };
            staged.results.push((key, outcome));
        }
    }

    fn staged(&self) -> Staged {
        Staged {
            base: self.generation,
            next: self.set.clone(),
            results: Vec::new(),
            writes: BTreeSet::new(),
            removes: BTreeSet::new(),
        }
    }

    /// Writes a staged change (files written and synced, removed files
    /// unlinked, their directories synced) and makes its set the store's.
    /// On a write error the set is read back from the files, which may
    /// hold part of the change.
    pub fn commit(&mut self, staged: Staged) -> Result<(), ObjectStoreError> {
        if staged.base != self.generation {
            return Err(ObjectStoreError::Stale);
        }
        let prepared = staged.prepare(&self.dir);
        self.commit_prepared(staged, prepared)
    }

    /// [`ObjectStore::commit`] of a change whose files
    /// [`Staged::prepare`] wrote aside (in this store's directory) while
    /// the change was being checked: they are renamed into place and the
    /// removals done; a failed preparation fails the commit as a failed
    /// write does.
    pub fn commit_prepared(
        &mut self,
        staged: Staged,
        prepared: Result<store::Prepared, StoreError>,
    ) -> Result<(), ObjectStoreError> {
        if staged.base != self.generation {
            if let Ok(p) = prepared {
                p.abandon();
            }
            return Err(ObjectStoreError::Stale);
        }
        self.generation += 1;
        let written = prepared.and_then(|p| {
            p.finish()?;
            let removed: Vec<PathBuf> = staged.removes.iter().map(|k| self.path_of(k)).collect();
            store::remove_all_synced(removed.iter().map(PathBuf::as_path))
        });
        match written {
            Ok(()) => {
                self.set = staged.next;
                Ok(())
            }
            Err(e) => {
                match load(&self.dir) {
                    Ok((set, _)) => self.set = set,
                    Err(reload) => {
                        tracing::warn!(error = %reload, "reading the object store back after a failed write");
                    }
                }
                Err(e.into())
            }
        }
    }
}

impl Staged {
    /// The first half of a commit to the store in `dir`, which can run
    /// while the change is checked: each object written serialized to a
    /// temporary file beside its place and synced, nothing renamed or
    /// removed ([`ObjectStore::commit_prepared`] does that, or
    /// [`store::Prepared::abandon`] drops them).
    pub fn prepare(&self, dir: &Path) -> Result<store::Prepared, StoreError> {
        let mut files = Vec::with_capacity(self.writes.len());
        let mut dirs = BTreeSet::new();
        for key in &self.writes {
            let Some(object) = self.next.get(key) else {
                continue;
            };
            let path = path_in(dir, key);
            let bytes = serde_json::to_vec_pretty(&**object).map_err(|e| StoreError {
                what: "serializing",
                path: path.clone(),
                source: std::io::Error::other(e),
            })?;
            if let Some(parent) = path.parent() {
                dirs.insert(parent.to_owned());
            }
            files.push((path, bytes));
        }
        for dir in &dirs {
            store::create_private_dir(dir)?;
        }
        store::prepare_atomic_all(files.iter().map(|(p, b)| (p.as_path(), b.as_slice())))
    }
}

/// Where the object `key` is kept in the store at `dir`.
fn path_in(dir: &Path, key: &ObjectKey) -> PathBuf {
    let dir = dir.join(key.kind.plural());
    let dir = if key.kind.namespaced() {
        dir.join(&key.namespace)
    } else {
        dir
    };
    dir.join(format!("{}.json", key.name))
}

/// Gives a new object the uid and creation time the API server would.
fn stamp(object: &mut Object) {
    let meta = object.metadata_mut();
    if meta.uid.as_deref().is_none_or(str::is_empty) {
        meta.uid = Some(new_uid());
    }
    if meta.creation_timestamp.is_none() {
        // Kubernetes keeps whole seconds (and writes no more).
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        meta.creation_timestamp = Timestamp::from_second(now).ok().map(Time);
    }
}

/// A random UUID (version 4), as the API server gives objects.
fn new_uid() -> String {
    let mut b = [0u8; 16];
    let random = fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if random.is_err() {
        // No /dev/urandom: the clock and a per-process hash seed instead.
        use std::hash::{BuildHasher as _, Hasher as _};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let hi = h.finish();
        h.write_u64(hi);
        b[..8].copy_from_slice(&hi.to_le_bytes());
        b[8..].copy_from_slice(&h.finish().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Every object under `dir`, and the files (or directories that cannot
/// be listed) skipped, with the reason.
fn load(dir: &Path) -> Result<(ObjectSet, Vec<(PathBuf, String)>), StoreError> {
    list(dir)?;
    let mut set = ObjectSet::new();
    let mut skipped = Vec::new();
    for kind in Kind::ALL {
        let kind_dir = dir.join(kind.plural());
        if !kind_dir.is_dir() {
            continue;
        }
        let dirs = if kind.namespaced() {
            match list(&kind_dir) {
                Ok(namespaces) => namespaces,
                Err(e) => {
                    skipped.push((kind_dir, e.to_string()));
                    continue;
                }
            }
        } else {
            vec![kind_dir]
        };
        for d in dirs {
            if !d.is_dir() {
                skipped.push((d, "not a namespace directory".to_owned()));
                continue;
            }
            let namespace = if kind.namespaced() {
                file_name(&d)
            } else {
                String::new()
            };
            if let Err(e) = load_dir(&d, kind, &namespace, &mut set, &mut skipped) {
                skipped.push((d, e.to_string()));
            }
        }
    }
    Ok((set, skipped))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn list(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let listing_err = |source| StoreError {
        what: "listing",
        path: dir.to_owned(),
        source,
    };
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(listing_err)? {
        paths.push(entry.map_err(listing_err)?.path());
    }
    paths.sort();
    Ok(paths)
}

/// The objects of `kind` in `namespace`, one file each in `dir`.
fn load_dir(
    dir: &Path,
    kind: Kind,
    namespace: &str,
    set: &mut ObjectSet,
    skipped: &mut Vec<(PathBuf, String)>,
) -> Result<(), StoreError> {
    for path in list(dir)? {
        let name = file_name(&path);
        if name.starts_with('.') && name.ends_with(".tmp") {
            // An interrupted write: the rename never happened.
            let _ = fs::remove_file(&path);
            continue;
        }
        let Some(stem) = name.strip_suffix(".json") else {
            skipped.push((path, "not a .json file".to_owned()));
            continue;
        };
        let read = fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                parse_object_text(&text).map_err(|errors| {
                    errors
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                })
            });
        match read {
            Ok(object) => {
                let key = object.key();
                let expected = ObjectKey::new(kind, namespace, stem);
                if key == expected {
                    set.insert(Arc::new(object));
                } else {
                    skipped.push((path, format!("holds {key}, not {expected}")));
                }
            }
            Err(why) => skipped.push((path, why)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::parse_document;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rivet-objects-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    const DOC: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: prod}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: prod}
spec:
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: prod
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.1.0.5]
ports: [{port: 8080}]
";

    fn objects(text: &str) -> Vec<Object> {
        parse_document(text).expect("valid document")
    }

    fn outcomes(staged: &Staged) -> Vec<(String, Outcome)> {
        staged
            .results()
            .iter()
            .map(|(k, o)| (k.to_string(), *o))
            .collect()
    }

    #[test]
    fn apply_reapply_configure_delete() {
        let d = tmpdir("cycle");
        let mut store = ObjectStore::open(&d).expect("open");
        assert!(store.objects().is_empty());

        let staged = store.stage_apply(objects(DOC));
        assert_eq!(
            outcomes(&staged),
            [
                ("Namespace prod".to_owned(), Outcome::Created),
                ("Service prod/web".to_owned(), Outcome::Created),
                ("EndpointSlice prod/web-1".to_owned(), Outcome::Created),
            ]
        );
        assert_eq!(staged.objects().len(), 3);
        // Staging writes nothing.
        assert!(store.objects().is_empty());
        assert!(
            !store
                .path_of(&ObjectKey::new(Kind::Service, "prod", "web"))
                .exists()
        );
        store.commit(staged).expect("commit");
        assert_eq!(store.objects().len(), 3);
        let svc_path = d.join("services/prod/web.json");
        let ns_path = d.join("namespaces/prod.json");
        assert!(svc_path.is_file() && ns_path.is_file());
        assert!(d.join("endpointslices/prod/web-1.json").is_file());
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(&svc_path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        // Stamped at creation.
        let key = ObjectKey::new(Kind::Service, "prod", "web");
        let stored = Arc::clone(store.objects().get(&key).expect("stored"));
        let uid = stored.metadata().uid.clone().expect("uid");
        assert_eq!(uid.len(), 36, "{uid}");
        assert_eq!(&uid[14..15], "4", "{uid}");
        assert!(stored.metadata().creation_timestamp.is_some());
        let on_disk: serde_json::Value =
            serde_json::from_slice(&fs::read(&svc_path).expect("read")).expect("json");
        assert_eq!(on_disk["kind"], "Service");
        assert_eq!(on_disk["apiVersion"], "v1");
        assert_eq!(on_disk["metadata"]["uid"], uid.as_str());

        // The same again: unchanged, nothing rewritten.
        let before = fs::metadata(&svc_path)
            .expect("meta")
            .modified()
            .expect("mtime");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let staged = store.stage_apply(objects(DOC));
        assert!(
            outcomes(&staged)
                .iter()
                .all(|(_, o)| *o == Outcome::Unchanged)
        );
        assert_eq!(staged.changes(), 0);
        store.commit(staged).expect("commit");
        let after = fs::metadata(&svc_path)
            .expect("meta")
            .modified()
            .expect("mtime");
        assert_eq!(before, after, "an unchanged object was rewritten");

        // A changed port: configured; uid and creation time kept.
        let changed = DOC.replace("ports: [{port: 80}]", "ports: [{port: 81}]");
        let staged = store.stage_apply(objects(&changed));
        assert_eq!(
            outcomes(&staged)[1],
            ("Service prod/web".to_owned(), Outcome::Configured)
        );
        assert_eq!(staged.changes(), 1);
        store.commit(staged).expect("commit");
        let now = store.objects().get(&key).expect("stored");
        assert_eq!(now.metadata().uid.as_deref(), Some(uid.as_str()));
        assert_eq!(
            now.metadata().creation_timestamp,
            stored.metadata().creation_timestamp
        );
        let port = now
            .as_service()
            .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first().map(|p| p.port));
        assert_eq!(port, Some(81));

        // Delete: deleted, then not found.
        let staged = store.stage_delete(vec![
            key.clone(),
            ObjectKey::new(Kind::Service, "prod", "other"),
        ]);
        assert_eq!(
            outcomes(&staged),
            [
                ("Service prod/web".to_owned(), Outcome::Deleted),
                ("Service prod/other".to_owned(), Outcome::NotFound),
            ]
        );
        assert!(staged.objects().get(&key).is_none());
        assert!(svc_path.exists(), "staging removed a file");
        store.commit(staged).expect("commit");
        assert!(!svc_path.exists());
        assert_eq!(store.objects().len(), 2);
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn a_stale_stage_is_refused() {
        let d = tmpdir("stale");
        let mut store = ObjectStore::open(&d).expect("open");
        let first = store.stage_apply(objects(DOC));
        let second = store.stage_delete(vec![ObjectKey::new(Kind::Namespace, "", "prod")]);
        store.commit(first).expect("commit");
        assert!(matches!(store.commit(second), Err(ObjectStoreError::Stale)));
        assert_eq!(store.objects().len(), 3);
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn a_prepared_change_is_renamed_into_place_or_abandoned() {
        let d = tmpdir("prepared");
        let mut store = ObjectStore::open(&d).expect("open");
        let tmp_files = |d: &Path| -> usize {
            let mut n = 0;
            let mut dirs = vec![d.to_path_buf()];
            while let Some(dir) = dirs.pop() {
                for e in fs::read_dir(&dir).expect("listing").flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if e.path().is_dir() {
                        dirs.push(e.path());
                    } else if name.ends_with(".tmp") {
                        n += 1;
                    }
                }
            }
            n
        };
        // Abandoned: nothing stored, no file left behind.
        let staged = store.stage_apply(objects(DOC));
        let prepared = staged.prepare(store.dir()).expect("prepared");
        assert_eq!(tmp_files(&d), 3, "written aside");
        prepared.abandon();
        assert_eq!(tmp_files(&d), 0);
        assert!(store.objects().is_empty());
        // Committed: as a plain commit, and read back the same.
        let staged = store.stage_apply(objects(DOC));
        let prepared = staged.prepare(store.dir());
        store.commit_prepared(staged, prepared).expect("commit");
        assert_eq!(store.objects().len(), 3);
        assert_eq!(tmp_files(&d), 0);
        let reopened = ObjectStore::open(&d).expect("reopen");
        assert_eq!(reopened.objects(), store.objects());
        // Prepared against an older state: refused, nothing left behind.
        let first = store.stage_delete(vec![ObjectKey::new(Kind::Namespace, "", "prod")]);
        let second = store.stage_apply(objects(DOC));
        store.commit(first).expect("commit");
        let prepared = second.prepare(store.dir());
        assert!(matches!(
            store.commit_prepared(second, prepared),
            Err(ObjectStoreError::Stale)
        ));
        assert_eq!(tmp_files(&d), 0);
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn objects_survive_a_reopen_and_bad_files_are_skipped() {
        let d = tmpdir("reopen");
        let mut store = ObjectStore::open(&d).expect("open");
        store
            .commit(store.stage_apply(objects(DOC)))
            .expect("commit");
        let before = store.objects().clone();
        drop(store);

        // A torn file, a file that does not validate, one in the wrong
        // place, an interrupted write, a stray file.
        fs::write(
            d.join("services/prod/torn.json"),
            b"{\"apiVersion\": \"v1\", ",
        )
        .expect("w");
        fs::write(
            d.join("services/prod/bad.json"),
            br#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"bad","namespace":"prod"},"spec":{"ports":[{"port":0}]}}"#,
        )
        .expect("w");
        fs::write(
            d.join("services/prod/moved.json"),
            br#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"elsewhere","namespace":"prod"}}"#,
        )
        .expect("w");
        fs::write(d.join("services/prod/.web.json.tmp"), b"{").expect("w");
        fs::write(d.join("services/prod/notes.txt"), b"hi").expect("w");

        let store = ObjectStore::open(&d).expect("reopen");
        assert_eq!(
            store.objects(),
            &before,
            "what was stored is read back as it was"
        );
        let skipped: Vec<String> = store
            .skipped()
            .iter()
            .map(|(p, why)| format!("{}: {why}", file_name(p)))
            .collect();
        assert_eq!(skipped.len(), 4, "{skipped:?}");
        assert!(
            skipped[0].starts_with("bad.json: Service prod/bad: spec.ports[0].port: "),
            "{skipped:?}"
        );
        assert!(
            skipped[1].starts_with("moved.json: holds Service prod/elsewhere"),
            "{skipped:?}"
        );
        assert!(
            skipped[2].starts_with("notes.txt: not a .json file"),
            "{skipped:?}"
        );
        assert!(
            skipped[3].starts_with("torn.json: invalid JSON: EOF"),
            "{skipped:?}"
        );
        assert!(!d.join("services/prod/.web.json.tmp").exists());

        // Re-applying after the reopen: unchanged (uid and time kept).
        let staged = store.stage_apply(objects(DOC));
        assert!(
            staged
                .results()
                .iter()
                .all(|(_, o)| *o == Outcome::Unchanged),
            "{:?}",
            staged.results()
        );
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn a_failed_write_leaves_the_set_as_the_files_are() {
        let d = tmpdir("fail");
        let mut store = ObjectStore::open(&d).expect("open");
        // A file where the Services' directory must go.
        fs::write(d.join("services"), b"").expect("w");
        let staged = store.stage_apply(objects(DOC));
        let e = store.commit(staged).expect_err("cannot write");
        assert!(matches!(e, ObjectStoreError::Store(_)), "{e}");
        // The Namespace's file was written before the failure, or nothing
        // was: the set says what the files hold.
        let on_disk = ObjectStore::open(&d).expect("reopen");
        assert_eq!(store.objects(), on_disk.objects());
        assert!(store.objects().services().next().is_none());
        fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn uids_are_random_v4() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
