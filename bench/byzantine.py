"""Byzantine peers against a small local swarm (issue 24): every attack of the issue, with the
held-out loss of the honest peers at the end against an honest run.

Attacks, each against the product code:
- forged spec/schedule, uninvited / banned / second-identity writers: real hivemind DHT nodes
  on 127.0.0.1 (a coordinator's node with a member file, invited peers, a rogue node);
- lying advert, forged spot-check and share reports from one member's two identities: the
  coordinator's AdvertGate and BanList on a published schedule;
- poisoned finite gradient shares (x1e3 from one of three replicas): the real worker, handlers
  and averaging over the in-memory transport (bench/support/memory_swarm.py), trained on the
  embedded corpus; held-out loss of the honest replicas' model against an honest run;
- backward gradients x-100 from one of three replicas (its forwards and its own gradients honest):
  the same swarm with backward spot checks at rate 0.5, the coordinator's BanList reading the
  reports and re-planning without the banned peer (bench/support/byzantine_backward.py); held-out
  loss against the honest run, and for contrast the same attack with checks off (the receivers'
  size bound on returned gradients alone) and with neither;
- a poisoned state for a late joiner (a noised copy among three, a negative Adam second moment
  from the only replica): the real StateFetcher against the trained stage's state;
- oversized and slow streams: a real RPC server over hivemind P2P.

`--overhead` adds the cost of the checks against iteration time: the share checks (robust
combination, the left-out rule) side by side on the same training run (checks on / off,
alternated, --repeats times, best CPU time per iteration against best; still noise of a few %
on a loaded machine), and timed where
they run (their share of the iteration: the figure reported); plus the control plane's signature
and admission checks timed per call and multiplied by how often a peer makes them (a share of a
peer's CPU second). The in-memory swarm has no network, so its iterations are shorter than a
real swarm's and the ratio is an upper bound. overhead_pct = the worst run's share checks + the
control plane's.

`--swarm-overhead` measures the checks on the multi-process local swarm instead: a coordinator
and 4 peer processes on 127.0.0.1 (2 stages, stage 1 replicated) with spot checks (forward and
backward) at --swarm-rate and without, alternated (bench/support/byzantine_swarm.py): seconds and
peer CPU seconds per iteration, best of --repeats runs a side.

  python bench/byzantine.py [--steps 40] [--overhead] [--repeats 3]
  python bench/byzantine.py --swarm-overhead [--swarm-rate 0.1] [--repeats 1]
Last line: RESULT attacks=.. defended=.. loss_honest=.. loss_worst=.. [overhead_pct=.. side_by_side_pct=..]
       or: RESULT swarm_rate=.. swarm_wall_pct=.. swarm_cpu_pct=.. s_per_iteration_off=.. s_per_iteration_on=..
"""
import argparse
import asyncio
import math
import os
import sys
import time
from pathlib import Path

import torch

from protocol import messages as m

from peer.compute.runner import StageRunner
from peer.compute.state_transfer import flat_state
from peer.compute import tensor_codec
from peer.data import TextDataset, load_corpus
from peer.evaluate import perplexity
from peer.pipeline import averaging
from peer.pipeline.seat import StageSeat
from peer.pipeline.settings import WorkerSettings
from peer.pipeline.state_sync import StateFetcher
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for bench.support
from bench.support import byzantine_attacks as attacks  # noqa: E402
from bench.support.byzantine_attacks import Outcome  # noqa: E402
from bench.support.memory_swarm import batch_fn, build_memory_swarm, make_schedule  # noqa: E402

STAGE_OF = {"o0": 0, "o1": 0, "a1": 1, "b1": 1, "c1": 1}
PATHS = {mb: [("o0", "o1")[mb % 2], ("a1", "b1", "c1")[mb % 3]] for mb in range(6)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--overhead", action="store_true", help="also measure the checks' cost (step 4)")
    p.add_argument("--repeats", type=int, default=3, help="runs per side for --overhead and --swarm-overhead")
    p.add_argument("--swarm-overhead", action="store_true", help="only the checks' cost on the multi-process swarm")
    p.add_argument("--swarm-rate", type=float, default=0.1, help="spot-check rate for --swarm-overhead")
    p.add_argument("--swarm-iterations", type=int, default=15)
    return p.parse_args()


def spec_for(steps: int) -> m.RunSpec:
    return m.RunSpec(run="byz", model="tiny", num_stages=2, skip_ratio=0.0, seed=3, microbatch_samples=8,
                     seq_len=64, microbatches_per_origin=3, learning_rate=3e-3, warmup_steps=5, max_steps=steps)


class CheckTimer:
    """Time spent in the share checks (robust combination, left-out rule), all peers together."""

    def __init__(self):
        self.seconds = 0.0
        self.outliers, self.observe = averaging.outliers, averaging.LeftOutRule.observe

    def timing(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed

    def install(self, checks: bool) -> None:
        if checks:
            averaging.outliers = self.timing(self.outliers)
            averaging.LeftOutRule.observe = self.timing(self.observe)
        else:        # the side-by-side baseline: no robust combination, no left-out rule
            averaging.outliers = lambda shares, me, factor=averaging.OUTLIER_FACTOR: set()
            averaging.LeftOutRule.observe = lambda rule, senders, left_out: set()

    def remove(self) -> None:
        averaging.outliers, averaging.LeftOutRule.observe = self.outliers, self.observe


def train(spec: m.RunSpec, data, held_out, poison: str = "", checks: bool = True) -> dict:
    """Train the swarm; `poison`: the replica that shares 1e3 x its gradient. The held-out
    loss is the model of o0's stage 0 and a1's stage 1 (honest replicas)."""
    timer = CheckTimer()
    timer.install(checks)

    async def go():
        _, workers = await build_memory_swarm(spec, make_schedule("byz", STAGE_OF, PATHS), data, 600.0, None,
                                              "float16")
        if poison:
            seat = workers[poison].seat
            honest_compute = seat.compute

            async def poisoning(fn, *args):
                out = await honest_compute(fn, *args)
                return out * 1e3 if getattr(fn, "__name__", "") == "grad_vector" else out
            seat.compute = poisoning
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers.values())), 1200)
        return workers, time.perf_counter() - start, time.process_time() - cpu
    try:
        workers, seconds, cpu_seconds = asyncio.run(go())
    finally:
        timer.remove()
    stages = [workers["o0"].seat.runner.module.eval(), workers["a1"].seat.runner.module.eval()]
    loss = math.log(perplexity(stages, (0, 1), held_out))
    bounds = [w.spot.bound for w in workers.values()]
    return {"loss": loss, "iteration_s": seconds / spec.max_steps, "workers": workers,
            "left_out": sum(sum(b.left_out.values()) for b in bounds), "judged": sum(b.judged for b in bounds),
            "iteration_cpu_s": cpu_seconds / spec.max_steps, "checks_s": timer.seconds / spec.max_steps}


class FlatDonors:
    """rpc.call(donor, StateRequest) answered from each donor's flat state (what StateDonor sends)."""

    def __init__(self, states: dict):
        self.states = states

    async def call(self, donor, req, timeout):
        vector, steps, adam = self.states[donor]
        part = vector[req.offset:req.offset + req.max_elements]
        return m.StateReply(req.stage, req.iteration, vector.numel(), req.offset, steps, adam,
                            tensor_codec.encode(part))


def join_with(spec: m.RunSpec, states: dict) -> tuple[bool, StageRunner]:
    seat = StageSeat(lambda stage: StageRunner.from_spec(spec, stage))
    schedule = make_schedule("byz", {"me": 1, **{d: 1 for d in states}, "o0": 0}, {0: ["o0", "me"]})

    async def go():
        await seat.take(1)
        return await StateFetcher("me", "byz", FlatDonors(states), WorkerSettings(iteration_timeout_s=2.0),
                                  seat).fetch(schedule, 1, spec.max_steps)
    return asyncio.run(go()), seat.runner


def poisoned_state(spec: m.RunSpec, honest_runner: StageRunner) -> Outcome:
    good = flat_state(honest_runner)
    noised = (good[0] + 1e-2 * torch.randn(good[0].shape), *good[1:])
    ok, runner = join_with(spec, {"a": noised, "b": good, "c": (good[0].clone(), *good[1:])})
    took_honest = ok and torch.equal(runner.parameter_vector(), honest_runner.parameter_vector())
    bad = good[0].clone()
    bad[-1] = -1.0                                # a negative Adam second moment: NaN after one step
    refused, runner = join_with(spec, {"only": (bad, *good[1:])})
    safe = not refused and bool(torch.isfinite(runner.parameter_vector()).all())
    return Outcome("poisoned state for a late joiner", took_honest and safe,
                   f"noised copy outvoted: {took_honest}; negative second moment refused: {safe}")


def poisoned_shares(spec, data, held_out, honest: dict) -> tuple[Outcome, float]:
    run = train(spec, data, held_out, poison="c1")
    banned = {p: sorted(run["workers"][p].exchange.bans.banned) for p in ("a1", "b1")}
    within = run["loss"] <= honest["loss"] * 1.05
    ok = within and all(b == ["c1"] for b in banned.values())
    return Outcome("poisoned finite shares (x1e3)", ok,
                   f"held-out loss {run['loss']:.4f} vs honest {honest['loss']:.4f} "
                   f"({100 * (run['loss'] / honest['loss'] - 1):+.2f}%), c1 banned by {banned}"), run["loss"]


def poisoned_backward(spec, data, held_out, honest: dict) -> tuple[Outcome, float]:
    from bench.support.byzantine_backward import CHEATER, FACTOR, RATE, train_with_backward_cheater
    run = train_with_backward_cheater(spec, data, held_out, STAGE_OF, PATHS)
    bound_only = train_with_backward_cheater(spec, data, held_out, STAGE_OF, PATHS, checks=False)
    unopposed = train_with_backward_cheater(spec, data, held_out, STAGE_OF, PATHS, checks=False, bound=False)
    ok = (run["loss"] <= honest["loss"] * 1.05 and run["banned"] == [CHEATER] and not run["honest_reported"]
          and bound_only["loss"] <= honest["loss"] * 1.05)      # checks are off by default: the bound alone
    return Outcome(f"backward gradients x{FACTOR:g} (one of three replicas)", ok,
                   f"held-out loss {run['loss']:.4f} vs honest {honest['loss']:.4f} "
                   f"({100 * (run['loss'] / honest['loss'] - 1):+.2f}%); {CHEATER} banned {run['banned']} "
                   f"(checks at rate {RATE}: {run['backward_failed']} failed backward checks, planned out from "
                   f"iteration {run['ban_iteration']}), honest peers reported: {run['honest_reported'] or 'none'}; "
                   f"without checks (the default: the size bound alone): loss {bound_only['loss']:.4f} "
                   f"({100 * (bound_only['loss'] / honest['loss'] - 1):+.2f}%; left out {bound_only['cheater_left_out']} "
                   f"of {CHEATER}'s, {bound_only['honest_left_out']} of {bound_only['judged']} honest); with neither: "
                   f"{unopposed['loss']:.4f}"), max(run["loss"], bound_only["loss"])


def overhead(spec, data, held_out, repeats: int) -> dict:
    """Checks on / off, alternated on the same run (side by side), the time inside the checks
    (timed where they run), and the control plane's signature checks per second."""
    from bench.support.byzantine_costs import control_plane_cost_per_s
    on, off = [], []
    for _ in range(repeats):
        off.append(train(spec, data, held_out, checks=False))
        on.append(train(spec, data, held_out, checks=True))
    on_s, off_s = [r["iteration_s"] for r in on], [r["iteration_s"] for r in off]
    on_cpu, off_cpu = [r["iteration_cpu_s"] for r in on], [r["iteration_cpu_s"] for r in off]
    inside_pct = [100 * r["checks_s"] / r["iteration_s"] for r in on]
    side_pct = 100 * (min(on_cpu) / min(off_cpu) - 1)      # CPU time: what other jobs' load disturbs least
    crypto = control_plane_cost_per_s()
    crypto_pct = 100 * crypto["cpu_s_per_s"]       # the share of a peer's CPU second spent on them
    print(f"iteration of the in-memory swarm (5 peers in this process), {repeats} runs a side: wall checks on "
          f"{min(on_s):.3f}-{max(on_s):.3f}s, off {min(off_s):.3f}-{max(off_s):.3f}s; CPU on "
          f"{min(on_cpu):.3f}-{max(on_cpu):.3f}s, off {min(off_cpu):.3f}-{max(off_cpu):.3f}s: best CPU against "
          f"best {side_pct:+.2f}% (noise of a few % either way on a loaded machine)")
    print(f"time inside the share checks: {min(inside_pct):.3f}-{max(inside_pct):.3f}% of the iteration")
    print(f"control plane signature checks: {crypto['detail']}: {crypto['cpu_s_per_s'] * 1e3:.2f} ms of CPU "
          f"per second = {crypto_pct:.3f}%")
    return {"overhead_pct": max(inside_pct) + crypto_pct, "side_by_side_pct": side_pct}


def swarm_main(args) -> int:
    from bench.support.byzantine_swarm import swarm_overhead
    cost = swarm_overhead(args.swarm_rate, args.swarm_iterations, args.repeats)
    for side in ("off", "on"):
        for run in cost[side]:
            print(f"checks {side:>3} (rate {args.swarm_rate if side == 'on' else 0}): {run['s_per_iteration']:.3f}s per "
                  f"iteration (median {run['median_duration_s']:.3f}s), peer CPU {run['cpu_s_per_iteration']:.3f}s "
                  f"per iteration, spot checks passed {run['passed']} failed {run['failed']} over "
                  f"{run['iterations']} iterations; took {run['took_s']:.0f}s", flush=True)
    best = {side: min(r["s_per_iteration"] for r in cost[side]) for side in ("off", "on")}
    print(f"load now {os.getloadavg()[0]:.2f}")
    print(f"RESULT swarm_rate={args.swarm_rate} swarm_wall_pct={cost['wall_pct']:.2f} swarm_cpu_pct={cost['cpu_pct']:.2f} "
          f"s_per_iteration_off={best['off']:.4f} s_per_iteration_on={best['on']:.4f}")
    return 0


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    print(f"machine load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs", flush=True)
    if args.swarm_overhead:
        return swarm_main(args)
    spec = spec_for(args.steps)
    train_set, held = TextDataset(load_corpus()).split()
    held_out = list(held.eval_batches(samples=8, seq_len=spec.seq_len, max_batches=8))
    data = batch_fn(spec, train_set)
    t0 = time.monotonic()
    honest = train(spec, data, held_out)
    print(f"honest run: {args.steps} iterations, held-out loss {honest['loss']:.4f}, "
          f"{honest['iteration_s']:.3f}s per iteration; returned gradients left out by the size bound: "
          f"{honest['left_out']} of {honest['judged']}", flush=True)
    outcomes = attacks.control_plane_and_admission(spec)
    outcomes += [attacks.lying_advert(spec), attacks.forged_reports()]
    shares, loss_poisoned = poisoned_shares(spec, data, held_out, honest)
    backward, loss_backward = poisoned_backward(spec, data, held_out, honest)
    outcomes += [shares, backward, poisoned_state(spec, honest["workers"]["a1"].seat.runner),
                 attacks.slow_streams()]
    for o in outcomes:
        print(f"{'DEFENDED' if o.defended else 'NOT DEFENDED':>12}  {o.attack}: {o.detail}", flush=True)
    extra = ""
    if args.overhead:
        cost = overhead(spec, data, held_out, args.repeats)
        extra = f" overhead_pct={cost['overhead_pct']:.3f} side_by_side_pct={cost['side_by_side_pct']:.2f}"
    print(f"took {time.monotonic() - t0:.0f}s; load now {os.getloadavg()[0]:.2f}")
    print(f"RESULT attacks={len(outcomes)} defended={sum(o.defended for o in outcomes)} "
          f"loss_honest={honest['loss']:.4f} loss_worst={max(honest['loss'], loss_poisoned, loss_backward):.4f}{extra}")
    return 0 if all(o.defended for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
