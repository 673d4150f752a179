"""Does hivemind's circuit relay carry our traffic? (issue 28, step 1)

    python -m bench.relay_probe [--sizes-mb 1 4 16] [--pings 20]

Builds bench/nat_netns.py's topology (two public hosts, one home host behind a masquerading
router), starts three bare hivemind P2P daemons: a relay (public host 0, reachability forced
public so that its relay service runs), a home peer (auto relay, reachability forced private,
bootstrapped through the relay, which is then its trusted relay) and a client (public host 1).
The client dials the home peer only through the home peer's /p2p-circuit address, then times
round trips and 1-16 MB transfers, and the same against the relay directly (public to public).
Prints one `RESULT ...` line. Every daemon is a child of a process in our namespaces: close()
ends them by pid. RELAY_WAIT_S (default 30) bounds the wait for the home peer's relay address.
Findings (hivemind 1.1.12's p2pd): docs/nat.md#relays.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HANDLER = "skippipe.relay_probe"


async def _serve(p2p) -> None:
    from hivemind.p2p import P2P

    async def sink(_info, reader, writer) -> None:   # every message answered by a one-byte ack
        try:
            while True:
                await P2P.receive_raw_data(reader)
                await P2P.send_raw_data(b"k", writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
    await p2p.add_binary_stream_handler(HANDLER, sink)


async def _role_server(addr: str, out: Path, relay_maddrs: list[str], home: bool) -> None:
    from hivemind.p2p import P2P
    kwargs = (dict(use_auto_relay=True, force_reachability="private", trusted_relays=relay_maddrs) if home
              else dict(force_reachability="public"))   # the relay service runs only on a "public" node
    p2p = await P2P.create(host_maddrs=[f"/ip4/{addr}/tcp/0"], initial_peers=relay_maddrs or None,
                           use_relay=True, **kwargs)
    await _serve(p2p)
    wait_s = float(os.environ.get("RELAY_WAIT_S", "30")) if home else 0.0
    deadline = time.monotonic() + wait_s
    maddrs = [str(m) for m in await p2p.get_visible_maddrs(latest=True)]
    while home and not any("p2p-circuit" in m for m in maddrs) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)        # autorelay reserves a slot on the relay in the background
        maddrs = [str(m) for m in await p2p.get_visible_maddrs(latest=True)]
    out.write_text(json.dumps({"peer_id": p2p.peer_id.to_base58(), "maddrs": maddrs,
                               "waited_s": round(wait_s - (deadline - time.monotonic()), 2)}))
    await asyncio.Future()


async def _measure(p2p, peer_id, maddrs: list[str], sizes_mb: list[float], pings: int) -> dict:
    from hivemind.p2p import P2P, PeerID
    from peer.transport.redial import daemon_maddrs   # the form the daemon's connect parses
    pid = PeerID.from_base58(peer_id)
    t0 = time.perf_counter()
    await p2p._client.connect(pid, daemon_maddrs(peer_id, maddrs))
    _, reader, writer = await p2p.call_binary_stream_handler(pid, HANDLER)
    result = {"connect_s": round(time.perf_counter() - t0, 4)}
    rtts = []
    for _ in range(pings):
        t = time.perf_counter()
        await P2P.send_raw_data(b"p", writer)
        await P2P.receive_raw_data(reader)
        rtts.append(time.perf_counter() - t)
    result["rtt_ms"] = round(1000 * statistics.median(rtts), 3)
    for mb in sizes_mb:
        data = bytes(int(mb * 2**20))
        t = time.perf_counter()
        await P2P.send_raw_data(data, writer)
        await P2P.receive_raw_data(reader)
        result[f"{mb:g}MB_MBps"] = round(len(data) / 2**20 / (time.perf_counter() - t), 1)
    writer.close()
    return result


async def _role_client(addr: str, out: Path, relay: dict, home: dict, sizes_mb: list[float], pings: int) -> None:
    from hivemind.p2p import P2P
    p2p = await P2P.create(host_maddrs=[f"/ip4/{addr}/tcp/0"], initial_peers=relay["maddrs"])
    # Without a reservation the home peer advertises no circuit address: dial the relay's circuit
    # address for it anyway (what a peer that knows the relay would try).
    circuit = [m for m in home["maddrs"] if "p2p-circuit" in m] or [
        f"{m}/p2p-circuit/p2p/{home['peer_id']}" for m in relay["maddrs"]]
    report = {}
    try:
        report["direct"] = await asyncio.wait_for(_measure(p2p, relay["peer_id"], relay["maddrs"], sizes_mb, pings), 60)
    except Exception as exc:
        report["direct"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        report["relayed"] = await asyncio.wait_for(
            _measure(p2p, home["peer_id"], circuit, sizes_mb, pings), 120)
    except Exception as exc:     # the question is whether it works: a failure is an answer
        report["relayed"] = {"error": f"{type(exc).__name__}: {exc}"}
    out.write_text(json.dumps(report))
    await p2p.shutdown()


def _wait_json(path: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return json.loads(path.read_text())
        time.sleep(0.2)
    raise SystemExit(f"{path.name} not written within {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16])
    p.add_argument("--pings", type=int, default=20)
    p.add_argument("--relays", type=int, default=1, help="public peers serving as relays (all trusted by home)")
    args = p.parse_args(argv)
    from bench.nat_netns import NatHosts, unavailable_reason
    if (reason := unavailable_reason()):
        print(f"RESULT relay=skipped reason={reason!r}")
        return 0
    with tempfile.TemporaryDirectory() as tmp, NatHosts(args.relays + 1) as hosts:
        tmp = Path(tmp)
        me = [sys.executable, "-m", "bench.relay_probe"]
        for r in range(args.relays):
            hosts.popen(r, [*me, "_relay", hosts.addrs[r], str(tmp / f"relay{r}.json")], tmp / f"relay{r}.log")
        relays = [_wait_json(tmp / f"relay{r}.json", 30) for r in range(args.relays)]
        relay = relays[0]
        hosts.popen(hosts.home, [*me, "_home", hosts.addrs[hosts.home], str(tmp / "home.json"),
                                *(m for r in relays for m in r["maddrs"])],
                    tmp / "home.log")
        home = _wait_json(tmp / "home.json", 30 + float(os.environ.get("RELAY_WAIT_S", "30")))
        hosts.popen(args.relays, [*me, "_client", hosts.addrs[args.relays], str(tmp / "client.json"),
                        json.dumps(relay), json.dumps(home), json.dumps([args.sizes_mb, args.pings])],
                    tmp / "client.log")
        try:
            report = _wait_json(tmp / "client.json", 200)
        except SystemExit:
            print((tmp / "client.log").read_text()[-3000:], (tmp / "home.log").read_text()[-3000:])
            raise
        log_tails = {n: (tmp / f"{n}.log").read_text()[-4000:] for n in ("home", "relay0")}
    if os.environ.get("RELAY_LOGS"):
        for name in ("home", "relay0"):
            print(f"--- {name}.log", log_tails[name], sep="\n")
    print(json.dumps({"home_maddrs": home["maddrs"], "relay_reservation_s": home["waited_s"], **report}, indent=1))
    rel, direct = report["relayed"], report["direct"]
    if "error" in direct:
        print(f"RESULT relay=unmeasured direct_error={direct['error']!r}")
        return 1
    big = f"{args.sizes_mb[-1]:g}MB_MBps"
    print(f"RESULT relay={'ok' if big in rel else 'failed'} rtt_direct_ms={direct['rtt_ms']} "
          f"rtt_relayed_ms={rel.get('rtt_ms')} {big}_direct={direct[big]} {big}_relayed={rel.get(big)}")
    return 0


def _entry(role: str, addr: str, out: str, *extra: str) -> None:
    """One daemon's side, started by main() inside its namespace: role, listen address, output file."""
    if role == "_relay":
        asyncio.run(_role_server(addr, Path(out), [], home=False))
    elif role == "_home":
        asyncio.run(_role_server(addr, Path(out), list(extra), home=True))
    else:
        sizes, pings = json.loads(extra[2])
        asyncio.run(_role_client(addr, Path(out), json.loads(extra[0]), json.loads(extra[1]), sizes, pings))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        _entry(*sys.argv[1:])
    else:
        sys.exit(main())
