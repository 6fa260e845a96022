//! Route flap damping in the agent (after RFC 2439): each withdrawal of a
//! prefix adds [`PENALTY`] to its figure of merit, which halves every
//! [`HALF_LIFE`]. Above [`SUPPRESS`] the prefix is suppressed — taken out
//! of the datapath and kept out, whatever BGP says, until its penalty has
//! decayed below [`REUSE`]. A prefix that flaps once or twice is followed
//! at once (a stopped node's routes still go within the hold time); one
//! that keeps flapping costs the datapath a bounded number of writes.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use ipnet::Ipv4Net;

/// Added per withdrawal.
pub const PENALTY: f64 = 1000.0;
/// Suppressed above this (the third withdrawal in quick succession).
pub const SUPPRESS: f64 = 2500.0;
/// Usable again below this.
pub const REUSE: f64 = 750.0;
/// The penalty halves in this time.
pub const HALF_LIFE: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy)]
struct Merit {
    penalty: f64,
    at: Instant,
    suppressed: bool,
}

impl Merit {
    fn decayed(&self, now: Instant) -> f64 {
        let t = now.saturating_duration_since(self.at).as_secs_f64();
        self.penalty * 0.5f64.powf(t / HALF_LIFE.as_secs_f64())
    }
}

/// The damping state of every prefix that flapped.
#[derive(Debug, Default)]
pub struct Damping {
    merits: BTreeMap<Ipv4Net, Merit>,
    /// Suppressions so far.
    pub suppressions: u64,
}

impl Damping {
    /// Notes a withdrawal of `net` at `now`.
    pub fn withdrawn(&mut self, net: Ipv4Net, now: Instant) {
        let m = self.merits.entry(net).or_insert(Merit {
            penalty: 0.0,
            at: now,
            suppressed: false,
        });
        m.penalty = m.decayed(now) + PENALTY;
        m.at = now;
        if !m.suppressed && m.penalty > SUPPRESS {
            m.suppressed = true;
            self.suppressions += 1;
        }
    }

    /// Whether `net` may be in the datapath at `now`; forgets prefixes
    /// whose penalty has decayed.
    pub fn usable(&mut self, net: Ipv4Net, now: Instant) -> bool {
        let Some(m) = self.merits.get_mut(&net) else {
            return true;
        };
        let p = m.decayed(now);
        if m.suppressed && p >= REUSE {
            return false;
        }
        if p < REUSE / 2.0 {
            self.merits.remove(&net);
        } else {
            m.suppressed = false;
        }
        true
    }

    /// Prefixes suppressed at `now`.
    pub fn suppressed(&self, now: Instant) -> usize {
        self.merits
            .values()
            .filter(|m| m.suppressed && m.decayed(now) >= REUSE)
            .count()
    }

    /// When the next suppressed prefix becomes usable.
    pub fn next_reuse(&self, now: Instant) -> Option<Instant> {
        self.merits
            .values()
            .filter(|m| m.suppressed)
            .map(|m| {
                // penalty · 2^(−t/h) = REUSE → t = h · log2(penalty / REUSE)
                let t = HALF_LIFE.as_secs_f64() * (m.penalty / REUSE).log2().max(0.0);
                m.at + Duration::from_secs_f64(t)
            })
            .min()
            .map(|t| t.max(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net() -> Ipv4Net {
        "10.244.3.0/24".parse().expect("net")
    }

    #[test]
    fn two_flaps_are_followed_the_third_suppresses() {
        let t0 = Instant::now();
        let mut d = Damping::default();
        d.withdrawn(net(), t0);
        assert!(d.usable(net(), t0 + Duration::from_secs(1)));
        d.withdrawn(net(), t0 + Duration::from_secs(2));
        assert!(d.usable(net(), t0 + Duration::from_secs(3)));
        d.withdrawn(net(), t0 + Duration::from_secs(4));
        assert!(!d.usable(net(), t0 + Duration::from_secs(5)));
        assert_eq!(d.suppressions, 1);
        assert_eq!(d.suppressed(t0 + Duration::from_secs(5)), 1);
        let reuse = d
            .next_reuse(t0 + Duration::from_secs(5))
            .expect("suppressed");
        assert!(!d.usable(net(), reuse - Duration::from_millis(100)));
        assert!(d.usable(net(), reuse + Duration::from_millis(100)));
        assert_eq!(d.next_reuse(reuse + Duration::from_secs(1)), None);
    }

    #[test]
    fn flaps_far_apart_never_suppress() {
        let t0 = Instant::now();
        let mut d = Damping::default();
        for i in 0..10 {
            let t = t0 + HALF_LIFE * 3 * i;
            d.withdrawn(net(), t);
            assert!(d.usable(net(), t + Duration::from_millis(1)), "flap {i}");
        }
        assert_eq!(d.suppressions, 0);
    }
}
