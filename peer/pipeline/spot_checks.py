"""Spot checks in the pipeline (issue 7): a sampled forward is recomputed on a second replica of
its stage and compared where the checked peer's output lands.

    W --ForwardRequest-->   P  --ForwardRequest-->  Z     (the training traffic, unchanged)
    W --SpotCheckRequest--> P' --SpotCheckReference(suspect=P)--> Z

W (the previous hop) samples with its secret SpotSampler and asks P' (another replica of P's
stage, in this schedule) to recompute P's forward from the very bytes P got. P' computes it with
the parameters of that iteration, stashes nothing, and sends the output to Z (the hop after P,
or the origin) itself rather than back to W: a reply is one frame of at most 4 MiB, a request
streams, so only a request carries a realistic activation. Z matches P's ForwardRequest with the
reference (either may come first), compares them (compare_outputs) and publishes a
SpotCheckReport in its own DHT record; the coordinator bans on failures (coordinator/swarm_view.py).

Best effort: nothing here blocks training or raises into the worker. Every wait is bounded; the
halves waiting at Z for their partner are capped in number and age; failures are logged at
debug level. Limits (docs/security.md): replicas must hold the same parameters (they do
after every averaged step), and with two replicas a disagreement names the peer whose forward
was checked, so a replica lying only in its spot-check answers makes its honest twin look bad.
"""
import asyncio
import collections
import dataclasses
import logging
import math
import secrets
import time
from typing import Any, Awaitable, Callable

import torch

from protocol.errors import ErrorCode
from protocol.messages import BackwardRequest, ForwardRequest, WorkHeader
from protocol.schedule import Route, Schedule
from protocol.quantised import CODECS
from protocol.tensors import TensorPayload
from protocol.spot_checks import SpotCheckRecord, SpotCheckReference, SpotCheckReport, SpotCheckRequest

from peer.compute import tensor_codec
from peer.pipeline import plan_view as pv
from peer.pipeline.backward_checks import BackwardChecks, GradientBound
from peer.pipeline.check_halves import MAX_PENDING, PENDING_TTL_S, Half, Key, Pending, key_of  # noqa: F401
from peer.routing.health import Health
from peer.transport.rpc import RemoteError
from peer.security.spot_check_rules import DEFAULT_RTOL, SpotSampler, compare_outputs, report

logger = logging.getLogger(__name__)
HALF_RTOL = 3e-2           # a 16-bit wire or compute dtype rounds each value to ~2**-8
MAX_ASKING = 4             # our requests to second replicas in flight
MAX_SERVING = 4            # recomputations for others at once (each is one stage forward)
ASK_RETRY_S = 3.0          # how long we retry a second replica that answers OVERLOADED
PARAMS_WAIT_S = 10.0       # how long a second replica waits to reach the checked iteration
LISTEN_S = 600.0           # without our own rate, keep outputs only while references arrive
PUBLISH_TIMEOUT_S = 15.0
PUBLISH_RETRIES = 3
PASSES_EVERY_S = 10.0      # passes alone are published at most this often (a failure at once): each
#                            DHT write is signed, sent and validated at every replica of the key
REPORTS_KEPT = 64          # SpotCheckRecord's bound

def tolerance(*dtypes: str) -> float:
    return DEFAULT_RTOL if all(d == "float32" for d in dtypes) else HALF_RTOL


def request_problem(route: Route, hop: int, remote: str, me: str, my_stage: int | None) -> str | None:
    """Why a SpotCheckRequest for `hop` of `route` from `remote` is not ours to answer (None: it is)."""
    if not 1 <= hop < len(route.hops):
        return f"hop {hop} of microbatch {route.microbatch_id} is not a checked middle hop"
    checked = route.hops[hop]
    if checked.stage != my_stage or checked.peer == me:
        return f"hop {hop} is stage {checked.stage} on {checked.peer[:12]}; we are another replica of stage {my_stage}"
    if remote != route.hops[hop - 1].peer:
        return f"{remote[:12]} is not the previous hop of hop {hop}"
    return None


def reference_problem(route: Route, hop: int, remote: str, suspect: str, me: str,
                      replicas: Callable[[int], list[str]]) -> str | None:
    """Why a SpotCheckReference for our forward at `hop` is refused (None: accepted). Only another
    replica of the checked stage may send one, and only about the hop that feeds us."""
    n = len(route.hops)
    if not 2 <= hop <= n or pv.next_hop(route, hop - 1) != me:
        return f"hop {hop} of microbatch {route.microbatch_id} is not a forward we receive after a checked hop"
    checked = route.hops[hop - 1]
    if suspect != checked.peer:
        return f"{suspect[:12]} is not the hop before ours"
    if remote == suspect or remote not in replicas(checked.stage):
        return f"{remote[:12]} is not another replica of stage {checked.stage}"
    return None


class SpotChecks:
    """The worker's spot-check roles: sampler and asker (W), recomputer (P'), comparer (Z)."""

    def __init__(self, me: str, rpc, health: Health, compute: Callable[..., Awaitable[Any]],
                 spawn: Callable[[Awaitable], Any], rate: float = 0.0, rpc_timeout_s: float = 30.0,
                 publish: Callable[[SpotCheckRecord], Awaitable[Any]] | None = None,
                 secret: bytes | None = None, clock: Callable[[], float] = time.monotonic):
        self.me, self.rpc, self.health, self.rpc_timeout_s = me, rpc, health, rpc_timeout_s
        self.compute, self.spawn = compute, spawn     # the seat's compute thread, the worker's background
        self.sampler = SpotSampler(rate, secret)
        self.clock = clock
        self.outputs, self.references = Pending(clock=clock), Pending(clock=clock)
        self.reports: collections.deque[SpotCheckReport] = collections.deque(maxlen=REPORTS_KEPT)
        self.publish = publish                  # our reports into the DHT (None: kept here only)
        self.stats: collections.Counter[str] = collections.Counter()
        self._params: tuple[int, Any, int] | None = None    # (iteration, runner, its step count)
        self._params_changed = asyncio.Event()
        self._asking = self.serving = 0
        self._served: set[Key] = set()
        self._reference_at = -math.inf
        self._publishing = self._dirty = False
        self.passes_every_s, self._published_at = PASSES_EVERY_S, -math.inf
        self._failure = asyncio.Event()           # a failed report waits for no interval
        self.backward = BackwardChecks(self)      # the same hops' backwards (backward_checks.py)
        self.distrusted: set[str] = set()         # peers whose backward failed our check: left out
        self.bound = GradientBound()              # returned gradients of outlying size: left out

    # ---- the worker's hooks ----

    def begin_iteration(self, iteration: int, runner) -> None:
        """Iteration `iteration` computes with `runner`'s parameters as they are now."""
        self._params = (iteration, runner, runner.step_count)
        self._params_changed.set()
        self._params_changed = asyncio.Event()
        for pending in (self.outputs, self.references):
            pending.drop_before(iteration)
        self.backward.drop_before(iteration)
        self._served = {k for k in self._served if k[0] >= iteration}

    def maybe_check(self, schedule: Schedule, route: Route, request, suspect: str,
                    payload: TensorPayload | None = None) -> None:
        """W: `request` goes to `suspect`; if it is a forward to a middle hop, and sampled, ask
        another replica of that hop's stage to recompute it from `payload` (floats: what the
        suspect decodes, when the request is quantised; default: the request's own tensor).
        A backward to a hop whose forward another replica checked goes to that replica too."""
        header = request.header
        if isinstance(request, BackwardRequest):
            self.backward.gradient_sent(request, suspect, request.tensor if payload is None else payload)
            return
        if (self.sampler.rate <= 0 or not isinstance(request, ForwardRequest)
                or not 1 <= header.hop_index < len(route.hops)):
            return
        stage = route.hops[header.hop_index].stage
        if not self.sampler.should_check(header.epoch, header.iteration, header.microbatch_id, stage):
            return
        h = self.health
        others = [p for p in pv.replicas(schedule, stage)
                  if p not in (suspect, self.me) and p not in h.departed and not h.suspect(p)]
        if not others or self._asking >= MAX_ASKING:
            self.stats["not_asked"] += 1
            return
        self._asking += 1
        payload = request.tensor if payload is None else payload
        checker = secrets.choice(others)
        self.backward.watch(header, suspect, checker, stage)
        self.spawn(self._ask(checker, SpotCheckRequest(header, payload)))

    async def _ask(self, checker: str, request: SpotCheckRequest) -> None:
        delay, deadline = 0.1, self.clock() + ASK_RETRY_S
        try:
            while True:
                try:
                    await self.rpc.call(checker, request, self.rpc_timeout_s)
                    self.stats["asked"] += 1
                    return
                except RemoteError as exc:   # busy with other checks, or a schedule behind: soon again
                    if exc.code not in (ErrorCode.OVERLOADED, ErrorCode.STALE_SCHEDULE) or \
                            self.clock() + delay > deadline:
                        raise
                await asyncio.sleep(delay)
                delay *= 2
        except Exception as exc:
            logger.debug("spot check of microbatch %d: %s did not take it: %s",
                         request.header.microbatch_id, checker[:12], exc)
        finally:
            self._asking -= 1

    # ---- P': recompute for another replica ----

    def admit(self, header: WorkHeader) -> ErrorCode | None:
        if key_of(header) in self._served:
            return ErrorCode.DUPLICATE
        if self.serving >= MAX_SERVING:
            return ErrorCode.OVERLOADED
        return None

    def serve(self, route: Route, header: WorkHeader, tensor: torch.Tensor) -> None:
        """P' (a validated, admitted request): recompute in the background, send it to Z."""
        self._served.add(key_of(header))
        self.backward.keep_input(header, tensor)
        self.serving += 1
        self.spawn(self._recompute_and_send(route, header, tensor))

    async def _recompute_and_send(self, route: Route, header: WorkHeader, tensor: torch.Tensor) -> None:
        hop, mb = header.hop_index, header.microbatch_id
        try:
            params = await self.params_for(header.iteration, route.hops[hop].stage)
            out = None if params is None else await self.compute(params[0].recompute, tensor, params[1])
            if out is None:
                self.stats["stale"] += 1
                logger.debug("spot check of microbatch %d: iteration %d's parameters are gone", mb, header.iteration)
                return
            reference = SpotCheckReference(dataclasses.replace(header, hop_index=hop + 1), route.hops[hop].peer,
                                           tensor_codec.encode(out))
            await self.rpc.call(pv.next_hop(route, hop), reference, self.rpc_timeout_s)
            self.stats["served"] += 1
        except Exception as exc:
            logger.debug("spot check of microbatch %d: recomputing for hop %d failed: %s", mb, hop, exc)
        finally:
            self.serving -= 1

    async def params_for(self, iteration: int, stage: int) -> tuple[Any, int] | None:
        """(runner, step count) of `iteration`, waiting (bounded) if we are still before it."""
        deadline = self.clock() + PARAMS_WAIT_S
        while True:
            p = self._params
            if p is not None and p[0] == iteration:
                return (p[1], p[2]) if p[1].module.stage == stage else None
            left = deadline - self.clock()
            if (p is not None and p[0] > iteration) or left <= 0:
                return None
            try:
                await asyncio.wait_for(self._params_changed.wait(), left)
            except TimeoutError:
                return None

    # ---- Z: match the suspect's output with the reference ----

    def saw_forward(self, schedule: Schedule, route: Route, header: WorkHeader, sender: str,
                    tensor: torch.Tensor, dtype: str, block: int = 0, offsets: bool = False,
                    channels: bool = False) -> None:
        """Z: `sender` handed us this forward; keep it a while if a reference may follow
        (`dtype` int8/int4: it came quantised, `block` elements to a scale, in min/max blocks
        if `offsets`, along channels if `channels`)."""
        hop = header.hop_index
        if hop < 2 or not self.listening():
            return
        stage = route.hops[hop - 1].stage
        if len(pv.replicas(schedule, stage)) < 2:
            return                      # nobody could recompute it
        key = key_of(header)
        reference = self.references.pop(key)
        half = Half(sender, tensor, dtype, self.clock(), stage=stage, block=block, offsets=offsets,
                    channels=channels)
        if reference is None:
            self.outputs.put(key, half)
        elif reference.suspect == sender:
            self._compare(header, half, reference)

    def add_reference(self, route: Route, header: WorkHeader, suspect: str, checker: str,
                      tensor: torch.Tensor, dtype: str) -> None:
        """Z: a validated reference from another replica of the hop before ours."""
        self._reference_at = self.clock()
        stage = route.hops[header.hop_index - 1].stage
        half = Half(checker, tensor, dtype, self.clock(), suspect=suspect, stage=stage)
        key = key_of(header)
        self.backward.took_reference(header, suspect, checker)
        output = self.outputs.pop(key)
        if output is None:
            self.references.put(key, half)
        elif output.peer == suspect:
            self._compare(header, output, half)

    def listening(self) -> bool:
        return self.sampler.rate > 0 or self.clock() - self._reference_at < LISTEN_S

    def _compare(self, header: WorkHeader, output: Half, reference: Half) -> None:
        self.spawn(self.compare_and_report(header, output, reference))

    async def compare_and_report(self, header: WorkHeader, output: Half, reference: Half,
                                 kind: str = "forward") -> None:
        """Compare the suspect's `output` with the `reference`; publish the report (`kind`:
        "forward", or "backward": input gradients, backward_checks.py)."""
        try:
            codec = output.dtype if output.dtype in CODECS else None
            rtol = tolerance(*(d for d in (output.dtype, reference.dtype) if d not in CODECS))
            # a quantised output may differ from the reference by half a step of its block (a
            # whole one for backward gradients: rounded stochastically) before it counts
            # (spot_check_rules.compare_outputs); beyond that, the float tolerance
            comparison = await asyncio.to_thread(compare_outputs, output.tensor, reference.tensor, rtol,
                                                 codec, output.block, 1.0 if kind == "backward" else 0.5,
                                                 output.offsets, output.channels)
            r = report(comparison, output.peer, self.me, header.epoch, header.iteration,
                       header.microbatch_id, output.stage, kind)
        except Exception as exc:
            logger.debug("spot check of microbatch %d: comparison failed: %s", header.microbatch_id, exc)
            return
        self.stats["passed" if r.passed else "failed"] += 1
        self._distrust(r, kind)
        if r.passed:
            logger.debug("%s spot check passed: %s, stage %d, microbatch %d (relative error %.2g)",
                         kind, r.suspect[:12], r.stage, r.microbatch_id, r.relative_error)
        else:
            what = "output" if kind == "forward" else "input gradient"
            logger.warning("spot check FAILED: %s's stage-%d %s for iteration %d microbatch %d is off by %.3g "
                           "(relative to replica %s; tolerance %g)", r.suspect, r.stage, what, r.iteration,
                           r.microbatch_id, r.relative_error, reference.peer[:12], rtol)
        self.add_report(r)

    def _distrust(self, r: SpotCheckReport, kind: str) -> None:
        if kind == "backward" and not r.passed and r.suspect not in self.distrusted:
            self.distrusted.add(r.suspect)
            logger.warning("the gradients %s returns are left out from now on (a failed backward check); "
                           "its microbatches still count", r.suspect)

    def taken_backward(self, sender: str, grad: torch.Tensor, route: Route, hop: int, iteration: int) -> torch.Tensor:
        """The backward gradient `sender` returned to our `hop` of `route`, as we use it: zero
        when its backwards failed our check or it is of outlying size (GradientBound), so a
        poisoner harms only until it is caught."""
        if hop == 0:       # ours as the origin: its gain over the head gradient we sent
            producer, head_of = tuple(h.stage for h in route.hops[1:]), (iteration, route.microbatch_id)
        else:
            producer, head_of = pv.gradient_producer(route, hop), None
        if sender in self.distrusted or not self.bound.admit(sender, grad, producer, head_of):
            self.stats["backward_left_out"] += 1
            return torch.zeros_like(grad)
        return grad

    def add_report(self, r: SpotCheckReport) -> None:
        """Publish `r` with our other reports (also a left-out gradient share's, from averaging)."""
        self.reports.append(r)
        self._dirty = True
        if not r.passed:
            self._failure.set()
        if self.publish is not None and not self._publishing:
            self._publishing = True
            self.spawn(self._publish_reports())

    async def _publish_reports(self) -> None:
        """Our latest reports, one DHT write at a time (reports made meanwhile go in the next)."""
        failures = 0
        try:
            while self._dirty:
                wait = self._published_at + self.passes_every_s - self.clock()
                if wait > 0 and not self._failure.is_set():
                    try:
                        await asyncio.wait_for(self._failure.wait(), wait)
                    except TimeoutError:
                        pass
                self._dirty = False
                self._failure.clear()
                self._published_at = self.clock()
                record = SpotCheckRecord(self.me, tuple(self.reports))
                try:
                    await asyncio.wait_for(self.publish(record), PUBLISH_TIMEOUT_S)
                    failures = 0
                except Exception as exc:
                    logger.debug("publishing spot-check reports failed: %s", exc)
                    failures += 1
                    if failures <= PUBLISH_RETRIES:  # a failed check must reach the coordinator
                        self._dirty = True
                        await asyncio.sleep(2.0)
        finally:
            self._publishing = False
