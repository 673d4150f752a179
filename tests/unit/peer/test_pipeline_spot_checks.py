"""peer/pipeline/spot_checks.py alone: who may ask and answer, matching at the next hop in
either order, bounded waiting, the parameters a recomputation uses, and publishing."""
import asyncio

import pytest
import torch

from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.spot_checks import SpotCheckReference, SpotCheckRequest

from peer.compute import tensor_codec
from peer.compute.runner import StageRunner
from peer.pipeline import plan_view as pv
from peer.pipeline import spot_checks as sc
from peer.pipeline.worker import WorkerSettings
from peer.routing.health import Health
from peer.transport.rpc import RemoteError
from bench.support.memory_swarm import make_schedule

SPEC = m.RunSpec(run="t", model="tiny", num_stages=3, skip_ratio=0.0, microbatch_samples=2, seq_len=8)
STAGE_OF = {"o": 0, "p": 1, "q": 1, "r": 1, "z": 2}
SCHEDULE = make_schedule("t", STAGE_OF, {0: ["o", "p", "z"], 1: ["o", "z", "p"]})
ROUTE, HEAD_ROUTE = SCHEDULE.routes


def header(mb=0, hop=1, iteration=0, attempt=0):
    return m.WorkHeader("t", SCHEDULE.epoch, iteration, mb, hop, attempt)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeRpc:
    def __init__(self, busy: int = 0):
        self.calls, self.busy = [], busy      # busy: answer OVERLOADED that many times first

    async def call(self, peer, message, timeout):
        self.calls.append((peer, message))
        if self.busy:
            self.busy -= 1
            raise RemoteError(peer, m.ErrorReply(ErrorCode.OVERLOADED, "busy"))
        return m.ForwardReply(message.header)


def spot_checks(w, rate, **kw):
    """SpotChecks on the fake's parts: identity, rpc, health, the compute thread, background tasks."""
    return sc.SpotChecks(w.me, w.rpc, w.health, w.compute, w.spawn, rate, w.settings.rpc_timeout_s, **kw)


class FakeWorker:
    def __init__(self, me):
        self.me, self.health, self.rpc, self.settings = me, Health(), FakeRpc(), WorkerSettings()
        self.tasks = []

    def spawn(self, coro):
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    async def compute(self, fn, *args):
        return fn(*args)

    async def settle(self):
        while not all(t.done() for t in self.tasks):
            await asyncio.gather(*self.tasks)


def test_who_may_ask_for_and_send_a_reference():
    # hop 1 of mb 0 is p (stage 1): its previous hop o may ask q or r, not p itself
    assert sc.request_problem(ROUTE, 1, "o", "q", 1) is None
    assert "previous hop" in sc.request_problem(ROUTE, 1, "z", "q", 1)
    assert "another replica" in sc.request_problem(ROUTE, 1, "o", "p", 1)
    assert "another replica" in sc.request_problem(ROUTE, 1, "o", "z", 2)
    assert "middle hop" in sc.request_problem(ROUTE, 0, "o", "q", 0)       # the origin is not checked
    assert "middle hop" in sc.request_problem(ROUTE, 3, "z", "q", 1)        # hop n is the head
    replicas = lambda stage: sorted(p for p, s in STAGE_OF.items() if s == stage)
    # z receives p's output at hop 2; only q or r may vouch for what p should have sent
    assert sc.reference_problem(ROUTE, 2, "q", "p", "z", replicas) is None
    assert "another replica" in sc.reference_problem(ROUTE, 2, "p", "p", "z", replicas)
    assert "another replica" in sc.reference_problem(ROUTE, 2, "o", "p", "z", replicas)
    assert "hop before ours" in sc.reference_problem(ROUTE, 2, "p", "q", "z", replicas)
    assert "not a forward we receive" in sc.reference_problem(ROUTE, 2, "q", "p", "o", replicas)
    assert "not a forward we receive" in sc.reference_problem(ROUTE, 1, "q", "o", "p", replicas)
    # the last hop's output goes to the origin's head (hop n)
    assert sc.reference_problem(HEAD_ROUTE, 3, "q", "p", "o", replicas) is None
    assert pv.next_hop(HEAD_ROUTE, 2) == "o" and pv.next_hop(ROUTE, 1) == "z"


def test_pending_is_bounded_in_number_and_age():
    clock = Clock()
    pending = sc.Pending(cap=2, ttl_s=10.0, clock=clock)
    half = lambda: sc.Half("p", torch.zeros(1), "float32", clock())
    for i in range(3):
        pending.put((0, i, 2, 0), half())
    assert len(pending) == 2 and pending.pop((0, 0, 2, 0)) is None      # the oldest went
    clock.now += 11
    assert pending.pop((0, 1, 2, 0)) is None and len(pending) == 0      # expired
    pending.put((0, 5, 2, 0), half())
    pending.put((1, 5, 2, 0), half())
    pending.drop_before(1)
    assert pending.pop((0, 5, 2, 0)) is None and pending.pop((1, 5, 2, 0)) is not None


def test_tolerance_is_looser_for_16_bit_values():
    assert sc.tolerance("float32", "float32") == sc.DEFAULT_RTOL
    assert sc.tolerance("float32", "bfloat16") == sc.HALF_RTOL > 10 * sc.DEFAULT_RTOL


def comparer(rate=1.0):
    clock = Clock()
    w = FakeWorker("z")
    spot = spot_checks(w, rate, clock=clock)
    published = []

    async def publish(record):
        published.append(record)
    spot.publish = publish
    return w, spot, clock, published


@pytest.mark.parametrize("reference_first", [False, True])
@pytest.mark.parametrize("noise, passed", [(0.0, True), (0.2, False)])
def test_next_hop_compares_in_either_order_and_publishes(reference_first, noise, passed):
    async def scenario():
        w, spot, _, published = comparer()
        ref = torch.randn(2, 8, 64)
        sent = ref + noise * ref.std() * torch.randn_like(ref)
        steps = [lambda: spot.saw_forward(SCHEDULE, ROUTE, header(hop=2), "p", sent, "float32"),
                 lambda: spot.add_reference(ROUTE, header(hop=2), "p", "q", ref, "float32")]
        for step in (reversed(steps) if reference_first else steps):
            step()
        await w.settle()
        return spot, published
    spot, published = asyncio.run(scenario())
    (report,) = published[-1].reports
    assert published[-1].peer_id == "z" and report.checker == "z" and report.suspect == "p"
    assert report.passed is passed and report.stage == 1 and (report.iteration, report.microbatch_id) == (0, 0)
    assert spot.stats["passed" if passed else "failed"] == 1
    assert len(spot.outputs) == len(spot.references) == 0


def test_mismatched_or_late_halves_make_no_report():
    async def scenario():
        w, spot, clock, published = comparer()
        t = torch.randn(2, 8, 64)
        spot.add_reference(ROUTE, header(hop=2), "p", "q", t, "float32")
        spot.saw_forward(SCHEDULE, ROUTE, header(hop=2, attempt=1), "p", t, "float32")   # another attempt
        spot.saw_forward(SCHEDULE, ROUTE, header(hop=2, mb=1), "x", t, "float32")        # another microbatch
        clock.now += sc.PENDING_TTL_S + 1
        spot.saw_forward(SCHEDULE, ROUTE, header(hop=2), "p", t, "float32")              # too late
        await w.settle()
        return published
    assert asyncio.run(scenario()) == []


def test_without_own_rate_outputs_are_kept_only_once_references_arrive():
    async def scenario():
        w, spot, clock, published = comparer(rate=0.0)
        t = torch.randn(2, 8, 64)
        spot.saw_forward(SCHEDULE, ROUTE, header(hop=2), "p", t, "float32")
        assert len(spot.outputs) == 0                     # nobody checks here: keep nothing
        spot.add_reference(ROUTE, header(hop=2), "p", "q", t, "float32")
        spot.saw_forward(SCHEDULE, ROUTE, header(hop=2, mb=1), "p", t, "float32")
        assert len(spot.outputs) == 1                     # references came: listen for a while
        clock.now += sc.LISTEN_S + 1
        spot.saw_forward(SCHEDULE, ROUTE, header(hop=2, iteration=1), "p", t, "float32")
        assert len(spot.outputs) == 1
        await w.settle()
        return published
    assert asyncio.run(scenario()) == []


def test_the_previous_hop_asks_another_live_replica_of_sampled_forwards():
    async def scenario():
        w = FakeWorker("o")
        spot = spot_checks(w, 1.0)
        payload = tensor_codec.encode(torch.randn(2, 8, 64))
        forward = m.ForwardRequest(header(), payload)
        w.health.set_departed({"r"})
        spot.maybe_check(SCHEDULE, ROUTE, forward, "p")
        spot.maybe_check(SCHEDULE, ROUTE, m.BackwardRequest(header(), payload), "p")   # backwards: never
        await w.settle()
        assert [(peer, type(msg)) for peer, msg in w.rpc.calls] == [("q", SpotCheckRequest)]
        assert w.rpc.calls[0][1].tensor is payload and w.rpc.calls[0][1].header == forward.header
        w.health.set_departed({"q", "r"})
        spot.maybe_check(SCHEDULE, ROUTE, forward, "p")                                 # no one left to ask
        off = spot_checks(w, 0.0)
        off.maybe_check(SCHEDULE, ROUTE, forward, "p")
        await w.settle()
        return w, spot
    w, spot = asyncio.run(scenario())
    assert len(w.rpc.calls) == 1 and spot.stats["not_asked"] == 1


def test_a_busy_second_replica_is_asked_again_briefly():
    async def scenario(busy):
        w = FakeWorker("o")
        w.rpc = FakeRpc(busy=busy)
        spot = spot_checks(w, 1.0)
        spot.maybe_check(SCHEDULE, ROUTE, m.ForwardRequest(header(), tensor_codec.encode(torch.zeros(2, 8, 64))), "p")
        await w.settle()
        return len(w.rpc.calls), spot.stats["asked"]
    assert asyncio.run(scenario(2)) == (3, 1)
    calls, asked = asyncio.run(scenario(100))            # gives up within ASK_RETRY_S
    assert asked == 0 and 2 < calls < 10


def test_recompute_uses_the_iterations_parameters_and_stashes_nothing():
    runner = StageRunner.from_spec(SPEC, 1)
    x = torch.randn(2, 8, 64)
    again = runner.recompute(x, runner.step_count)
    assert runner.stashed == 0
    assert torch.allclose(again, runner.forward((0, 0), x), atol=1e-6)
    runner.backward((0, 0), torch.ones_like(x))
    runner.step()
    assert runner.recompute(x, 0) is None                 # the optimizer moved on
    assert not torch.allclose(runner.recompute(x, 1), again)


def test_the_second_replica_waits_for_the_iteration_then_sends_the_reference_on():
    async def scenario():
        w = FakeWorker("q")
        spot = spot_checks(w, 0.0)
        runner = StageRunner.from_spec(SPEC, 1)
        spot.begin_iteration(0, runner)
        x = torch.randn(2, 8, 64)
        assert spot.admit(header(iteration=1)) is None
        spot.serve(ROUTE, header(iteration=1), x)                   # one iteration ahead of us
        assert spot.admit(header(iteration=1)) == ErrorCode.DUPLICATE
        for attempt in range(1, sc.MAX_SERVING):
            spot.serve(ROUTE, header(iteration=1, attempt=attempt), x)
        assert spot.admit(header(mb=1, iteration=1)) == ErrorCode.OVERLOADED
        await asyncio.sleep(0.05)
        assert w.rpc.calls == []                                    # still waiting for iteration 1
        spot.begin_iteration(1, runner)
        await w.settle()
        spot.serve(ROUTE, header(mb=3, iteration=0), x)             # iteration 0 is over here
        await w.settle()
        return w, spot, runner, x
    w, spot, runner, x = asyncio.run(scenario())
    assert [peer for peer, _ in w.rpc.calls] == ["z"] * sc.MAX_SERVING and spot.stats["stale"] == 1
    peer, ref = w.rpc.calls[0]
    assert isinstance(ref, SpotCheckReference) and ref.suspect == "p" and ref.header == header(hop=2, iteration=1)
    assert torch.allclose(tensor_codec.decode(ref.tensor), runner.recompute(x, runner.step_count))
    assert runner.stashed == 0


def test_reports_are_published_coalesced_and_bounded():
    async def scenario():
        w, spot, _, published = comparer()
        spot.passes_every_s = 0.0
        for i in range(sc.REPORTS_KEPT + 6):
            t = torch.randn(2, 8, 64)
            spot.saw_forward(SCHEDULE, ROUTE, header(hop=2, mb=0, attempt=i), "p", t, "float32")
            spot.add_reference(ROUTE, header(hop=2, mb=0, attempt=i), "p", "q", t, "float32")
        await w.settle()
        return published
    published = asyncio.run(scenario())
    assert len(published) < sc.REPORTS_KEPT + 6                   # not one DHT write per report
    assert len(published[-1].reports) == sc.REPORTS_KEPT
    assert published[-1].reports[-1].passed


def test_passes_are_published_at_most_every_interval_and_failures_at_once():
    async def scenario():
        w, spot, clock, published = comparer()
        spot.passes_every_s = 0.3
        t = torch.randn(2, 8, 64)
        for i in range(3):                                            # passes: one write now, one later
            spot.saw_forward(SCHEDULE, ROUTE, header(hop=2, attempt=i), "p", t, "float32")
            spot.add_reference(ROUTE, header(hop=2, attempt=i), "p", "q", t, "float32")
            await asyncio.sleep(0.01)
        assert len(published) == 1
        spot.passes_every_s = 60.0
        spot.saw_forward(SCHEDULE, ROUTE, header(hop=2, attempt=9), "p", -t, "float32")
        spot.add_reference(ROUTE, header(hop=2, attempt=9), "p", "q", t, "float32")
        await asyncio.wait_for(w.settle(), 5)                         # a failure does not wait 60 s
        return published
    published = asyncio.run(scenario())
    assert len(published) == 2 and not published[-1].reports[-1].passed
    assert len(published[-1].reports) == 4
