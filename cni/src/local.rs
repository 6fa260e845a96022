//! What DEL can do without the agent: delete the pod's host-side veth
//! (which also removes its peer, routes, neighbour entry and TCX link) with a
//! plain netlink socket (`rivet-netlink`, the agent's own). The agent
//! releases the lease and map entry when it returns (its reconciliation sees
//! the veth gone).

use rivet_netlink::RouteSocket;

/// Deletes the link `name` in the calling process's namespace. Returns
/// `Ok(false)` when it does not exist.
pub fn delete_link(name: &str) -> std::io::Result<bool> {
    Ok(RouteSocket::open()?.delete_link_by_name(name)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_link_did_not_exist() {
        assert!(!delete_link("rv-no-such-0").expect("no error for a missing link"));
    }
}
