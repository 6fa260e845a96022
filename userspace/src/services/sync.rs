//! Writing a [`Plan`] into the Service maps, changing only what differs.
//!
//! Order, so a program never sees a half-made Service:
//! 1. a backend group whose set changed is written under a **new** group id
//!    (a backend that stays keeps its slot: the slots of the old group
//!    minus the backends gone, new ones in the holes and after), then
//! 2. every frontend naming the group is flipped to it (one map update
//!    each), then
//! 3. the old group's slots are removed; frontends gone are removed before
//!    their groups.
//!
//! A removed backend therefore gets no new connection once the apply
//! returns. Service port ids (counters, affinity) are kept while the port
//! exists and handed out again, zeroed, after it is gone. At start the
//! maps are read back (groups, ids, markers) so a restarted agent changes
//! only what the store says changed.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use rivet_common::{
    SvcBackend, SvcBackendKey, SvcInfo, SvcKey, ipv4_from_key, ipv4_key, svc_flags, svc_scope,
};

use super::{
    ServiceError,
    plan::{Backend, FrontendKey, FrontendKind, GroupKey, Plan, PortRef, Proto, Scope},
};
use crate::datapath::Datapath;

/// A group as written.
#[derive(Clone, Debug)]
struct Written {
    id: u32,
    /// Slot → backend; `None`: a hole (only while building the next group).
    slots: Vec<Backend>,
}

/// What the maps hold, as this agent wrote (or read back) them.
#[derive(Debug, Default)]
pub struct Synced {
    frontends: BTreeMap<FrontendKey, SvcInfo>,
    groups: BTreeMap<GroupKey, Written>,
    /// Groups found in the map at start that no planned group has claimed
    /// yet, by id.
    orphans: BTreeMap<u32, Vec<Backend>>,
    marks: BTreeSet<Ipv4Addr>,
    ids: BTreeMap<PortRef, u32>,
    /// The ids in `ids`.
    used_ids: BTreeSet<u32>,
    /// No id below this one is free.
    free_from: u32,
    /// Ids read back at start, by the Service port that had them (during
    /// the first apply).
    found_port_ids: BTreeMap<PortRef, u32>,
    /// Ids read back at start, by a frontend that had them.
    found_ids: BTreeMap<FrontendKey, u32>,
    next_group: u32,
    capacity: Capacity,
}

/// The maps' capacities.
#[derive(Clone, Copy, Debug, Default)]
pub struct Capacity {
    /// SVC_FRONTENDS (and Service port ids).
    pub frontends: u32,
    /// SVC_BACKENDS.
    pub backends: u32,
}

/// Where a plan may differ from what the maps hold: the entries to look
/// at (each is written, rewritten or removed as the plan says).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Frontends.
    pub frontends: BTreeSet<FrontendKey>,
    /// Backend groups.
    pub groups: BTreeSet<GroupKey>,
    /// Addresses marked as holding external frontends.
    pub markers: BTreeSet<Ipv4Addr>,
}

/// What an apply changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Frontends written (new or changed).
    pub frontends_written: usize,
    /// Frontends removed.
    pub frontends_removed: usize,
    /// Backend groups written.
    pub groups_written: usize,
    /// UDP backends that left a group (their flows and connected sockets
    /// are moved or failed by the caller).
    pub removed_udp: BTreeSet<Backend>,
}

fn to_key(k: &FrontendKey) -> SvcKey {
    SvcKey {
        addr: ipv4_key(k.addr.octets()),
        port: k.port.to_be(),
        proto: k.proto.number(),
        scope: match k.scope {
            Scope::Internal => svc_scope::INTERNAL,
            Scope::External => svc_scope::EXTERNAL,
        },
    }
}

fn from_key(k: &SvcKey) -> Option<FrontendKey> {
    let proto = match k.proto {
        6 => Proto::Tcp,
        17 => Proto::Udp,
        132 => Proto::Sctp,
        _ => return None,
    };
    Some(FrontendKey {
        addr: Ipv4Addr::from(ipv4_from_key(k.addr)),
        port: u16::from_be(k.port),
        proto,
        scope: if k.scope == svc_scope::EXTERNAL {
            Scope::External
        } else {
            Scope::Internal
        },
    })
}

fn marker(addr: Ipv4Addr) -> SvcKey {
    SvcKey {
        addr: ipv4_key(addr.octets()),
        port: 0,
        proto: 0,
        scope: svc_scope::EXTERNAL,
    }
}

fn to_backend(b: &Backend) -> SvcBackend {
    SvcBackend {
        addr: ipv4_key(b.addr.octets()),
        port: b.port.to_be(),
        _pad: 0,
    }
}

impl Synced {
    /// Reads what the maps hold (an agent restart keeps them).
    pub fn load(dp: &mut Datapath, capacity: Capacity) -> Result<Self, ServiceError> {
        let mut out = Synced {
            capacity,
            ..Synced::default()
        };
        let mut groups: BTreeMap<u32, BTreeMap<u32, Backend>> = BTreeMap::new();
        for (k, b) in dp.list_backends()? {
            groups.entry(k.group).or_default().insert(
                k.slot,
                Backend {
                    addr: Ipv4Addr::from(ipv4_from_key(b.addr)),
                    port: u16::from_be(b.port),
                },
            );
        }
        out.next_group = groups.keys().next_back().map_or(1, |g| g + 1);
        for (key, info) in dp.list_frontends()? {
            if key.port == 0 && key.proto == 0 {
                out.marks.insert(Ipv4Addr::from(ipv4_from_key(key.addr)));
                continue;
            }
            let Some(fk) = from_key(&key) else {
                // Not ours to read: removed by the first apply.
                dp.remove_frontend(key)?;
                continue;
            };
            out.next_group = out.next_group.max(info.group + 1);
            out.found_ids.insert(fk, info.id);
            out.frontends.insert(fk, info);
        }
        for (id, slots) in groups {
            out.orphans.insert(id, slots.into_values().collect());
        }
        Ok(out)
    }

    /// Refuses a plan the maps cannot hold, before anything is written.
    /// `backends` is the sum of the plan's group sizes and `largest` the
    /// largest group about to be written (a group is replaced by writing
    /// its successor first); `ports` the Service ports.
    pub fn check_counts(
        &self,
        frontends: usize,
        backends: usize,
        largest: usize,
        ports: usize,
    ) -> Result<(), ServiceError> {
        if frontends > self.capacity.frontends as usize {
            return Err(ServiceError::Full {
                map: rivet_common::map_names::SVC_FRONTENDS,
                key: "max_services",
                needed: frontends,
                capacity: self.capacity.frontends,
            });
        }
        let needed = backends + largest;
        if needed > self.capacity.backends as usize {
            return Err(ServiceError::Full {
                map: rivet_common::map_names::SVC_BACKENDS,
                key: "max_service_backends",
                needed,
                capacity: self.capacity.backends,
            });
        }
        if ports > self.capacity.frontends as usize {
            return Err(ServiceError::Full {
                map: rivet_common::map_names::SVC_STATS,
                key: "max_services",
                needed: ports,
                capacity: self.capacity.frontends,
            });
        }
        Ok(())
    }

    /// [`Self::check_counts`] of a whole plan.
    pub fn check(&self, plan: &Plan) -> Result<(), ServiceError> {
        let ports: BTreeSet<&PortRef> = plan.groups.keys().map(|g| &g.port).collect();
        self.check_counts(
            plan.frontends.len() + plan.external_addrs.len(),
            plan.groups.values().map(Vec::len).sum(),
            plan.groups.values().map(Vec::len).max().unwrap_or(0),
            ports.len(),
        )
    }

    /// The id of a Service port of `plan` that needs one: kept, read back
    /// (a frontend that had it at start), or the lowest free one (its
    /// counters zeroed).
    fn assign_id(&mut self, dp: &mut Datapath, port: &PortRef) -> Result<(), ServiceError> {
        if self.ids.contains_key(port) {
            return Ok(());
        }
        let found = self
            .found_port_ids
            .get(port)
            .copied()
            .filter(|id| !self.used_ids.contains(id));
        let id = match found {
            Some(id) => id,
            None => {
                let mut next = self.free_from;
                while self.used_ids.contains(&next) {
                    next += 1;
                }
                self.free_from = next + 1;
                dp.reset_service_counters(next)?;
                next
            }
        };
        self.used_ids.insert(id);
        self.ids.insert(port.clone(), id);
        Ok(())
    }

    /// Frees the id of a Service port no group of `plan` has any more.
    fn release_id(&mut self, plan: &Plan, port: &PortRef) {
        let held = [true, false].iter().any(|&local_only| {
            plan.groups.contains_key(&GroupKey {
                port: port.clone(),
                local_only,
            })
        });
        if !held && let Some(id) = self.ids.remove(port) {
            self.used_ids.remove(&id);
            self.free_from = self.free_from.min(id);
        }
    }

    /// The id of a Service port (after an apply).
    pub fn id(&self, port: &PortRef) -> Option<u32> {
        self.ids.get(port).copied()
    }

    /// The slots a group is written with: a backend that stays keeps its
    /// slot; the new ones fill the holes, then follow.
    fn slots(old: &[Backend], new: &[Backend]) -> Vec<Backend> {
        let wanted: BTreeSet<&Backend> = new.iter().collect();
        let mut slots: Vec<Option<Backend>> = old
            .iter()
            .map(|b| wanted.contains(b).then_some(*b))
            .collect();
        let kept: BTreeSet<Backend> = slots.iter().flatten().copied().collect();
        let mut fresh = new.iter().filter(|b| !kept.contains(b));
        for slot in &mut slots {
            if slot.is_none() {
                *slot = fresh.next().copied();
            }
        }
        let mut out: Vec<Backend> = slots.into_iter().flatten().collect();
        out.extend(fresh.copied());
        out
    }

    /// Makes the maps hold `plan`, looking at every entry (start-up).
    pub fn apply(&mut self, dp: &mut Datapath, plan: &Plan) -> Result<Changes, ServiceError> {
        self.check(plan)?;
        let delta = Delta {
            frontends: plan
                .frontends
                .keys()
                .chain(self.frontends.keys())
                .copied()
                .collect(),
            groups: plan
                .groups
                .keys()
                .chain(self.groups.keys())
                .cloned()
                .collect(),
            markers: plan
                .external_addrs
                .iter()
                .chain(self.marks.iter())
                .copied()
                .collect(),
        };
        // Ids read back at start, by the Service port of a frontend that
        // had them.
        for (fk, fe) in &plan.frontends {
            if let Some(id) = self.found_ids.get(fk) {
                self.found_port_ids
                    .entry(fe.group.port.clone())
                    .or_insert(*id);
            }
        }
        let changes = self.apply_delta(dp, plan, &delta)?;
        self.found_port_ids.clear();
        // Groups read back at start that no frontend took over.
        for (id, slots) in std::mem::take(&mut self.orphans) {
            for slot in 0..slots.len() {
                dp.remove_backend(SvcBackendKey {
                    group: id,
                    slot: slot as u32,
                })?;
            }
        }
        self.found_ids.clear();
        Ok(changes)
    }

    /// Makes the maps hold `plan` where `delta` says it may differ from
    /// what they hold (the caller checked the capacity).
    pub fn apply_delta(
        &mut self,
        dp: &mut Datapath,
        plan: &Plan,
        delta: &Delta,
    ) -> Result<Changes, ServiceError> {
        let mut changes = Changes::default();
        let ports: BTreeSet<&PortRef> = delta.groups.iter().map(|g| &g.port).collect();
        for port in &ports {
            if plan.groups.contains_key(&GroupKey {
                port: (*port).clone(),
                local_only: false,
            }) || plan.groups.contains_key(&GroupKey {
                port: (*port).clone(),
                local_only: true,
            }) {
                self.assign_id(dp, port)?;
            }
        }
        // The frontends of each group (for groups read back at start).
        let mut users: BTreeMap<&GroupKey, Vec<&FrontendKey>> = BTreeMap::new();
        if !self.orphans.is_empty() {
            for (fk, fe) in &plan.frontends {
                users.entry(&fe.group).or_default().push(fk);
            }
        }
        // 1. Groups: new or changed ones under a fresh id.
        let mut retired: Vec<(u32, usize)> = Vec::new();
        for gk in &delta.groups {
            let Some(backends) = plan.groups.get(gk) else {
                continue;
            };
            let old = self.groups.get(gk);
            if old.is_some_and(|w| {
                let a: BTreeSet<&Backend> = w.slots.iter().collect();
                let b: BTreeSet<&Backend> = backends.iter().collect();
                a == b
            }) {
                continue;
            }
            // A group read back at start with exactly these backends is
            // taken over as it is.
            if old.is_none()
                && let Some(id) =
                    self.orphan_for(users.get(gk).map_or(&[][..], Vec::as_slice), backends)
            {
                let slots = self.orphans.remove(&id).unwrap_or_default();
                self.groups.insert(gk.clone(), Written { id, slots });
                continue;
            }
            let slots = Self::slots(old.map_or(&[][..], |w| &w.slots), backends);
            let id = self.next_group;
            self.next_group = self.next_group.wrapping_add(1).max(1);
            for (slot, b) in slots.iter().enumerate() {
                let key = SvcBackendKey {
                    group: id,
                    slot: slot as u32,
                };
                dp.put_backend(key, to_backend(b))?;
            }
            changes.groups_written += 1;
            if let Some(w) = self.groups.insert(gk.clone(), Written { id, slots }) {
                if gk.port.proto == Proto::Udp {
                    let kept: BTreeSet<&Backend> = backends.iter().collect();
                    changes
                        .removed_udp
                        .extend(w.slots.iter().filter(|b| !kept.contains(b)));
                }
                retired.push((w.id, w.slots.len()));
            }
        }
        // 2. Frontends: new or changed, pointing at their group; gone ones
        //    removed before their groups.
        for fk in &delta.frontends {
            let Some(fe) = plan.frontends.get(fk) else {
                if self.frontends.remove(fk).is_some() {
                    dp.remove_frontend(to_key(fk))?;
                    changes.frontends_removed += 1;
                }
                continue;
            };
            let Some(group) = self.groups.get(&fe.group) else {
                continue;
            };
            let mut flags = 0;
            if fe.affinity.is_some() {
                flags |= svc_flags::AFFINITY;
            }
            match fe.kind {
                FrontendKind::NodePort => flags |= svc_flags::NODEPORT,
                FrontendKind::ExternalIp | FrontendKind::LoadBalancer => {
                    flags |= svc_flags::EXTERNAL;
                }
                FrontendKind::ClusterIp => {}
            }
            if fe.drop_when_empty {
                flags |= svc_flags::LOCAL_ONLY;
            }
            let info = SvcInfo {
                id: self.ids.get(&fe.group.port).copied().unwrap_or(0),
                group: group.id,
                count: group.slots.len() as u32,
                flags,
                affinity_timeout: fe.affinity.unwrap_or(0),
                _pad: 0,
            };
            if self.frontends.get(fk) != Some(&info) {
                dp.put_frontend(to_key(fk), info)?;
                self.frontends.insert(*fk, info);
                changes.frontends_written += 1;
            }
        }
        for addr in &delta.markers {
            let wanted = plan.external_addrs.contains(addr);
            if wanted && self.marks.insert(*addr) {
                dp.put_frontend(marker(*addr), SvcInfo::default())?;
            } else if !wanted && self.marks.remove(addr) {
                dp.remove_frontend(marker(*addr))?;
            }
        }
        // 3. Groups nothing names any more, then the retired ones' slots.
        for gk in &delta.groups {
            if plan.groups.contains_key(gk) {
                continue;
            }
            if let Some(w) = self.groups.remove(gk) {
                if gk.port.proto == Proto::Udp {
                    changes.removed_udp.extend(w.slots.iter().copied());
                }
                retired.push((w.id, w.slots.len()));
            }
        }
        for (id, len) in retired {
            for slot in 0..len {
                dp.remove_backend(SvcBackendKey {
                    group: id,
                    slot: slot as u32,
                })?;
            }
        }
        for port in ports {
            self.release_id(plan, port);
        }
        // A backend that only left one group of a port (its local-only
        // group, say) still serves: only those gone from both.
        changes.removed_udp.retain(|b| {
            !delta.groups.iter().any(|gk| {
                gk.port.proto == Proto::Udp && plan.groups.get(gk).is_some_and(|bs| bs.contains(b))
            })
        });
        Ok(changes)
    }

    /// A group read back at start that one of `users` (a group's
    /// frontends) named and that holds exactly `backends`.
    fn orphan_for(&self, users: &[&FrontendKey], backends: &[Backend]) -> Option<u32> {
        let wanted: BTreeSet<&Backend> = backends.iter().collect();
        users
            .iter()
            .filter_map(|fk| self.frontends.get(*fk).map(|i| i.group))
            .find(|id| {
                self.orphans.get(id).is_some_and(|slots| {
                    slots.len() == backends.len() && slots.iter().collect::<BTreeSet<_>>() == wanted
                })
            })
    }

    /// The backends of a group as written (slot order).
    pub fn group(&self, gk: &GroupKey) -> Option<&[Backend]> {
        self.groups.get(gk).map(|w| w.slots.as_slice())
    }

    /// Entries in the frontend map (frontends and markers).
    pub fn frontend_entries(&self) -> usize {
        self.frontends.len() + self.marks.len()
    }

    /// Entries in the backend map.
    pub fn backend_entries(&self) -> usize {
        self.groups.values().map(|w| w.slots.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(last: u8, port: u16) -> Backend {
        Backend {
            addr: Ipv4Addr::new(10, 0, 0, last),
            port,
        }
    }

    #[test]
    fn a_staying_backend_keeps_its_slot() {
        let old = [b(1, 80), b(2, 80), b(3, 80)];
        // 2 leaves, 4 arrives: 4 takes 2's slot; 1 and 3 stay put.
        let new = [b(1, 80), b(3, 80), b(4, 80)];
        assert_eq!(
            Synced::slots(&old, &new),
            vec![b(1, 80), b(4, 80), b(3, 80)]
        );
        // Only additions: appended.
        let new = [b(1, 80), b(2, 80), b(3, 80), b(5, 80)];
        assert_eq!(
            Synced::slots(&old, &new),
            vec![b(1, 80), b(2, 80), b(3, 80), b(5, 80)]
        );
        // Removal without replacement: the hole closes, order kept.
        let new = [b(3, 80)];
        assert_eq!(Synced::slots(&old, &new), vec![b(3, 80)]);
    }

    #[test]
    fn frontend_keys_round_trip() {
        let k = FrontendKey {
            addr: Ipv4Addr::new(10, 96, 0, 10),
            port: 53,
            proto: Proto::Udp,
            scope: Scope::External,
        };
        assert_eq!(from_key(&to_key(&k)), Some(k));
        assert_eq!(to_key(&k).port, 53u16.to_be());
    }
}
