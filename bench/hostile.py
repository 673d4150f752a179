"""Hostile-input benchmark: a local swarm trains while a rogue process fires malformed and
malicious requests (17 kinds: garbage, truncated, bit-flipped, wrong version/type, wrong
shape/dtype, NaN/Inf, bogus gradient shares, oversized and partial or lying streams, nested
bombs, ...) at its peers over hivemind P2P on 127.0.0.1, and tries to forge adverts in the DHT.

    .venv/bin/python bench/hostile.py [--inputs 10000] [--peers 3] [--stages 2] [--join-key]
Last line: RESULT inputs_tried=<n> crashes=<n> iterations_lost=<n> peak_rss_mb=<n>
(crashes: peers that died; iterations_lost: iterations missing or with a lost microbatch while
under attack; peak_rss_mb: the largest peer's peak resident memory, vs --rss-budget-mb).
"""
import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.support.harness import coordinator, peers, wait_for  # noqa: E402
from bench.support.soak import start_rogue, stop_rogue  # noqa: E402


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def iterations_lost(summaries, first: int) -> int:
    seen = {s.iteration: s for s in summaries if s.iteration >= first}
    if not seen:
        return 0
    span = range(first, max(seen) + 1)
    return sum(1 for i in span if i not in seen or seen[i].lost > 0)


async def bench(args, work: Path) -> dict:
    extra = ["--announce-period", "2"]
    overrides = dict(min_peers=args.peers, num_stages=args.stages, max_steps=0)
    if args.join_key:
        overrides["join_key_path"] = str(work / "join.key")
    async with coordinator(**overrides) as app:
        if args.join_key:
            extra += ["--join-key", str(work / "join.key")]
        with peers(app, work, args.peers, *extra) as procs:
            await wait_for(lambda: len(app.summaries) >= 2, 300, "two iterations before the attack")
            first = app.summaries[-1].iteration + 1
            started = time.monotonic()
            rogue = start_rogue(app.maddrs, app.config.run, args.max_seconds, args.rate, work / "rogue.log",
                                count=args.inputs)
            try:
                while rogue.poll() is None:
                    await asyncio.sleep(1.0)
            finally:
                stop_rogue(rogue)
            attack_s = time.monotonic() - started
            done = len(app.summaries)
            try:
                await wait_for(lambda: len(app.summaries) >= done + 2, 120, "two iterations after the attack")
            except AssertionError:
                pass
            forged = sum(1 for a in (await app.records.get_adverts()).values() if a.fwd_s_per_layer_sample == 1e-9)
            return dict(report=(work / "rogue.log").read_text().strip().splitlines()[-1:] or [""],
                        crashes=sum(1 for p in procs if p.poll() is not None),
                        lost=iterations_lost(app.summaries, first), attack_s=attack_s,
                        iterations=len([s for s in app.summaries if s.iteration >= first]),
                        rss=max(peak_rss_mb(p.pid) for p in procs), forged=forged)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", type=int, default=10_000, help="malformed requests to send (default 10000)")
    p.add_argument("--rate", type=float, default=0.0, help="requests/s (default 0: as fast as the rogue can)")
    p.add_argument("--max-seconds", type=float, default=480.0, help="stop the attack after this long")
    p.add_argument("--peers", type=int, default=3)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--join-key", action="store_true", help="run with a join key (the rogue is not a member)")
    p.add_argument("--rss-budget-mb", type=float, default=1500.0)
    p.add_argument("--logs-dir", type=Path, help="keep peer and rogue logs here (default: a temporary folder)")
    args = p.parse_args()
    if args.logs_dir:
        args.logs_dir.mkdir(parents=True, exist_ok=True)
        r = asyncio.run(bench(args, args.logs_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="skippipe-hostile-") as tmp:
            r = asyncio.run(bench(args, Path(tmp)))
    line = r["report"][0]
    sent = int(line.split("sent=")[1].split()[0]) if "sent=" in line else 0
    print(f"rogue: {line}")
    print(f"attack {r['attack_s']:.0f}s ({sent / max(r['attack_s'], 1e-9):.0f} inputs/s), "
          f"{r['iterations']} iterations trained meanwhile and after, forged adverts seen: {r['forged']}")
    print(f"peak peer RSS {r['rss']:.0f} MB (budget {args.rss_budget_mb:.0f} MB: "
          f"{'within' if r['rss'] <= args.rss_budget_mb else 'OVER'})")
    print(f"RESULT inputs_tried={sent} crashes={r['crashes']} iterations_lost={r['lost']} peak_rss_mb={r['rss']:.0f}")
    return 0 if r["crashes"] == 0 and r["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
