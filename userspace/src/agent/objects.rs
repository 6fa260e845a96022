//! Kubernetes objects through the agent (`rivetctl apply -f`, `delete -f`,
//! `get`): a document is parsed and validated outside the node-state lock
//! (`crate::objects`, the one parser of every source), then, locked, the
//! change is staged in the object store, checked by [`Agent::check_staged`]
//! and committed. A document with any invalid object changes nothing; a
//! change that changes nothing writes nothing.

use std::{sync::Arc, time::Instant};

use rivet_api::{ApiError, ErrorKind, ObjectResult};

use super::{Agent, NodeState, heap::TrimHeap};
use crate::objects::{self, DocumentError, Kind, Object, ObjectKey, ObjectSet, Outcome, Staged};
use crate::services::ServiceRefs;

fn ms_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Documents shorter than this are parsed in place, not handed to a
/// blocking thread (one NetworkPolicy of 100 rules, 5.5 kB: well under a
/// millisecond; the hand-over is a thread wake-up or start on its way).
const PARSE_INLINE_BYTES: usize = 16 << 10;

/// A commit of at least this many files writes them while the change is
/// checked.
const PREPARE_ASIDE_FILES: usize = 16;

/// Documents at least this long are followed by a heap trim.
const TRIM_AFTER_BYTES: usize = 1 << 20;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, message)
}

/// Runs a parse of a (possibly large) document on a blocking thread.
async fn parse_aside<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, DocumentError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(parse)
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("parsing the document: {e}")))?
        .map_err(|e| bad(e.to_string()))
}

/// Runs blocking file work (fsyncs) without stalling the runtime's other
/// tasks, where the runtime allows it.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

fn result_of((key, outcome): &(ObjectKey, Outcome)) -> ObjectResult {
    ObjectResult {
        kind: key.kind.name().to_owned(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        outcome: outcome.as_str().to_owned(),
    }
}

fn count(staged: &Staged, outcome: Outcome) -> usize {
    staged
        .results()
        .iter()
        .filter(|(_, o)| *o == outcome)
        .count()
}

impl Agent {
    /// Stores the objects of `document` (`kubectl apply -f`): each
    /// created, configured or unchanged; all of them or, when one is
    /// invalid or the check refuses the change, none.
    pub async fn apply_objects(&self, document: String) -> Result<Vec<ObjectResult>, ApiError> {
        self.refuse_local_objects()?;
        let started = Instant::now();
        let large = document.len() >= TRIM_AFTER_BYTES;
        let _trim = large.then_some(TrimHeap);
        let mut parsed = if document.len() < PARSE_INLINE_BYTES {
            objects::parse_document(&document).map_err(|e| bad(e.to_string()))?
        } else {
            parse_aside(move || objects::parse_document(&document)).await?
        };
        if large {
            // The parser's garbage is interleaved with the objects in its
            // thread's heap pages, which then stay half used for good:
            // the objects are copied out, so those pages free up whole and
            // the trim hands them back (10,000 Services × 10 backends,
            // glibc's malloc: 288 MiB resident after the apply otherwise,
            // 108 MiB read back from the store).
            parsed = parsed.to_vec();
        }
        if parsed.is_empty() {
            return Err(bad("no objects passed to apply"));
        }
        let parsed_ms = ms_since(started);
        let mut state = self.lock().await;
        let staged = state.objects.stage_apply(parsed);
        let results: Vec<ObjectResult> = staged.results().iter().map(result_of).collect();
        let (created, configured) = (
            count(&staged, Outcome::Created),
            count(&staged, Outcome::Configured),
        );
        let staged_ms = ms_since(started);
        self.commit_staged(&mut state, staged)?;
        tracing::info!(
            objects = results.len(),
            created,
            configured,
            stored = state.objects.objects().len(),
            parsed_ms,
            staged_ms,
            ms = ms_since(started),
            "objects applied"
        );
        Ok(results)
    }

    /// Removes the objects `document` names (`kubectl delete -f`). When one
    /// is not stored: a `not_found` error naming it and nothing removed,
    /// unless `ignore_not_found`.
    pub async fn delete_objects(
        &self,
        document: String,
        ignore_not_found: bool,
    ) -> Result<Vec<ObjectResult>, ApiError> {
        self.refuse_local_objects()?;
        let _trim = (document.len() >= TRIM_AFTER_BYTES).then_some(TrimHeap);
        let keys = parse_aside(move || objects::parse_keys(&document)).await?;
        if keys.is_empty() {
            return Err(bad("no objects passed to delete"));
        }
        let mut state = self.lock().await;
        let staged = state.objects.stage_delete(keys);
        let missing: Vec<String> = staged
            .results()
            .iter()
            .filter(|(_, o)| *o == Outcome::NotFound)
            .map(|(k, _)| k.to_string())
            .collect();
        if !missing.is_empty() && !ignore_not_found {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("not found: {} (nothing was deleted)", missing.join(", ")),
            ));
        }
        let results: Vec<ObjectResult> = staged.results().iter().map(result_of).collect();
        let deleted = count(&staged, Outcome::Deleted);
        self.commit_staged(&mut state, staged)?;
        tracing::info!(
            deleted,
            not_found = missing.len(),
            stored = state.objects.objects().len(),
            "objects deleted"
        );
        Ok(results)
    }

    /// The stored objects of the kind a user named (`kubectl get`), as
    /// Kubernetes JSON: in `namespace` (every one when `None`), only `name`
    /// when given (`not_found` when it is not stored).
    pub async fn get_objects(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, ApiError> {
        let kind = Kind::from_user(kind).map_err(|e| bad(e.to_string()))?;
        let namespace = namespace.filter(|_| kind.namespaced());
        let picked: Vec<Arc<Object>> = {
            let state = self.lock().await;
            let set = state.objects.objects();
            let listed: Box<dyn Iterator<Item = &Arc<Object>>> = match namespace {
                Some(ns) => Box::new(set.in_namespace(kind, ns)),
                None => Box::new(set.of_kind(kind)),
            };
            listed
                .filter(|o| name.is_none_or(|n| o.metadata().name.as_deref() == Some(n)))
                .cloned()
                .collect()
        };
        if let Some(name) = name
            && picked.is_empty()
        {
            let place = match namespace {
                Some(ns) => format!(" in namespace {ns:?}"),
                None if kind.namespaced() => " in any namespace".to_owned(),
                None => String::new(),
            };
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("{} {name:?} not found{place}", kind.plural()),
            ));
        }
        Ok(picked.iter().map(|o| o.to_json()).collect())
    }

    /// Checks a staged change of the objects before anything is written,
    /// with the node state locked: the Services datapath checks capacity
    /// and writes its maps here. An error refuses the change whole (the
    /// store is left as it was).
    ///
    /// NetworkPolicy is synced when `policies` (a Namespace, Pod or
    /// NetworkPolicy changed); when that fails, the maps are brought back
    /// to the stored objects before the error is returned.
    fn check_staged(
        &self,
        state: &mut NodeState,
        next: &ObjectSet,
        touched: Option<&ServiceRefs>,
        policies: bool,
    ) -> Result<(), ApiError> {
        self.sync_services(state, next, touched)?;
        if policies && let Err(e) = self.sync_policies(state, Some(next)) {
            let held = state.objects.objects().clone();
            if let Err(again) = self.sync_services(state, &held, None) {
                tracing::warn!(error = %again, "Services back to the stored objects");
            }
            if let Err(again) = self.sync_policies(state, None) {
                tracing::warn!(error = %again, "NetworkPolicy back to the stored objects");
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Whether a staged change touches what NetworkPolicy reads.
    fn touches_policy(staged: &Staged) -> bool {
        staged.results().iter().any(|(key, outcome)| {
            !matches!(outcome, Outcome::Unchanged | Outcome::NotFound)
                && matches!(key.kind, Kind::Namespace | Kind::Pod | Kind::NetworkPolicy)
        })
    }

    /// The Services a staged change touches: changed Services, and the
    /// Services named by changed EndpointSlices (before and after).
    fn touched_services(state: &NodeState, staged: &Staged) -> ServiceRefs {
        let label = |o: &Object| {
            let service = objects::service_of_slice(o)?;
            Some((
                o.metadata().namespace.clone().unwrap_or_default(),
                service.to_owned(),
            ))
        };
        let mut out = ServiceRefs::new();
        for (key, outcome) in staged.results() {
            if *outcome == Outcome::Unchanged || *outcome == Outcome::NotFound {
                continue;
            }
            match key.kind {
                Kind::Service => {
                    out.insert((key.namespace.clone(), key.name.clone()));
                }
                Kind::EndpointSlice => {
                    let before = state.objects.objects().get(key);
                    let after = staged.objects().get(key);
                    out.extend(before.into_iter().chain(after).filter_map(|o| label(o)));
                }
                _ => {}
            }
        }
        out
    }

    /// Checks and commits `staged` (nothing when it changes nothing).
    pub(super) fn commit_staged(
        &self,
        state: &mut NodeState,
        staged: Staged,
    ) -> Result<(), ApiError> {
        if staged.changes() == 0 {
            return Ok(());
        }
        let started = Instant::now();
        let touched = Self::touched_services(state, &staged);
        let policies = Self::touches_policy(&staged);
        if staged.changes() < PREPARE_ASIDE_FILES {
            self.check_staged(state, staged.objects(), Some(&touched), policies)?;
        } else {
            // The files are written aside while the change is checked
            // (independent kernel work: 100 NetworkPolicies' files and
            // their 10,000 trie entries took 27 and 26 ms one after the
            // other, `bench policy` 2026-12-02), renamed into place only
            // once the check passed.
            let dir = state.objects.dir().to_owned();
            let (checked, prepared) = std::thread::scope(|s| {
                let writer = s.spawn(|| staged.prepare(&dir));
                let checked = self.check_staged(state, staged.objects(), Some(&touched), policies);
                let prepared = writer
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (checked, prepared)
            });
            if let Err(e) = checked {
                if let Ok(p) = prepared {
                    p.abandon();
                }
                return Err(e);
            }
            let checked_ms = ms_since(started);
            let committed = blocking(|| state.objects.commit_prepared(staged, prepared));
            return self.committed(state, committed, started, checked_ms);
        }
        let checked_ms = ms_since(started);
        let committed = blocking(|| state.objects.commit(staged));
        self.committed(state, committed, started, checked_ms)
    }

    /// After a commit: logged, and on a failed write the checked state
    /// brought back to what the store holds.
    fn committed(
        &self,
        state: &mut NodeState,
        committed: Result<(), objects::ObjectStoreError>,
        started: Instant,
        checked_ms: u64,
    ) -> Result<(), ApiError> {
        tracing::debug!(
            checked_ms,
            written_ms = ms_since(started) - checked_ms,
            "objects checked (Services synced) and written"
        );
        if let Err(e) = committed {
            // The check saw a set the store does not hold: show it the
            // one the store read back.
            let held = state.objects.objects().clone();
            if let Err(again) = self.check_staged(state, &held, None, true) {
                tracing::warn!(error = %again, "checking the objects read back after a failed write");
            }
            return Err(ApiError::new(
                ErrorKind::Internal,
                format!("writing the objects: {e}"),
            ));
        }
        Ok(())
    }
}
