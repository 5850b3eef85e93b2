//! Applying a lease over rtnetlink: MTU, address, routes (option 121 wins over option 3, RFC
//! 3442). `apply` returns an [`Applied`] handle that undoes exactly what it added; dropping it
//! undoes too, unless [`Applied::keep`] was called.

use super::dhcp::Lease;
use super::link::LinkUp;
use super::rtnl::{
    addr_msg, link_msg, route_msg, NetlinkError, Op, NLM_F_CREATE, NLM_F_EXCL, RTM_DELADDR,
    RTM_DELROUTE, RTM_NEWADDR, RTM_NEWROUTE,
};
use super::wire::dhcpv4::Route;
use crate::sys::netlink::Netlink;
use crate::sys::Errno;

/// The configuration azprov added to one interface. Undone on drop unless kept.
pub struct Applied {
    nl: Netlink,
    ifindex: u32,
    lease: Lease,
    address_added: bool,
    routes_added: Vec<Route>,
    old_mtu: Option<u32>,
    link: Option<LinkUp>,
    kept: bool,
}

/// Configures `lease` on the interface that `link` brought up.
pub fn apply(link: LinkUp, lease: &Lease) -> Result<Applied, NetlinkError> {
    let err = |op: Op| move |errno: Errno| NetlinkError { op, errno };
    let nl = Netlink::open().map_err(err(Op::Open))?;
    let ifindex = link.ifindex;
    let mut a = Applied {
        nl,
        ifindex,
        lease: lease.clone(),
        address_added: false,
        routes_added: Vec::new(),
        old_mtu: None,
        link: Some(link),
        kept: false,
    };
    if let Some(mtu) = lease.mtu.filter(|m| *m >= 576) {
        let old = a.link.as_ref().map(|l| l.mtu).unwrap_or(1500);
        if old != u32::from(mtu) {
            let mut m = link_msg(ifindex, 0, 0, Some(u32::from(mtu))).into_bytes();
            a.nl.request(&mut m)
                .map_err(err(Op::SetMtu(u32::from(mtu))))?;
            a.old_mtu = Some(old);
        }
    }
    let mut m = addr_msg(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, ifindex, lease).into_bytes();
    match a.nl.request(&mut m) {
        Ok(()) => a.address_added = true,
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(err(Op::AddAddress(lease.address, lease.prefix_len))(e)),
    }
    // On-link routes first: a gateway route needs its gateway reachable.
    let mut routes = lease.routes.clone();
    routes.sort_by_key(|r| !r.gateway.is_unspecified());
    for r in &routes {
        let mut m =
            route_msg(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, ifindex, lease, r).into_bytes();
        match a.nl.request(&mut m) {
            Ok(()) => a.routes_added.push(*r),
            // Already there (e.g. the subnet route the kernel made): not ours to remove.
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(err(Op::AddRoute(*r))(e)),
        }
    }
    Ok(a)
}

impl Applied {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Leaves everything configured (`--keep`, `azprov.keepnet`).
    pub fn keep(mut self) {
        self.kept = true;
        if let Some(l) = self.link.take() {
            l.keep();
        }
    }

    /// Removes the routes and the address azprov added, restores the MTU and the link state.
    pub fn teardown(mut self) -> Result<(), NetlinkError> {
        self.undo()
    }

    fn undo(&mut self) -> Result<(), NetlinkError> {
        let mut first_err = None;
        for r in std::mem::take(&mut self.routes_added).iter().rev() {
            let mut m = route_msg(RTM_DELROUTE, 0, self.ifindex, &self.lease, r).into_bytes();
            match self.nl.request(&mut m) {
                // Gone with the address or removed by someone else: fine.
                Err(e) if e != Errno::ESRCH => {
                    first_err.get_or_insert(NetlinkError {
                        op: Op::DeleteRoute(*r),
                        errno: e,
                    });
                }
                _ => {}
            }
        }
        if std::mem::take(&mut self.address_added) {
            let mut m = addr_msg(RTM_DELADDR, 0, self.ifindex, &self.lease).into_bytes();
            if let Err(e) = self.nl.request(&mut m) {
                if e != Errno::EADDRNOTAVAIL {
                    first_err.get_or_insert(NetlinkError {
                        op: Op::DeleteAddress(self.lease.address),
                        errno: e,
                    });
                }
            }
        }
        if let Some(old) = self.old_mtu.take() {
            let mut m = link_msg(self.ifindex, 0, 0, Some(old)).into_bytes();
            if let Err(e) = self.nl.request(&mut m) {
                first_err.get_or_insert(NetlinkError {
                    op: Op::RestoreMtu(old),
                    errno: e,
                });
            }
        }
        if let Some(link) = self.link.take() {
            if let Err(e) = link.restore() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        if !self.kept {
            if let Err(e) = self.undo() {
                log::warn!("network teardown: {e}");
            }
        }
    }
}
