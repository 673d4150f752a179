"""A home network behind a masquerading router, next to bench/netns.py's public hosts (issue 28).

    public hosts 0..n-1  --br0--  router (WAN: <subnet>.250)  --veth--  home (192.168.<k>.2)
                               [ router k (WAN: <subnet>.250-k)  --veth--  home k (192.168.<k'>.2) ... ]

The router namespace NATs the home's traffic out of its WAN address (iptables MASQUERADE) and
drops every connection that starts on the WAN side, as a home router does; `forward_port` adds
the port forwarding (DNAT) a volunteer sets up by hand. The public hosts have no route to the
home subnet at all, so the only way in is what the router lets through. The home namespace is
appended to `names`/`addrs`, so `popen(home_index, ...)` runs a program at home. Needs root,
iproute2 and iptables; everything goes away in close() with the namespaces.
"""
import random
from dataclasses import dataclass
import shutil
import subprocess

from bench.netns import Hosts, NetnsError, _ip, unavailable_reason as netns_unavailable


def unavailable_reason() -> str | None:
    """Why a NAT topology cannot be made here, or None when it can."""
    reason = netns_unavailable()
    if reason:
        return reason
    if shutil.which("iptables") is None:
        return "iptables is not installed (apt-get install iptables)"
    return None


@dataclass
class _Home:
    ns: str            # the home namespace
    router_ns: str
    wan_addr: str      # the router's address on the public bridge
    lan: str           # the home subnet's first three octets
    wan: str = ""      # the router's interfaces
    lan_if: str = ""


class NatHosts(Hosts):
    """`public` hosts on one bridge plus `homes` home hosts, each behind its own NAT router.

    Home k is host `homes[k]` (`home` is the first); the methods below act on the first home's
    router unless given another home's index."""

    def __init__(self, public: int, tag: str | None = None, homes: int = 1):
        super().__init__(public, tag)
        if not 1 <= homes <= 8:
            raise ValueError(f"homes must be in 1..8, got {homes}")
        self.public_count = public
        # The public side gets a globally routable-looking /24 (11.0.0.0/8 is not private), so
        # that a peer's self-test sees a public address as it would on the internet; it exists
        # only inside these namespaces, which have no route anywhere else.
        self.subnet = f"11.213.{random.randint(1, 254)}"
        self.addrs = [f"{self.subnet}.{10 + i}" for i in range(public)]
        first_lan = random.randint(1, 254 - homes)
        self._homes: dict[int, _Home] = {}
        for k in range(homes):
            suffix = "" if k == 0 else str(k)
            home = _Home(f"sp-{self.tag}-home{suffix}", f"sp-{self.tag}-rt{suffix}", f"{self.subnet}.{250 - k}",
                         f"192.168.{first_lan + k}")
            self._homes[public + k] = home
            self.names.append(home.ns)
            self.addrs.append(f"{home.lan}.2")
        self.homes = list(self._homes)
        self.home = public                      # index of the first home host in names/addrs
        self.router_ns, self.wan_addr, self.lan = self._homes[public].router_ns, self._homes[public].wan_addr, \
            self._homes[public].lan

    def create(self) -> None:
        all_names = list(self.names)
        self.names = all_names[:self.public_count]   # the bridge part only knows the public hosts
        try:
            super().create()
        finally:
            self.names = all_names
        for i in self.homes:
            self._create_home(i)

    def _create_home(self, i: int) -> None:
        h, br = self._homes[i], self.bridge_ns
        for ns in (h.router_ns, h.ns):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        k = i - self.public_count
        wan, wan_br = f"vw{self.tag}{k}", f"vx{self.tag}{k}"
        _ip("link", "add", wan, "netns", h.router_ns, "type", "veth", "peer", "name", wan_br, "netns", br)
        _ip("-n", br, "link", "set", wan_br, "master", "br0")
        _ip("-n", br, "link", "set", wan_br, "up")
        _ip("-n", h.router_ns, "addr", "add", f"{h.wan_addr}/24", "dev", wan)
        _ip("-n", h.router_ns, "link", "set", wan, "up")
        lan, home = f"vl{self.tag}{k}", self.host_veth(i)
        _ip("link", "add", lan, "netns", h.router_ns, "type", "veth", "peer", "name", home, "netns", h.ns)
        _ip("-n", h.router_ns, "addr", "add", f"{h.lan}.1/24", "dev", lan)
        _ip("-n", h.router_ns, "link", "set", lan, "up")
        _ip("-n", h.ns, "addr", "add", f"{self.addrs[i]}/24", "dev", home)
        _ip("-n", h.ns, "link", "set", home, "up")
        _ip("-n", h.ns, "route", "add", "default", "via", f"{h.lan}.1")
        self._sh(h.router_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        # A home router: out through the WAN address, back in only as replies; nothing new comes in.
        ipt = lambda *args: self._iptables(*args, home=i)   # noqa: E731
        ipt("-t", "nat", "-A", "POSTROUTING", "-o", wan, "-j", "MASQUERADE")
        ipt("-P", "FORWARD", "DROP")
        ipt("-A", "FORWARD", "-i", lan, "-o", wan, "-j", "ACCEPT")
        ipt("-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        ipt("-P", "INPUT", "DROP")   # the router itself serves nothing on the WAN either
        ipt("-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
        ipt("-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        h.wan, h.lan_if = wan, lan

    def forward_port(self, port: int, home: int | None = None) -> str:
        """Forward TCP `port` on the router's WAN address to the same port at home (what a volunteer
        configures on a home router); returns the address to announce. With NAT loopback (most home
        routers do it): the home host itself reaches the forwarded port on the WAN address, which is
        how a peer's self-test checks what it announces."""
        i = self.home if home is None else home
        h, addr, p = self._homes[i], self.addrs[i], str(port)
        self._iptables("-t", "nat", "-A", "PREROUTING", "-d", h.wan_addr, "-p", "tcp", "--dport", p,
                       "-j", "DNAT", "--to-destination", f"{addr}:{p}", home=i)
        self._iptables("-t", "nat", "-A", "POSTROUTING", "-s", f"{h.lan}.0/24", "-d", addr, "-p", "tcp",
                       "--dport", p, "-j", "MASQUERADE", home=i)    # loopback replies return through us
        self._iptables("-I", "FORWARD", "1", "-p", "tcp", "-d", addr, "--dport", p, "-j", "ACCEPT", home=i)
        return f"/ip4/{h.wan_addr}/tcp/{port}"

    def refuse_home(self, i: int, home: int | None = None) -> None:
        """Public host i exchanges no TCP at all with a home's public (router WAN) address, as a peer
        behind a strict NAT of its own: no direct connection, not even a hole-punched one (a
        simultaneous open gets through a rule that only drops SYNs), so between that home and
        host i only a relay carries anything."""
        wan = self._homes[self.home if home is None else home].wan_addr
        self._sh(self.names[i], "iptables", "-w", "-A", "INPUT", "-s", wan, "-p", "tcp", "-j", "DROP")
        self._sh(self.names[i], "iptables", "-w", "-A", "OUTPUT", "-d", wan, "-p", "tcp", "-j", "DROP")

    def count_traffic(self, addrs: list[str], home: int | None = None) -> None:
        """Count the bytes a home's router forwards between home and each of `addrs` (traffic_bytes)."""
        for addr in addrs:
            self._iptables("-I", "FORWARD", "1", "-s", addr, home=home)      # no target: a counter, no verdict
            self._iptables("-I", "FORWARD", "1", "-d", addr, home=home)

    def traffic_bytes(self, home: int | None = None) -> dict[str, int]:
        """{public address: bytes both ways} for the addresses given to count_traffic."""
        out = self._sh(self._router(home), "iptables", "-w", "-L", "FORWARD", "-v", "-n", "-x")
        found: dict[str, int] = {}
        for line in out.splitlines():
            cols = line.split()
            if len(cols) == 8 and cols[0].isdigit() and cols[2] in ("all", "0"):   # pkts bytes prot -- * * src dst
                src, dst = cols[6], cols[7]
                if src != "0.0.0.0/0" and dst == "0.0.0.0/0":
                    found[src] = found.get(src, 0) + int(cols[1])
                elif dst != "0.0.0.0/0" and src == "0.0.0.0/0":
                    found[dst] = found.get(dst, 0) + int(cols[1])
        return found

    def count_ports(self, i: int, ports: list[int]) -> None:
        """Count the TCP bytes public host i sends and receives on each of these local ports."""
        for port in ports:
            self._sh(self.names[i], "iptables", "-w", "-I", "INPUT", "1", "-p", "tcp", "--dport", str(port))
            self._sh(self.names[i], "iptables", "-w", "-I", "OUTPUT", "1", "-p", "tcp", "--sport", str(port))

    def port_bytes(self, i: int) -> dict[int, int]:
        """{local port: bytes both ways} for the ports given to count_ports."""
        found: dict[int, int] = {}
        for chain in ("INPUT", "OUTPUT"):
            out = self._sh(self.names[i], "iptables", "-w", "-L", chain, "-v", "-n", "-x")
            for line in out.splitlines():
                cols = line.split()
                port = next((c.split(":")[1] for c in cols if c.startswith(("dpt:", "spt:"))), None)
                if port and cols[0].isdigit():
                    found[int(port)] = found.get(int(port), 0) + int(cols[1])
        return found

    def wan_of(self, home: int) -> str:
        """The public address home `home` (a host index) goes out from."""
        return self._homes[home].wan_addr

    def _router(self, home: int | None) -> str:
        return self._homes[self.home if home is None else home].router_ns

    def _iptables(self, *args: str, home: int | None = None) -> None:
        self._sh(self._router(home), "iptables", "-w", *args)

    @staticmethod
    def _sh(ns: str, *argv: str) -> str:
        proc = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise NetnsError(f"{' '.join(argv)} in {ns}: {proc.stderr.strip()}")
        return proc.stdout

    def dnat_packets(self, home: int | None = None) -> int:
        """Packets the port forwards have let in so far (first packets of connections)."""
        out = self._sh(self._router(home), "iptables", "-w", "-t", "nat", "-L", "PREROUTING", "-v", "-n", "-x")
        return sum(int(line.split()[0]) for line in out.splitlines() if "DNAT" in line)
