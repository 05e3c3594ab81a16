use std::net::{Ipv4Addr, Ipv6Addr};

use crate::cmd::run;
use crate::error::{Error, Result};
use crate::netns::Netns;

/// Number of /30 subnets in 10.200.0.0/16; each pair takes one, chosen by its slot number.
const SLOTS: u32 = 1 << 14;

/// A veth pair between the host's namespace and a [`Netns`], both ends up and addressed:
/// IPv4 from the pair's own /30 in 10.200.0.0/16, IPv6 from its own /64 in
/// fd00:7a17::/48 (a unique-local prefix). Deleted on drop (deleting the namespace first
/// removes it too).
///
/// The slot number is part of the interface names (`ttv<slot>h` on the host,
/// `ttv<slot>p` in the namespace), so the kernel's refusal of a duplicate name is what makes
/// addresses unique, across processes too.
#[derive(Debug)]
pub struct VethPair {
    /// Address of the host end.
    pub host_v4: Ipv4Addr,
    /// Address of the namespace end.
    pub peer_v4: Ipv4Addr,
    /// IPv6 address of the host end.
    pub host_v6: Ipv6Addr,
    /// IPv6 address of the namespace end.
    pub peer_v6: Ipv6Addr,
    /// Interface name of the host end.
    pub host_ifname: String,
    /// Interface name of the namespace end (inside the namespace).
    pub peer_ifname: String,
    /// Interface index of the host end (in the host's namespace).
    pub host_ifindex: u32,
}

impl VethPair {
    /// Creates the pair, moves one end into `netns`, and addresses and raises both ends.
    /// IPv6 addresses skip duplicate address detection, so they are usable at once.
    pub fn new(netns: &Netns) -> Result<VethPair> {
        // Start at a per-process offset so parallel test processes rarely collide.
        let start = std::process::id().wrapping_mul(97) % SLOTS;
        for i in 0..SLOTS {
            let slot = (start + i) % SLOTS;
            let host = format!("ttv{slot}h");
            let peer = format!("ttv{slot}p");
            match run(
                "ip",
                &[
                    "link",
                    "add",
                    &host,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &peer,
                    "netns",
                    netns.name(),
                ],
            ) {
                Ok(_) => return VethPair::configure(netns, slot, host, peer),
                Err(Error::Command { ref stderr, .. }) if stderr.contains("File exists") => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoFreeSlot)
    }

    fn configure(netns: &Netns, slot: u32, host: String, peer: String) -> Result<VethPair> {
        let base = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + slot * 4;
        // Each slot's /64 is fd00:7a17:0:<slot>::/64.
        let v6 = |host_part: u16| Ipv6Addr::new(0xfd00, 0x7a17, 0, slot as u16, 0, 0, 0, host_part);
        // Built before configuring, so that Drop removes a half-configured pair too.
        let mut pair = VethPair {
            host_v4: Ipv4Addr::from(base + 1),
            peer_v4: Ipv4Addr::from(base + 2),
            host_v6: v6(1),
            peer_v6: v6(2),
            host_ifname: host,
            peer_ifname: peer,
            host_ifindex: 0,
        };
        let ns = netns.name();
        let (h, p) = (&pair.host_ifname, &pair.peer_ifname);
        let (h4, p4) = (
            format!("{}/30", pair.host_v4),
            format!("{}/30", pair.peer_v4),
        );
        let (h6, p6) = (
            format!("{}/64", pair.host_v6),
            format!("{}/64", pair.peer_v6),
        );
        run("ip", &["addr", "add", &h4, "dev", h])?;
        run("ip", &["addr", "add", &h6, "dev", h, "nodad"])?;
        run("ip", &["link", "set", h, "up"])?;
        run("ip", &["-n", ns, "addr", "add", &p4, "dev", p])?;
        run("ip", &["-n", ns, "addr", "add", &p6, "dev", p, "nodad"])?;
        run("ip", &["-n", ns, "link", "set", p, "up"])?;
        let index_file = format!("/sys/class/net/{h}/ifindex");
        let index = std::fs::read_to_string(&index_file).map_err(Error::io(&index_file))?;
        pair.host_ifindex = index.trim().parse().map_err(|_| Error::Io {
            context: format!("{index_file}: not an interface index: {index:?}"),
            source: std::io::ErrorKind::InvalidData.into(),
        })?;
        Ok(pair)
    }

    /// Replaces the host end's root qdisc with `netem ARGS...` (e.g. `["delay", "10ms",
    /// "reorder", "25%"]`), loading sch_netem first if needed. It shapes what the host sends
    /// into the namespace. [`Error::Unsupported`] when the kernel has no netem (the
    /// development kernel; the stock kernels under qemu have it).
    pub fn add_netem(&self, args: &[&str]) -> Result<()> {
        if !std::path::Path::new("/sys/module/sch_netem").exists() {
            // Built-in netem has no module to load; tc reports what is really missing.
            let _ = run("modprobe", &["sch_netem"]);
        }
        let mut tc = vec![
            "qdisc",
            "replace",
            "dev",
            &self.host_ifname,
            "root",
            "netem",
        ];
        tc.extend_from_slice(args);
        match run("tc", &tc) {
            Ok(_) => Ok(()),
            Err(Error::Command { stderr, .. }) if stderr.contains("qdisc kind is unknown") => {
                Err(Error::Unsupported("the netem qdisc (CONFIG_NET_SCH_NETEM)"))
            }
            Err(e) => Err(e),
        }
    }

    /// Replaces the host end's root qdisc with `KIND ARGS...` (e.g. `["tbf", "rate",
    /// "1mbit", "burst", "10kb", "latency", "400ms"]`): it holds what the host sends into
    /// the namespace. The host's kernel has tbf, htb and pfifo; the guests' have more.
    pub fn set_root_qdisc(&self, qdisc: &[&str]) -> Result<()> {
        let mut tc = vec!["qdisc", "replace", "dev", &self.host_ifname, "root"];
        tc.extend_from_slice(qdisc);
        run("tc", &tc).map(|_| ())
    }

    /// Caps the segments per GSO packet the host end sends (`ip link set ... gso_max_segs`).
    /// With 1, TCP hands the qdisc one MSS-sized packet at a time, so netem can reorder
    /// within a message; by default a whole message may travel as one GSO packet.
    /// Affects connections made afterwards.
    pub fn set_gso_max_segs(&self, segs: u32) -> Result<()> {
        let segs = segs.to_string();
        run(
            "ip",
            &[
                "link",
                "set",
                "dev",
                &self.host_ifname,
                "gso_max_segs",
                &segs,
            ],
        )
        .map(|_| ())
    }
}

impl VethPair {
    /// Steers what the host end receives to `cpu` with RPS (its `rx-0` queue's `rps_cpus`):
    /// the receive softirq of every packet the namespace sends runs there, whichever CPU
    /// sent it. Undone when the pair is deleted.
    pub fn steer_rx_to_cpu(&self, cpu: usize) -> Result<()> {
        // A CPU mask in hex, in comma-separated 32-bit words, most significant first.
        let words: Vec<String> = (0..=cpu / 32)
            .rev()
            .map(|w| {
                let bits: u32 = if w == cpu / 32 { 1 << (cpu % 32) } else { 0 };
                format!("{bits:08x}")
            })
            .collect();
        let path = format!("/sys/class/net/{}/queues/rx-0/rps_cpus", self.host_ifname);
        std::fs::write(&path, words.join(",")).map_err(Error::io(format!(
            "cannot write {path} (a kernel without CONFIG_RPS?)"
        )))
    }

    /// Makes a routing loop through the pair and returns the address it is for, one of
    /// 198.18.0.0/15 (the benchmarking range, RFC 2544) chosen by the pair's slot: the host
    /// routes it to the namespace, the namespace routes it back, both forward (the host end
    /// only: per-device forwarding), so a packet sent to it from the namespace bounces
    /// between the two until its TTL runs out. Every hop is a full receive (backlog, IP,
    /// forward) in the softirq of the CPU that took it, so each datagram sent costs the
    /// receiving CPUs about 64 (a default TTL) receives. The neighbours are made permanent,
    /// so address resolution cannot be lost under the load and break the loop. Undone when
    /// the pair and namespace are deleted.
    pub fn routing_loop(&self, netns: &Netns) -> Result<Ipv4Addr> {
        let slot = (u32::from(self.host_v4) - u32::from(Ipv4Addr::new(10, 200, 0, 0))) / 4;
        let dest = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + slot);
        let ns = netns.name();
        let (h, p) = (&self.host_ifname, &self.peer_ifname);
        let (host, peer) = (self.host_v4.to_string(), self.peer_v4.to_string());
        let host_mac = std::fs::read_to_string(format!("/sys/class/net/{h}/address"))
            .map_err(Error::io(format!("cannot read the address of {h}")))?;
        let link = run("ip", &["-n", ns, "-o", "link", "show", "dev", p])?;
        let peer_mac = link
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .ok_or_else(|| Error::Setup(format!("no link/ether address for {p}: {link}")))?
            .to_owned();
        run(
            "ip",
            &[
                "neigh",
                "replace",
                &peer,
                "lladdr",
                &peer_mac,
                "dev",
                h,
                "nud",
                "permanent",
            ],
        )?;
        run(
            "ip",
            &[
                "-n",
                ns,
                "neigh",
                "replace",
                &host,
                "lladdr",
                host_mac.trim(),
                "dev",
                p,
                "nud",
                "permanent",
            ],
        )?;
        let fwd = format!("/proc/sys/net/ipv4/conf/{h}/forwarding");
        std::fs::write(&fwd, "1").map_err(Error::io(format!("cannot write {fwd}")))?;
        // In the namespace: forward, and take back packets from its own address (what it
        // sent, returned by the host) instead of dropping them as martians.
        run(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "sh",
                "-c",
                &format!(
                    "echo 1 > /proc/sys/net/ipv4/ip_forward && \
                     echo 1 > /proc/sys/net/ipv4/conf/{p}/accept_local"
                ),
            ],
        )?;
        let dest_s = dest.to_string();
        run("ip", &["route", "add", &dest_s, "via", &peer, "dev", h])?;
        run(
            "ip",
            &["-n", ns, "route", "add", &dest_s, "via", &host, "dev", p],
        )?;
        Ok(dest)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Gone already when its namespace was deleted first.
        if std::path::Path::new("/sys/class/net")
            .join(&self.host_ifname)
            .exists()
        {
            if let Err(e) = run("ip", &["link", "del", &self.host_ifname]) {
                eprintln!(
                    "tailtrap-tests: cannot delete veth {}: {e}",
                    self.host_ifname
                );
            }
        }
    }
}
