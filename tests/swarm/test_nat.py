"""A volunteer behind a home router (issue 28): real NAT in network namespaces (bench/nat_netns.py).

The home namespace sits behind a router namespace that masquerades and drops every connection
that starts outside; the coordinator and the other peers are on the public side."""
import re
import time

import pytest

from bench.nat_netns import NatHosts, unavailable_reason
from bench.support.netns_swarm import iterations, start_coordinator, start_peer, wait_iterations, wait_maddrs
from bench.support.relay_nodes import launch_relays, wait_relays
from tests.swarm.netns import wait_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
HOME_PORT = 34567          # inside the home namespace only


@pytest.fixture
def nat_hosts():
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    hosts = NatHosts(2)
    try:
        hosts.create()
        yield hosts
    finally:
        hosts.close()


def test_a_home_peer_with_a_forwarded_port_is_public_and_dialled_directly(nat_hosts, tmp_path):
    hosts = nat_hosts
    maddrs = wait_maddrs(start_coordinator(hosts, 0, tmp_path, "--stages", "2", "--min-peers", "2",
                                           "--steps", "2"))
    assert hosts.dnat_packets() == 0
    announce = hosts.forward_port(HOME_PORT)
    start_peer(hosts, 1, tmp_path, maddrs, 0)
    start_peer(hosts, hosts.home, tmp_path, maddrs, 1,
               "--host-maddrs", f"/ip4/{hosts.addrs[hosts.home]}/tcp/{HOME_PORT}", "--announce-maddrs", announce)
    home_log = tmp_path / f"peer{hosts.home}.log"
    wait_log(home_log, "reachability: public", 45, poll_s=0.25)
    rows = wait_iterations(tmp_path / "coordinator.log", 2, 60)
    assert all(r["completed"] == 2 and r["lost"] == 0 for r in rows[:2]), rows
    # Stage 1 lives only at home, so every microbatch went in through the forwarded port: the
    # router let connections in, and the only rule that lets anything new in is the DNAT.
    assert hosts.dnat_packets() > 0
    assert "run finished after 2 iterations" in wait_log(home_log, "run finished", 20, poll_s=0.25)


def test_a_home_peer_without_a_forward_is_local_only_yet_trains_over_connections_it_opened(nat_hosts, tmp_path):
    """No relay and no forward: the home peer dials out (the DHT, its link probes) and libp2p
    carries the others' streams back over those connections, so it trains; what it cannot get
    is a dial that starts outside (the next test)."""
    hosts = nat_hosts
    maddrs = wait_maddrs(start_coordinator(hosts, 0, tmp_path, "--stages", "2", "--min-peers", "2",
                                           "--steps", "2"))
    start_peer(hosts, 1, tmp_path, maddrs, 0)
    start_peer(hosts, hosts.home, tmp_path, maddrs, 1)     # stage 1 only at home
    home_log = tmp_path / f"peer{hosts.home}.log"
    wait_log(home_log, "reachability: local-only", 45, poll_s=0.25)
    rows = wait_iterations(tmp_path / "coordinator.log", 2, 60)
    assert all(r["completed"] == 2 and r["lost"] == 0 for r in rows[:2]), rows
    assert hosts.dnat_packets() == 0


def _port(maddr: str) -> int:
    return int(maddr.split("/tcp/")[1].split("/")[0])


def _slot_ports(log: str) -> set[int]:
    """The relay ports of a peer's slots, as its last report of them says."""
    line = [x for x in log.splitlines() if "relay slot reserved" in x or "relay slots changed" in x][-1]
    return {int(p) for p in re.findall(r"tcp/(\d+)/p2p/\w+/p2p-circuit", line)}


@pytest.mark.timeout(180)     # ~25-45 s; seven processes start on a box that may be busy
def test_a_home_peer_behind_nat_trains_through_relays_and_outlives_every_relay_it_used(nat_hosts, tmp_path):
    """--relay-via: the home peer reserves slots on relay-only nodes (five, one process each, as a
    --serve-relay peer's p2pd on its own host; libp2p reserves at once only with four candidates,
    docs/nat.md), advertises circuit addresses and reports `relayed`. The stage-0 peer drops all
    TCP to and from home's address (as if behind a strict NAT too: no hole punching either), and
    holds relay slots as well (else home could only answer over connections the stage-0 peer
    opened), so every activation and gradient between them crosses a relay: training completes
    only if the relay carries it. Then every relay holding a slot of either peer dies mid-run
    (autorelay holds two each: at least one relay is left): each peer reserves a slot on what is
    left and announces its new address, the other dials it by that advert (p2pd's addresses of it
    are all dead), and the microbatches caught in between are sent again: nothing lost. (CI51,
    with the relays two to a process, lost every microbatch after such a kill.)"""
    hosts = nat_hosts
    maddrs = wait_maddrs(start_coordinator(hosts, 0, tmp_path, "--stages", "2", "--min-peers", "2",
                                           "--steps", "1000"))    # still running when the relays die
    launched = [(launch_relays(hosts, 0, 1, tmp_path, name=name), hosts.processes[-1]) for name in "abcde"]
    relays = [(wait_relays(out)[0], proc) for out, proc in launched]
    hosts.refuse_home(1)
    hosts.count_traffic(hosts.addrs[:2])
    hosts.count_ports(0, [_port(m) for m, _ in relays])
    start_peer(hosts, 1, tmp_path, maddrs, 0, "--relay-via", *(m for m, _ in relays))
    start_peer(hosts, hosts.home, tmp_path, maddrs, 1, "--relay-via", *(m for m, _ in relays))
    logs = [tmp_path / "peer1.log", tmp_path / f"peer{hosts.home}.log"]
    log = wait_log(logs[1], "reachability: relayed", 90, poll_s=0.25)
    assert "relay slot reserved" in log and "/p2p-circuit" in log
    wait_log(logs[0], "reachability: relayed", 30, poll_s=0.25)
    rows = wait_iterations(tmp_path / "coordinator.log", 3, 60)
    assert all(r["completed"] == 2 and r["lost"] == 0 for r in rows[:3]), rows
    router = hosts.traffic_bytes()
    assert router.get(hosts.addrs[1], 0) < 10_000, router         # home <-> stage 0: dropped SYNs only
    ports = hosts.port_bytes(0)
    assert sum(ports.values()) > 100_000, ports                    # activations and gradients
    held = _slot_ports(logs[0].read_text()) | _slot_ports(logs[1].read_text())
    doomed = [proc for m, proc in relays if _port(m) in held]
    left = [_port(m) for m, _ in relays if _port(m) not in held]
    assert left, held
    for proc in doomed:
        hosts.stop(proc, grace_s=0)                                # those relay processes are gone
    done = len(iterations(tmp_path / "coordinator.log"))
    before = sum(ports.get(p, 0) for p in left)

    def left_bytes() -> int:
        return sum(hosts.port_bytes(0).get(p, 0) for p in left)
    # a relay that was left carries their tensors once both hold a slot on one and have found
    # each other: how soon depends on autorelay and the adverts; bounded, polled
    deadline = time.monotonic() + 60
    while left_bytes() - before <= 100_000 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left_bytes() - before > 100_000, (held, left, hosts.port_bytes(0))
    for log in logs:                                   # both noticed their slots go, both moved
        wait_log(log, "relay slots changed", 30, poll_s=0.25)
    rows = wait_iterations(tmp_path / "coordinator.log", len(iterations(tmp_path / "coordinator.log")) + 2, 60)
    # a microbatch crossing a relay when it died is sent again (reissued), not lost
    bad = [r for r in rows[done - 1:] if r["lost"] or r["completed"] + r["rerouted"] + r["reissued"] != 2]
    assert not bad, bad


def test_without_a_forward_nothing_outside_can_dial_home(nat_hosts, tmp_path):
    """The topology really is a NAT: home dials out, nothing dials in (a check on the fixture that
    the relayed and forwarded cases rely on)."""
    import subprocess
    import sys
    hosts = nat_hosts
    server = hosts.popen(hosts.home, [sys.executable, "-m", "http.server", str(HOME_PORT), "--bind",
                                      hosts.addrs[hosts.home]], tmp_path / "http.log")
    probe = ("import socket,sys; s=socket.socket(); s.settimeout(1.5); "
             "sys.exit(s.connect_ex((sys.argv[1], int(sys.argv[2]))))")

    def dial(i: int, addr: str) -> int:
        return subprocess.run(["ip", "netns", "exec", hosts.names[i], sys.executable, "-c", probe, addr,
                               str(HOME_PORT)], timeout=20).returncode
    deadline = time.monotonic() + 10
    while dial(hosts.home, hosts.addrs[hosts.home]) != 0:    # the server is up
        assert time.monotonic() < deadline and server.poll() is None
        time.sleep(0.2)
    assert dial(0, hosts.wan_addr) != 0 and dial(0, hosts.addrs[hosts.home]) != 0
    hosts.forward_port(HOME_PORT)
    assert dial(0, hosts.wan_addr) == 0
