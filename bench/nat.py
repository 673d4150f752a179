"""A third of the swarm behind NAT, against the same swarm all public (issue 28).

    sudo python -m bench.nat [--peers 6] [--stages 3] [--iterations 14] [--keep DIR]

One namespace topology (bench/nat_netns.py), two swarms in turn (three with --strict), each with
its own coordinator and the same peers (tiny model, `--stage auto`: the planner places them and
plans links with a relayed end dearer, coordinator/planner/relayed.py):
- public: every peer on its own public host;
- nat: a third of the peers each behind its own home router (masquerade, nothing comes in),
  with `--relay-via` four relay-only nodes (two processes of two nodes on two public relay
  hosts: libp2p reserves at once only with four candidates). A home peer reaches public peers
  over connections it opens; others reach it over those, or through a relay;
- strict (--strict): as nat, but the public peers also drop all TCP to and from the homes
  and hold relay slots themselves (`--relay-via`, which hides their public addresses: all six
  peers then say `relayed`), so every byte between peers crosses a relay: the relays' worst
  case. As of 2026-12-05 this swarm stalls (docs/nat.md), hence not part of the default run.
Measured per swarm over the same window of iterations (after `--skip` warm-up ones): the mean
iteration time, microbatches lost, and the bytes the home routers forwarded to the relay hosts
(relayed bytes: nothing else talks to those hosts) and straight to another home's router (a
direct home-to-home connection, which only hole punching can open). Then the relay process that
carried more of the last swarm's bytes is killed and that swarm runs on: the next iterations
show how a dead relay is handled (rerouted / skipped / lost) and what the other relay carried.
Last line: RESULT nat_vs_public=<ratio> lost=<n> relayed_mb=<MB> strict_vs_public=<ratio> ...
           relay_kill_lost=<n> ... load=<1-min load, the higher of start and end>
"""
import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.nat_netns import NatHosts, unavailable_reason  # noqa: E402
from bench.support.netns_swarm import start_coordinator, start_peer, wait_maddrs  # noqa: E402
from bench.support.relay_nodes import start_relays  # noqa: E402

ROW = re.compile(r"^iteration (\d+): .*?([\d.]+)s, microbatches completed=(\d+) rerouted=(\d+) "
                 r"skipped_stage=(\d+) reissued=(\d+) lost=(\d+)", re.M)
SWARM = ("--microbatch-samples", "4", "--seq-len", "64", "--microbatches", "4")


def rows(log: Path) -> list[dict]:
    text = log.read_text() if log.exists() else ""
    keys = ("iteration", "seconds", "completed", "rerouted", "skipped_stage", "reissued", "lost")
    return [dict(zip(keys, (int(m[0]), float(m[1]), *map(int, m[2:])))) for m in ROW.findall(text)]


def wait_rows(log: Path, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = rows(log)
        if len(found) >= count:
            return found
        time.sleep(0.5)
    raise RuntimeError(f"{count} iterations not reached in {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def swarm(hosts: NatHosts, work: Path, peer_hosts: list[int], args, relays: list[str], via: set[int]) -> list:
    """Coordinator in host 0 and a peer in each of peer_hosts (those in `via` hold slots on
    `relays`); returns the processes started."""
    work.mkdir(parents=True, exist_ok=True)
    first = len(hosts.processes)
    maddrs = wait_maddrs(start_coordinator(hosts, 0, work, "--stages", str(args.stages), "--min-peers",
                                           str(len(peer_hosts)), "--steps", "100000", *SWARM), 120)
    for i in peer_hosts:
        extra = ("--relay-via", *relays) if i in via else ()
        start_peer(hosts, i, work, maddrs, "auto", *extra)
    return hosts.processes[first:]


def measure(hosts: NatHosts, log: Path, args, counted: list[str]) -> tuple[dict, dict[str, int]]:
    """The window's iteration figures and the bytes the home routers forwarded to each of `counted`."""
    wait_rows(log, args.skip, args.timeout)
    before = routed_bytes(hosts, counted)
    found = wait_rows(log, args.iterations, args.timeout)
    after = routed_bytes(hosts, counted)
    kept = found[args.skip:args.iterations]
    figures = dict(mean_s=sum(r["seconds"] for r in kept) / len(kept), lost=sum(r["lost"] for r in found[:args.iterations]),
                   recovered=sum(r["rerouted"] + r["skipped_stage"] + r["reissued"] for r in found[:args.iterations]),
                   times=[r["seconds"] for r in kept])
    return figures, {a: after[a] - before[a] for a in counted}


def routed_bytes(hosts: NatHosts, addrs: list[str]) -> dict[str, int]:
    out = dict.fromkeys(addrs, 0)
    for home in hosts.homes:
        for addr, count in hosts.traffic_bytes(home).items():
            out[addr] = out.get(addr, 0) + count
    return out


def end(hosts: NatHosts, procs: list) -> None:
    for proc in reversed(procs):
        hosts.stop(proc, grace_s=5)


def run(args, work: Path) -> dict:
    homes = max(1, args.peers // 3)
    public_peers = args.peers - homes
    # hosts: 0 coordinator, 1..public_peers public peers, then `homes` public stand-ins for the home
    # peers (the all-public swarm), then two relay hosts; then the homes
    public = list(range(1, 1 + public_peers))
    stand_ins = list(range(1 + public_peers, 1 + args.peers))
    relay_hosts = [1 + args.peers, 2 + args.peers]
    out = dict(homes=homes)
    with NatHosts(3 + args.peers, homes=homes) as hosts:
        procs = swarm(hosts, work / "public", public + stand_ins, args, [], set())
        out["public"], _ = measure(hosts, work / "public" / "coordinator.log", args, [])
        end(hosts, procs)
        first = len(hosts.processes)
        relays = [m for r in relay_hosts for m in start_relays(hosts, r, 2, work)]
        relay_procs = hosts.processes[first:]
        relay_addrs = [hosts.addrs[r] for r in relay_hosts]
        wans = [hosts.wan_of(h) for h in hosts.homes]
        for home in hosts.homes:     # to the relays, and straight to another home's router
            hosts.count_traffic(relay_addrs + [w for w in wans if w != hosts.wan_of(home)], home)
        names = ("nat", "strict") if args.strict else ("nat",)
        for name in names:
            via = set(hosts.homes)
            if name == "strict":     # public peers refuse connections from homes: all crosses a relay
                for i in public:
                    for home in hosts.homes:
                        hosts.refuse_home(i, home)
                via |= set(public)   # and hold relay slots, or a home could never reach them
            procs = swarm(hosts, work / name, public + hosts.homes, args, relays, via)
            log = work / name / "coordinator.log"
            out[name], moved = measure(hosts, log, args, relay_addrs + wans)
            out[name]["relayed"] = {a: moved[a] for a in relay_addrs}
            out[name]["punched"] = sum(moved[w] for w in wans)
            if name != names[-1]:
                end(hosts, procs)
        # the last swarm runs on while the relay process that carried more of its bytes dies
        busiest = max(range(2), key=lambda k: out[names[-1]]["relayed"][relay_addrs[k]])
        hosts.stop(relay_procs[busiest], grace_s=0)    # SIGTERM then SIGKILL: the relay is gone
        killed_at = len(rows(log))
        before = routed_bytes(hosts, relay_addrs)
        out["tail"] = wait_rows(log, killed_at + args.after_kill, args.timeout)[killed_at:killed_at + args.after_kill]
        after = routed_bytes(hosts, relay_addrs)
        out["busiest"], out["killed_in"] = relay_addrs[busiest], names[-1]
        out["survivor_mb"] = (after[relay_addrs[1 - busiest]] - before[relay_addrs[1 - busiest]]) / 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", type=int, default=6, help="peers in each swarm; a third of them at home (default 6)")
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--iterations", type=int, default=14, help="iterations per swarm (default 14)")
    p.add_argument("--skip", type=int, default=4, help="warm-up iterations left out of the mean (default 4)")
    p.add_argument("--after-kill", type=int, default=6, help="nat iterations after the relay is killed (default 6)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for a swarm's iterations")
    p.add_argument("--strict", action="store_true",
                   help="also run the strict swarm (every home byte through a relay; stalls as of 2026-12-05, docs/nat.md)")
    p.add_argument("--keep", metavar="DIR", help="keep the logs here")
    args = p.parse_args(argv)
    if (reason := unavailable_reason()):
        print(f"RESULT nat_vs_public=skipped reason={reason!r}")
        return 0
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="skippipe-nat-") as tmp:
        work = Path(args.keep or tmp)
        r = run(args, work)
    load = max(load0, os.getloadavg()[0])
    pub, nat, tail = r["public"], r["nat"], r["tail"]
    strict = r.get("strict")
    kill_lost = sum(x["lost"] for x in tail)
    kill_recovered = sum(x["rerouted"] + x["skipped_stage"] + x["reissued"] for x in tail)
    print(f"all public: mean {pub['mean_s']:.3f} s over iterations {args.skip}-{args.iterations - 1} "
          f"({', '.join(f'{t:.2f}' for t in pub['times'])}), lost {pub['lost']}")
    for name, f in (("nat", nat), ("strict", strict)):
        if f is None:
            continue
        per_relay = ", ".join(f"{a}: {b / 1e6:.2f}" for a, b in f["relayed"].items())
        print(f"{name}: {r['homes']} of {args.peers} behind NAT: mean {f['mean_s']:.3f} s "
              f"({', '.join(f'{t:.2f}' for t in f['times'])}), lost {f['lost']}, recovered {f['recovered']}; "
              f"relayed {sum(f['relayed'].values()) / 1e6:.2f} MB in the window ({per_relay}); home to home "
              f"without a relay {f['punched'] / 1e6:.2f} MB")
    tail_times = ", ".join(f"{x['seconds']:.2f}" for x in tail)
    print(f"{r['killed_in']}: relay process on {r['busiest']} killed: next {len(tail)} iterations lost {kill_lost}, "
          f"rerouted/skipped/reissued {kill_recovered}, times {tail_times}; the other relay host carried "
          f"{r['survivor_mb']:.2f} MB meanwhile")
    extra = (f" strict_vs_public={strict['mean_s'] / pub['mean_s']:.3f} "
             f"strict_relayed_mb={sum(strict['relayed'].values()) / 1e6:.2f}") if strict else ""
    lost = pub["lost"] + nat["lost"] + (strict["lost"] if strict else 0)
    print(f"RESULT nat_vs_public={nat['mean_s'] / pub['mean_s']:.3f} lost={lost} "
          f"relayed_mb={sum(nat['relayed'].values()) / 1e6:.2f} public_s={pub['mean_s']:.3f} "
          f"nat_s={nat['mean_s']:.3f} punched_mb={nat['punched'] / 1e6:.2f} relay_kill_lost={kill_lost} "
          f"relay_kill_recovered={kill_recovered} survivor_mb={r['survivor_mb']:.2f}{extra} "
          f"wall_s={time.monotonic() - t0:.0f} load={load:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
