"""A home network behind a masquerading router, next to bench/netns.py's public hosts (issue 28).

    public hosts 0..n-1  --br0--  router (WAN: <subnet>.250)  --veth--  home (192.168.<k>.2)

The router namespace NATs the home's traffic out of its WAN address (iptables MASQUERADE) and
drops every connection that starts on the WAN side, as a home router does; `forward_port` adds
the port forwarding (DNAT) a volunteer sets up by hand. The public hosts have no route to the
home subnet at all, so the only way in is what the router lets through. The home namespace is
appended to `names`/`addrs`, so `popen(home_index, ...)` runs a program at home. Needs root,
iproute2 and iptables; everything goes away in close() with the namespaces.
"""
import random
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


class NatHosts(Hosts):
    """`public` hosts on one bridge plus one home host behind a NAT router."""

    def __init__(self, public: int, tag: str | None = None):
        super().__init__(public, tag)
        self.public_count = public
        # The public side gets a globally routable-looking /24 (11.0.0.0/8 is not private), so
        # that a peer's self-test sees a public address as it would on the internet; it exists
        # only inside these namespaces, which have no route anywhere else.
        self.subnet = f"11.213.{random.randint(1, 254)}"
        self.addrs = [f"{self.subnet}.{10 + i}" for i in range(public)]
        self.router_ns = f"sp-{self.tag}-rt"
        self.wan_addr = f"{self.subnet}.250"
        self.lan = f"192.168.{random.randint(1, 254)}"
        self.home = public                      # index of the home host in names/addrs
        self.names.append(f"sp-{self.tag}-home")
        self.addrs.append(f"{self.lan}.2")

    def create(self) -> None:
        public_names, home_ns = self.names[:-1], self.names[-1]
        self.names = public_names               # the bridge part only knows the public hosts
        try:
            super().create()
        finally:
            self.names = [*public_names, home_ns]
        rt, br = self.router_ns, self.bridge_ns
        for ns in (rt, home_ns):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        wan, wan_br = f"vw{self.tag}", f"vx{self.tag}"
        _ip("link", "add", wan, "netns", rt, "type", "veth", "peer", "name", wan_br, "netns", br)
        _ip("-n", br, "link", "set", wan_br, "master", "br0")
        _ip("-n", br, "link", "set", wan_br, "up")
        _ip("-n", rt, "addr", "add", f"{self.wan_addr}/24", "dev", wan)
        _ip("-n", rt, "link", "set", wan, "up")
        lan, home = f"vl{self.tag}", self.host_veth(self.home)
        _ip("link", "add", lan, "netns", rt, "type", "veth", "peer", "name", home, "netns", home_ns)
        _ip("-n", rt, "addr", "add", f"{self.lan}.1/24", "dev", lan)
        _ip("-n", rt, "link", "set", lan, "up")
        _ip("-n", home_ns, "addr", "add", f"{self.addrs[self.home]}/24", "dev", home)
        _ip("-n", home_ns, "link", "set", home, "up")
        _ip("-n", home_ns, "route", "add", "default", "via", f"{self.lan}.1")
        self._sh(rt, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        # A home router: out through the WAN address, back in only as replies; nothing new comes in.
        self._iptables("-t", "nat", "-A", "POSTROUTING", "-o", wan, "-j", "MASQUERADE")
        self._iptables("-P", "FORWARD", "DROP")
        self._iptables("-A", "FORWARD", "-i", lan, "-o", wan, "-j", "ACCEPT")
        self._iptables("-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        self._iptables("-P", "INPUT", "DROP")   # the router itself serves nothing on the WAN either
        self._iptables("-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
        self._iptables("-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        self._wan, self._lan = wan, lan

    def forward_port(self, port: int) -> str:
        """Forward TCP `port` on the router's WAN address to the same port at home (what a volunteer
        configures on a home router); returns the address to announce. With NAT loopback (most home
        routers do it): the home host itself reaches the forwarded port on the WAN address, which is
        how a peer's self-test checks what it announces."""
        home, p = self.addrs[self.home], str(port)
        self._iptables("-t", "nat", "-A", "PREROUTING", "-d", self.wan_addr, "-p", "tcp", "--dport", p,
                       "-j", "DNAT", "--to-destination", f"{home}:{p}")
        self._iptables("-t", "nat", "-A", "POSTROUTING", "-s", f"{self.lan}.0/24", "-d", home, "-p", "tcp",
                       "--dport", p, "-j", "MASQUERADE")    # loopback replies return through us
        self._iptables("-I", "FORWARD", "1", "-p", "tcp", "-d", home, "--dport", p, "-j", "ACCEPT")
        return f"/ip4/{self.wan_addr}/tcp/{port}"

    def refuse_home(self, i: int) -> None:
        """Public host i drops every connection that starts at home (from the router's WAN address),
        as a peer behind its own NAT would: between home and host i only a relay carries anything."""
        self._sh(self.names[i], "iptables", "-w", "-A", "INPUT", "-s", self.wan_addr, "-p", "tcp", "--syn",
                 "-j", "DROP")

    def count_traffic(self, addrs: list[str]) -> None:
        """Count the bytes the router forwards between home and each of `addrs` (traffic_bytes)."""
        for addr in addrs:
            self._iptables("-I", "FORWARD", "1", "-s", addr)      # no target: a counter, no verdict
            self._iptables("-I", "FORWARD", "1", "-d", addr)

    def traffic_bytes(self) -> dict[str, int]:
        """{public address: bytes both ways} for the addresses given to count_traffic."""
        out = self._sh(self.router_ns, "iptables", "-w", "-L", "FORWARD", "-v", "-n", "-x")
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

    def _iptables(self, *args: str) -> None:
        self._sh(self.router_ns, "iptables", "-w", *args)

    @staticmethod
    def _sh(ns: str, *argv: str) -> str:
        proc = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise NetnsError(f"{' '.join(argv)} in {ns}: {proc.stderr.strip()}")
        return proc.stdout

    def dnat_packets(self) -> int:
        """Packets the port forwards have let in so far (first packets of connections)."""
        out = self._sh(self.router_ns, "iptables", "-w", "-t", "nat", "-L", "PREROUTING", "-v", "-n", "-x")
        return sum(int(line.split()[0]) for line in out.splitlines() if "DNAT" in line)
