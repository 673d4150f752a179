"""Relay-only libp2p nodes for the NAT test and bench (issue 28): what a `--serve-relay` peer's
p2pd does, without a peer around it (like a volunteer's small VPS that only relays).

    python -m bench.support.relay_nodes ADDR COUNT OUT_JSON

starts COUNT hivemind P2P daemons listening on ADDR, reachability forced public (so that p2pd's
relay service runs: swarmcore/relay.py), writes their full multiaddrs (a JSON list, one per
node) to OUT_JSON and serves until SIGTERM, when it shuts them down. `start_relays` runs it
inside a bench/netns.py namespace and returns the addresses; the namespace's close() ends it.
"""
import asyncio
import json
import signal
import sys
import time
from pathlib import Path


async def _serve(addr: str, count: int, out: Path) -> None:
    from hivemind.p2p import P2P
    from swarmcore.relay import relay_kwargs
    nodes = [await P2P.create(host_maddrs=[f"/ip4/{addr}/tcp/0"], **relay_kwargs(serve_relay=True))
             for _ in range(count)]
    maddrs = []
    for node in nodes:
        mine = [str(m) for m in await node.get_visible_maddrs()]
        maddrs.append(next(m for m in mine if addr in m))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(maddrs))
    tmp.rename(out)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for node in nodes:
        await node.shutdown()


def start_relays(hosts, i: int, count: int, work: Path, timeout_s: float = 60.0, name: str = "") -> list[str]:
    """Start `count` relay nodes (one process) in host i of `hosts`; their multiaddrs once they are
    up. The process is hosts.processes[-1] on return; `name` tells several in one host apart."""
    return wait_relays(launch_relays(hosts, i, count, work, name), timeout_s)


def launch_relays(hosts, i: int, count: int, work: Path, name: str = "") -> Path:
    """Start the process of `start_relays` without waiting for it (several start side by side:
    each spends seconds importing); the path to give `wait_relays`."""
    out = work / f"relays{i}{name}.json"
    hosts.popen(i, [sys.executable, "-m", "bench.support.relay_nodes", hosts.addrs[i], str(count), str(out)],
                work / f"relays{i}{name}.log")
    return out


def wait_relays(out: Path, timeout_s: float = 60.0) -> list[str]:
    """The multiaddrs a `launch_relays` process wrote once its nodes were up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out.exists():
            return json.loads(out.read_text())
        time.sleep(0.2)
    log = out.with_suffix(".log").read_text()[-2000:]
    raise RuntimeError(f"relay nodes of {out.name} not up within {timeout_s:.0f}s:\n{log}")


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
