"""peer/pipeline/backward_checks.py alone (issue 24): who may send a gradient to recompute and a
reference gradient to compare, the previous hop compares only what it asked for, the next hop
passes on only checked hops' gradients, and the second replica recomputes with the iteration's
parameters what the checked peer's backward returns."""
import asyncio

import pytest
import torch

from protocol import messages as m
from protocol.spot_checks import SpotCheckGradient, SpotCheckGradientReference, SpotCheckRequest

from peer.compute.runner import StageRunner
from peer.pipeline import backward_checks as bc
from peer.security.spot_check_rules import SpotSampler
from tests.unit.peer.test_pipeline_spot_checks import (HEAD_ROUTE, ROUTE, SCHEDULE, SPEC, STAGE_OF, FakeWorker,
                                                       comparer, header, spot_checks)

REPLICAS = lambda stage: sorted(p for p, s in STAGE_OF.items() if s == stage)  # noqa: E731


def test_who_may_send_a_gradient_and_a_reference_gradient():
    # mb 0: o -> p (hop 1) -> z (hop 2) -> o. z sends p its gradient; q or r may recompute it
    assert bc.gradient_problem(ROUTE, 1, "z", "p", "q", 1) is None
    assert "does not send" in bc.gradient_problem(ROUTE, 1, "o", "p", "q", 1)
    assert "another replica" in bc.gradient_problem(ROUTE, 1, "z", "p", "p", 1)     # p itself
    assert "another replica" in bc.gradient_problem(ROUTE, 1, "z", "q", "r", 1)     # q is not hop 1
    assert "another replica" in bc.gradient_problem(ROUTE, 1, "z", "p", "z", 2)
    assert "middle hop" in bc.gradient_problem(ROUTE, 0, "p", "o", "q", 0)
    assert bc.gradient_problem(HEAD_ROUTE, 2, "o", "p", "q", 1) is None         # the last hop: from the head
    # p returns its input gradient to o (hop 0); only q or r may vouch for it
    assert bc.gradient_reference_problem(ROUTE, 0, "q", "p", "o", REPLICAS) is None
    assert "another replica" in bc.gradient_reference_problem(ROUTE, 0, "p", "p", "o", REPLICAS)
    assert "another replica" in bc.gradient_reference_problem(ROUTE, 0, "z", "p", "o", REPLICAS)
    assert "hop after ours" in bc.gradient_reference_problem(ROUTE, 0, "p", "q", "o", REPLICAS)
    assert "not a backward we receive" in bc.gradient_reference_problem(ROUTE, 0, "q", "p", "z", REPLICAS)
    assert "not a backward we receive" in bc.gradient_reference_problem(ROUTE, 2, "q", "p", "z", REPLICAS)
    assert bc.gradient_reference_problem(HEAD_ROUTE, 1, "q", "p", "z", REPLICAS) is None


@pytest.mark.parametrize("reference_first", [False, True])
@pytest.mark.parametrize("factor, passed", [(1.0, True), (-1.0, False)])
def test_previous_hop_compares_what_it_asked_for_in_either_order(reference_first, factor, passed):
    async def scenario():
        w, spot, _, published = comparer()
        spot.me = w.me = "o"
        spot.backward.watch(header(hop=1), "p", "q", 1)          # o asked q about p's hop 1
        right = torch.randn(2, 8, 64)
        steps = [lambda: spot.backward.saw_backward(header(hop=0), "p", factor * right, "float32"),
                 lambda: spot.backward.add_reference(header(hop=0), "p", "q", right, "float32")]
        for step in (reversed(steps) if reference_first else steps):
            step()
        await w.settle()
        return published
    (report,) = asyncio.run(scenario())[-1].reports
    assert (report.kind, report.suspect, report.checker, report.stage) == ("backward", "p", "o", 1)
    assert report.passed is passed


def test_previous_hop_ignores_what_it_did_not_ask_for():
    async def scenario():
        w, spot, _, published = comparer()
        spot.backward.watch(header(hop=1), "p", "q", 1)
        t = torch.randn(2, 8, 64)
        spot.backward.add_reference(header(hop=0), "p", "r", -t, "float32")              # r was not asked
        spot.backward.saw_backward(header(hop=0, mb=1), "p", t, "float32")             # not sampled
        spot.backward.add_reference(header(hop=0, mb=1), "p", "q", -t, "float32")
        await w.settle()
        return spot, published
    spot, published = asyncio.run(scenario())
    assert published == [] and spot.stats["unasked_reference"] == 2
    assert len(spot.backward.outputs) == len(spot.backward.references) == 0


def test_asking_for_a_forward_check_watches_its_backward():
    async def scenario():
        w = FakeWorker("o")
        spot = spot_checks(w, 1.0)
        spot.maybe_check(SCHEDULE, ROUTE, m.ForwardRequest(header(hop=1), None), "p", None)
        await asyncio.gather(*w.tasks)
        return w, spot
    w, spot = asyncio.run(scenario())
    (checker, request), = w.rpc.calls
    assert isinstance(request, SpotCheckRequest) and checker in ("q", "r")
    assert spot.backward.watching == {(0, 0, 0, 0): ("p", checker, 1)}


def test_next_hop_passes_on_only_checked_hops_gradients():
    async def scenario():
        w, spot, _, _ = comparer(rate=0.0)
        g = torch.randn(2, 8, 64)
        payload = m.BackwardRequest(header(hop=1), None)
        spot.maybe_check(SCHEDULE, ROUTE, payload, "p", "G")                           # not checked
        spot.add_reference(ROUTE, header(hop=2), "p", "q", g, "float32")               # q checked p's hop 1
        spot.maybe_check(SCHEDULE, ROUTE, payload, "p", "G")
        spot.maybe_check(SCHEDULE, ROUTE, payload, "p", "G")                           # once only
        spot.add_reference(ROUTE, header(hop=2, mb=1), "p", "r", g, "float32")
        w.rpc.versions = {"r": (1, 6)}                                                 # r is too old
        spot.maybe_check(SCHEDULE, ROUTE, m.BackwardRequest(header(hop=1, mb=1), None), "p", "G")
        await w.settle()
        return w.rpc.calls
    (checker, message), = asyncio.run(scenario())
    assert checker == "q" and isinstance(message, SpotCheckGradient)
    assert (message.suspect, message.tensor, message.header) == ("p", "G", header(hop=1))


def test_a_reference_after_the_gradient_still_gets_it_passed_on():
    """The checked peer answered before the second replica's reference came (it recomputes behind
    its own work): the gradient already sent goes to the checker when the reference comes; one
    about another suspect, or with checks off and no reference seen, gets nothing."""
    async def scenario(rate):
        w, spot, _, _ = comparer(rate=rate)
        g = torch.randn(2, 8, 64)
        spot.maybe_check(SCHEDULE, ROUTE, m.BackwardRequest(header(hop=1), None), "p", "G")
        spot.maybe_check(SCHEDULE, ROUTE, m.BackwardRequest(header(hop=1, mb=1), None), "p", "H")
        spot.add_reference(ROUTE, header(hop=2, mb=1), "x", "q", g, "float32")        # not about p
        spot.add_reference(ROUTE, header(hop=2), "p", "q", g, "float32")
        await w.settle()
        return w.rpc.calls
    (checker, message), = asyncio.run(scenario(1.0))
    assert checker == "q" and (message.suspect, message.tensor, message.header) == ("p", "G", header(hop=1))
    assert asyncio.run(scenario(0.0)) == []


def test_second_replica_recomputes_the_backward_and_sends_it_to_the_previous_hop():
    runner = StageRunner.from_spec(SPEC, 1)
    x, g = torch.randn(2, 8, 64), torch.randn(2, 8, 64)

    async def scenario():
        w = FakeWorker("q")
        spot = spot_checks(w, 0.0)
        spot.begin_iteration(0, runner)
        spot.serve(ROUTE, header(hop=1), x)                     # the forward check keeps x
        await w.settle()
        assert spot.backward.has_input(header(hop=1))
        spot.backward.serve(ROUTE, header(hop=1), g)
        spot.backward.serve(ROUTE, header(hop=1, mb=1), g)     # no input kept: nothing to do
        await w.settle()
        return w.rpc.calls, spot
    calls, spot = asyncio.run(scenario())
    (to, message), = [c for c in calls if isinstance(c[1], SpotCheckGradientReference)]
    assert to == "o" and message.suspect == "p" and message.header == header(hop=0)
    runner.forward((0, 0), x)
    expected = runner.backward((0, 0), g)
    from peer.compute import tensor_codec
    assert torch.allclose(tensor_codec.decode(message.tensor), expected, atol=1e-6)
    assert spot.serving == 0 and spot.stats["served_backward"] == 1
    assert runner.recompute(x, 0, g) is not None and runner.stashed == 0


def test_returned_gradients_of_outlying_size_are_left_out_from_the_first_one():
    bound = bc.GradientBound()
    g = torch.randn(2, 8, 64)
    bound.note(g)                                                        # the head gradient we sent
    assert not bound.admit("c", -100 * g, 2)                             # the first returned gradient already
    assert bound.admit("a", 1.1 * g, 2) and bound.admit("b", -g, 2)      # a sign flip is the checks' job
    assert bound.left_out == {"c": 1}
    for _ in range(bc.BOUND_WINDOW):                                     # a real change of scale is followed
        bound.admit("a", 30 * g, 2)
    assert bound.admit("b", 30 * g, 2) and not bound.admit("c", 3000 * g, 2)


def test_each_producer_is_bounded_by_its_own_scale():
    """Scales differ by stage (an honest stage's gradients 75x another's were once left out when
    one window held all): a stage's gradients are compared with that stage's."""
    bound = bc.GradientBound()
    small, large = 0.01 * torch.randn(4, 64), torch.randn(4, 64)
    for _ in range(bc.BOUND_MIN_SEEN):
        bound.note(small)
        assert bound.admit("s", small, 1)
    bound.admit("x", large, 3)            # a first one of another scale may be left out (ours say small)
    for _ in range(bc.BOUND_MIN_SEEN):
        bound.admit("y", large, 3)
    assert bound.admit("y", 1.5 * large, 3)         # stage 3's own scale now
    assert not bound.admit("z", large, 1)           # stage 1 is still small: 100x is left out
    assert bound.admit("s", 2 * small, 1)


def test_a_poisoning_replica_returning_half_a_stages_gradients_cannot_raise_the_bound():
    bound = bc.GradientBound()
    g = torch.randn(4, 64)
    bound.note(g)                                   # one we sent
    taken = [bound.admit(who, (100 * g if who == "c" else g), 2)
             for _ in range(4 * bc.BOUND_WINDOW) for who in ("a", "c")]
    assert all(taken[0::2]) and not any(taken[1::2])
    assert bound.left_out == {"c": 4 * bc.BOUND_WINDOW}


def test_at_the_origin_a_loss_spike_is_taken_and_a_poisoners_gain_is_not():
    """The origin divides what comes back by the head gradient it sent for that microbatch: a
    loss spike (head gradient 5x, returned 78x: a gain of 14 against the usual 1, as seen in
    tests/swarm/test_churn.py) is taken; the same chain's -100x gain is left out."""
    bound = bc.GradientBound()
    g = torch.randn(4, 64)
    chain = (1,)
    for i in range(bc.BOUND_WINDOW):
        bound.note(g, (i, 0))
        assert bound.admit("p", 1.05 * g, chain, (i, 0))
    bound.note(5 * g, (99, 0))
    assert bound.admit("p", 78 * g, chain, (99, 0))                  # 78x the usual norm, gain 15.6
    bound.note(g, (100, 0))
    assert not bound.admit("c", -100 * g, chain, (100, 0))
    assert bound.left_out == {"c": 1}
    # without the head gradient (not ours, or forgotten) the norm is what counts
    assert not bound.admit("p", 78 * g, chain)


def test_the_bound_acts_with_spot_checks_off():
    w, spot, _, _ = comparer()
    spot.sampler = SpotSampler(0.0)
    g = torch.randn(2, 8, 64)
    spot.bound.note(g)
    assert torch.equal(spot.taken_backward("p", -100 * g, ROUTE, 0, 0), torch.zeros_like(g))
    assert spot.taken_backward("q", g, ROUTE, 0, 0) is g and spot.stats["backward_left_out"] == 1


def test_a_peer_whose_backward_failed_our_check_has_its_gradients_left_out():
    async def scenario():
        w, spot, _, _ = comparer()
        g = torch.randn(2, 8, 64)
        assert spot.taken_backward("p", g, ROUTE, 0, 0) is g
        spot.backward.watch(header(hop=1), "p", "q", 1)
        spot.backward.saw_backward(header(hop=0), "p", -g, "float32")
        spot.backward.add_reference(header(hop=0), "p", "q", g, "float32")
        await w.settle()
        return spot, g
    spot, g = asyncio.run(scenario())
    assert spot.distrusted == {"p"}
    assert torch.equal(spot.taken_backward("p", g, ROUTE, 0, 0), torch.zeros_like(g))
    assert spot.taken_backward("q", g, ROUTE, 0, 0) is g
    assert spot.stats["backward_left_out"] == 1
