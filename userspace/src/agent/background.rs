//! Housekeeping that walks large tables (the NAT collector) runs on a
//! blocking thread at `SCHED_IDLE`: the scheduler gives it a CPU only when
//! nothing else wants one, so it does not compete with the node's
//! applications for a CPU. Measured 2026-12-06 on a 2-CPU node during a
//! connection benchmark: a NAT collection of ~40,000 entries took 50–60 ms
//! of one CPU every 10 s (the `nat_gc_interval`).

/// Runs `work` on a blocking thread at `SCHED_IDLE`; the thread gets its
/// policy back afterwards (the pool reuses it for other work).
pub(super) async fn run_idle<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || {
        let _idle = IdlePolicy::enter();
        work()
    })
    .await
}

/// The calling thread at `SCHED_IDLE` while it lives.
struct IdlePolicy {
    /// The policy to restore, if switching succeeded.
    previous: Option<libc::c_int>,
}

impl IdlePolicy {
    fn enter() -> Self {
        // SAFETY: queries the calling thread's policy; no pointers.
        let previous = unsafe { libc::sched_getscheduler(0) };
        let switched = previous >= 0 && set_policy(libc::SCHED_IDLE);
        if !switched {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "housekeeping stays at the thread's priority"
            );
        }
        Self {
            previous: switched.then_some(previous),
        }
    }
}

impl Drop for IdlePolicy {
    fn drop(&mut self) {
        if let Some(previous) = self.previous
            && !set_policy(previous)
        {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "a pool thread keeps SCHED_IDLE"
            );
        }
    }
}

/// Sets the calling thread's scheduling policy (priority 0: the only one
/// `SCHED_OTHER`, `SCHED_BATCH` and `SCHED_IDLE` take).
fn set_policy(policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_at_sched_idle_and_the_thread_gets_its_policy_back() {
        // One blocking thread: the second call runs where the first did.
        let rt = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .expect("runtime");
        // SAFETY: queries the calling thread's policy.
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let thread = || std::thread::current().id();
        let (during, idle_thread) = rt
            .block_on(run_idle(move || (policy(), thread())))
            .expect("joined");
        assert_eq!(during, libc::SCHED_IDLE);
        let (after, later_thread) = rt
            .block_on(async { tokio::task::spawn_blocking(move || (policy(), thread())).await })
            .expect("joined");
        assert_eq!(idle_thread, later_thread, "the pool reused its thread");
        assert_eq!(after, libc::SCHED_OTHER);
    }
}
