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
    pub fn check(&self, plan: &Plan) -> Result<(), ServiceError> {
        let frontends = plan.frontends.len() + plan.external_addrs.len();
        if frontends > self.capacity.frontends as usize {
            return Err(ServiceError::Full {
                map: rivet_common::map_names::SVC_FRONTENDS,
                key: "max_services",
                needed: frontends,
                capacity: self.capacity.frontends,
            });
        }
        let backends: usize = plan.groups.values().map(Vec::len).sum();
        let largest = plan.groups.values().map(Vec::len).max().unwrap_or(0);
        // A group is replaced by writing its successor first.
        let needed = backends + largest;
        if needed > self.capacity.backends as usize {
            return Err(ServiceError::Full {
                map: rivet_common::map_names::SVC_BACKENDS,
                key: "max_service_backends",
                needed,
                capacity: self.capacity.backends,
            });
        }
        let ports: BTreeSet<&PortRef> = plan.groups.keys().map(|g| &g.port).collect();
        if ports.len() > self.capacity.frontends as usize {
            return Err(ServiceError::Full {
                map: rivet_common::map_names::SVC_STATS,
                key: "max_services",
                needed: ports.len(),
                capacity: self.capacity.frontends,
            });
        }
        Ok(())
    }

    /// The id of every Service port of `plan`: kept, read back, or new.
    fn assign_ids(&mut self, dp: &mut Datapath, plan: &Plan) -> Result<(), ServiceError> {
        let wanted: BTreeSet<&PortRef> = plan.groups.keys().map(|g| &g.port).collect();
        self.ids.retain(|p, _| wanted.contains(p));
        let mut used: BTreeSet<u32> = self.ids.values().copied().collect();
        if !self.found_ids.is_empty() {
            for (fk, fe) in &plan.frontends {
                if let Some(id) = self.found_ids.get(fk)
                    && !self.ids.contains_key(&fe.group.port)
                    && used.insert(*id)
                {
                    self.ids.insert(fe.group.port.clone(), *id);
                }
            }
            self.found_ids.clear();
        }
        let mut next = 0u32;
        for port in wanted {
            if self.ids.contains_key(port) {
                continue;
            }
            while used.contains(&next) {
                next += 1;
            }
            dp.reset_service_counters(next)?;
            used.insert(next);
            self.ids.insert(port.clone(), next);
        }
        Ok(())
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

    /// Makes the maps hold `plan`.
    pub fn apply(&mut self, dp: &mut Datapath, plan: &Plan) -> Result<Changes, ServiceError> {
        self.check(plan)?;
        self.assign_ids(dp, plan)?;
        let mut changes = Changes::default();
        // The frontends of each group (for groups read back at start).
        let mut users: BTreeMap<&GroupKey, Vec<&FrontendKey>> = BTreeMap::new();
        if !self.orphans.is_empty() {
            for (fk, fe) in &plan.frontends {
                users.entry(&fe.group).or_default().push(fk);
            }
        }
        // 1. Groups: new or changed ones under a fresh id.
        let mut retired: Vec<(u32, usize)> = Vec::new();
        for (gk, backends) in &plan.groups {
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
        // 2. Frontends: new or changed, pointing at their group.
        for (fk, fe) in &plan.frontends {
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
        for addr in &plan.external_addrs {
            if self.marks.insert(*addr) {
                dp.put_frontend(marker(*addr), SvcInfo::default())?;
            }
        }
        // 3. Removals: frontends, markers, then groups nothing names.
        let gone: Vec<FrontendKey> = self
            .frontends
            .keys()
            .filter(|k| !plan.frontends.contains_key(k))
            .copied()
            .collect();
        for fk in gone {
            dp.remove_frontend(to_key(&fk))?;
            self.frontends.remove(&fk);
            changes.frontends_removed += 1;
        }
        let stale: Vec<Ipv4Addr> = self
            .marks
            .iter()
            .filter(|a| !plan.external_addrs.contains(a))
            .copied()
            .collect();
        for addr in stale {
            dp.remove_frontend(marker(addr))?;
            self.marks.remove(&addr);
        }
        let unused: Vec<GroupKey> = self
            .groups
            .keys()
            .filter(|g| !plan.groups.contains_key(g))
            .cloned()
            .collect();
        for gk in unused {
            if let Some(w) = self.groups.remove(&gk) {
                if gk.port.proto == Proto::Udp {
                    changes.removed_udp.extend(w.slots.iter().copied());
                }
                retired.push((w.id, w.slots.len()));
            }
        }
        for (id, slots) in std::mem::take(&mut self.orphans) {
            retired.push((id, slots.len()));
        }
        for (id, len) in retired {
            for slot in 0..len {
                dp.remove_backend(SvcBackendKey {
                    group: id,
                    slot: slot as u32,
                })?;
            }
        }
        let ports: BTreeSet<&PortRef> = plan.groups.keys().map(|g| &g.port).collect();
        self.ids.retain(|p, _| ports.contains(p));
        // A backend that only left one group of a port (its local-only
        // group, say) still serves: only those gone from every UDP group.
        for (gk, backends) in &plan.groups {
            if gk.port.proto == Proto::Udp {
                for b in backends {
                    changes.removed_udp.remove(b);
                }
            }
        }
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
