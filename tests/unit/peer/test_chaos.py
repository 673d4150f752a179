"""Fault-injection specs: peer/chaos.py (`--fault`) and launcher/chaos_spec.py (`--chaos`)."""
import pytest

from launcher.chaos_spec import ChaosSpecError, parse_chaos
from peer.chaos import Fault, FaultSpecError, make_hook, parse_faults


# ---------------------------------------------------------------------------------------------
# peer/chaos.py: parse_faults
# ---------------------------------------------------------------------------------------------
def test_parse_valid_faults():
    assert parse_faults("kill@3") == [Fault("kill", 3, when="forward")]
    assert parse_faults("kill@3:backward") == [Fault("kill", 3, when="backward")]
    assert parse_faults("kill@0:between") == [Fault("kill", 0, when="between")]
    assert parse_faults("stall@5") == [Fault("stall", 5, factor=10.0)]
    assert parse_faults("stall@5:2.5") == [Fault("stall", 5, factor=2.5)]
    assert parse_faults(" kill@1 , stall@2:3 ,") == [Fault("kill", 1), Fault("stall", 2, factor=3.0)]
    assert parse_faults("") == []


@pytest.mark.parametrize("spec, message", [
    ("kill", "expected kill@N"),
    ("kill@", "expected kill@N"),
    ("kill@x", "expected kill@N"),
    ("kill@-1", "expected kill@N"),
    ("boom@3", "expected kill@N"),
    ("kill@3:sideways", "forward, backward or between"),
    ("kill@3:forward:x", "forward, backward or between"),
    ("stall@3:fast", "must be a number"),
    ("stall@3:2:5", "must be a number"),
    ("stall@3:0.5", "must be >= 1"),
    ("kill@1,stall@x", "stall@x"),
])
def test_parse_invalid_faults(spec, message):
    with pytest.raises(FaultSpecError, match=message):
        parse_faults(spec)


def test_parse_superscript_iteration_is_a_spec_error():
    with pytest.raises(FaultSpecError):
        parse_faults("kill@\u00b3")


def test_parse_nan_stall_factor_is_refused():
    with pytest.raises(FaultSpecError):
        parse_faults("stall@3:nan")


# ---------------------------------------------------------------------------------------------
# peer/chaos.py: the hook
# ---------------------------------------------------------------------------------------------
class Recorder:
    def __init__(self):
        self.kills, self.slowdowns = 0, []

    def kill(self):
        self.kills += 1

    def set_slowdown(self, f):
        self.slowdowns.append(f)


KINDS = ["START", "ORIGIN_FORWARD", "FORWARD", "HEAD", "BACKWARD", "ORIGIN_BACKWARD"]


@pytest.mark.parametrize("when, kills_at", [
    ("forward", {"ORIGIN_FORWARD", "FORWARD"}),
    ("backward", {"BACKWARD", "ORIGIN_BACKWARD"}),
    ("between", {"START"}),
])
def test_kill_only_at_its_iteration_and_phase(when, kills_at):
    for it in range(6):
        for kind in KINDS:
            rec = Recorder()
            hook = make_hook(parse_faults(f"kill@3:{when}"), rec.set_slowdown, kill=rec.kill)
            hook(it, kind)
            # from iteration 3 on (a peer with no such task in 3 dies at its next one)
            assert rec.kills == (1 if it >= 3 and kind in kills_at else 0), (it, kind)
            assert rec.slowdowns == []


def test_kill_default_is_forward():
    rec = Recorder()
    hook = make_hook(parse_faults("kill@2"), rec.set_slowdown, kill=rec.kill)
    hook(2, "START")
    hook(2, "BACKWARD")
    assert rec.kills == 0
    hook(2, "FORWARD")
    assert rec.kills == 1


def test_stall_from_its_iteration_on():
    rec = Recorder()
    hook = make_hook(parse_faults("stall@5:4"), rec.set_slowdown, kill=rec.kill)
    for it in range(5):
        hook(it, "FORWARD")
    assert rec.slowdowns == []
    hook(5, "START")
    hook(9, "BACKWARD")
    assert rec.slowdowns == [4.0, 4.0] and rec.kills == 0


def test_stall_and_kill_together():
    rec = Recorder()
    hook = make_hook(parse_faults("stall@1:2,kill@4:backward"), rec.set_slowdown, kill=rec.kill)
    hook(0, "FORWARD")
    hook(4, "FORWARD")
    assert rec.kills == 0 and rec.slowdowns == [2.0]
    hook(4, "BACKWARD")
    assert rec.kills == 1


# ---------------------------------------------------------------------------------------------
# launcher/chaos_spec.py
# ---------------------------------------------------------------------------------------------
def test_parse_chaos_valid():
    assert parse_chaos("kill:1@iter3,stall:2@iter5", peers=3)[0] == {1: "kill@3", 2: "stall@5"}
    assert parse_chaos("kill:1@iter3:backward, stall:1@iter0:2.5", peers=2)[0] == \
        {1: "kill@3:backward,stall@0:2.5"}
    assert parse_chaos("", peers=3) == ({}, [])
    assert parse_chaos("stall:2@iter3:10,lie:2@iter3:10", peers=3)[0] == {2: "stall@3:10,lie@3:10"}
    with pytest.raises(ChaosSpecError, match="lie factor"):
        parse_chaos("lie:0@iter1:0.5", peers=2)


def test_parse_chaos_output_is_what_the_peer_parses():
    out, _ = parse_chaos("kill:0@iter2:between,stall:0@iter7:3,kill:2@iter4", peers=3)
    assert parse_faults(out[0]) == [Fault("kill", 2, when="between"), Fault("stall", 7, factor=3.0)]
    assert parse_faults(out[2]) == [Fault("kill", 4, when="forward")]
    assert 1 not in out


@pytest.mark.parametrize("spec, message", [
    ("kill:1@3", "expected kill:P@iterN"),
    ("kill@iter3", "expected kill:P@iterN"),
    ("crash:1@iter3", "expected kill:P@iterN"),
    ("kill:-1@iter3", "expected kill:P@iterN"),
    ("kill:1@iter3:", "expected kill:P@iterN"),
    ("kill:3@iter1", "no peer 3"),
    ("kill:1@iter3:sideways", "forward, backward or between"),
    ("kill:1@iter3:2", "forward, backward or between"),
    ("stall:1@iter3:fast", "number >= 1"),
    ("stall:1@iter3:0.5", "number >= 1"),
])
def test_parse_chaos_invalid(spec, message):
    with pytest.raises(ChaosSpecError, match=message):
        parse_chaos(spec, peers=3)


# ---------------------------------------------------------------------------------------------
# corrupt: wrong activations (spot checks must catch them)
# ---------------------------------------------------------------------------------------------
def test_parse_corrupt():
    assert parse_faults("corrupt@2") == [Fault("corrupt", 2, factor=0.2)]
    assert parse_faults("corrupt@0:0.5,stall@1:2") == [Fault("corrupt", 0, factor=0.5), Fault("stall", 1, factor=2.0)]
    for bad, message in [("corrupt@2:x", "must be a number"), ("corrupt@2:0", "must be > 0"),
                         ("corrupt@2:inf", "finite"), ("corrupt@x", "corrupt@N")]:
        with pytest.raises(FaultSpecError, match=message):
            parse_faults(bad)
    assert parse_chaos("corrupt:1@iter3:0.5", peers=2)[0] == {1: "corrupt@3:0.5"}
    with pytest.raises(ChaosSpecError, match="corruption scale"):
        parse_chaos("corrupt:1@iter3:0", peers=2)


def test_corrupting_runner_sends_noise_from_its_iteration_but_recomputes_honestly():
    import torch
    from peer.chaos import corrupting
    from peer.compute.runner import StageRunner
    from protocol.messages import RunSpec
    spec = RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, microbatch_samples=2, seq_len=8)
    honest = StageRunner.from_spec(spec, 1)
    make = corrupting(lambda stage: StageRunner.from_spec(spec, stage), parse_faults("corrupt@1:0.3"))
    cheat = make(1)
    x = torch.randn(2, 8, 64)
    assert torch.allclose(cheat.forward((0, 0), x), honest.forward((0, 0), x), atol=1e-6)   # before iteration 1
    wrong, right = cheat.forward((1, 0), x), honest.forward((1, 0), x)
    assert 0.15 < float((wrong - right).norm() / right.norm()) < 0.6
    assert torch.allclose(cheat.recompute(x, 0), right, atol=1e-6)       # spot-check answers stay honest
    assert cheat.stashed == 2                                            # the stash keeps the true graph
    plain = lambda stage: "runner"
    assert corrupting(plain, parse_faults("stall@1")) is plain


def test_parse_chaos_pauses_are_the_launcher_s():
    from launcher.pauses import DEFAULT_PAUSE_S, Pause
    faults, pauses = parse_chaos("pause:2@iter3:12,kill:1@iter4,pause:0@iter1", peers=3)
    assert faults == {1: "kill@4"}                       # no --fault for a pause: peers cannot resume themselves
    assert pauses == [Pause(2, 3, 12.0), Pause(0, 1, DEFAULT_PAUSE_S)]
    with pytest.raises(ChaosSpecError, match="seconds > 0"):
        parse_chaos("pause:1@iter3:0", peers=2)


def test_badgrad_scales_returned_gradients_from_its_iteration_but_recomputes_honestly():
    import torch
    from peer.chaos import corrupting
    from peer.compute.runner import StageRunner
    from protocol.messages import RunSpec
    assert parse_faults("badgrad@3") == [Fault("badgrad", 3, factor=-100.0)]
    assert parse_faults("badgrad@0:-1") == [Fault("badgrad", 0, factor=-1.0)]
    for bad, message in [("badgrad@2:1", "changes nothing"), ("badgrad@2:nan", "finite")]:
        with pytest.raises(FaultSpecError, match=message):
            parse_faults(bad)
    spec = RunSpec(run="t", model="tiny", num_stages=2, skip_ratio=0.0, microbatch_samples=2, seq_len=8)
    honest = StageRunner.from_spec(spec, 1)
    cheat = corrupting(lambda stage: StageRunner.from_spec(spec, stage), parse_faults("badgrad@1:-100"))(1)
    x, g = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    for i in (0, 1):
        assert torch.equal(cheat.forward((i, 0), x), honest.forward((i, 0), x))   # forwards stay honest
    assert torch.allclose(cheat.backward((0, 0), g), honest.backward((0, 0), g), atol=1e-6)
    right = honest.backward((1, 0), g)
    assert torch.allclose(cheat.backward((1, 0), g), -100 * right, rtol=1e-4, atol=1e-5)
    assert torch.allclose(cheat.recompute(x, 0, g), right, atol=1e-6)     # backward-check answers stay honest
    assert torch.allclose(cheat.grad_vector(), honest.grad_vector(), atol=1e-6)   # its own gradients too


def test_the_lie_fault_makes_the_advert_claim_a_faster_speed_from_its_iteration_on():
    from peer.chaos import claimed_speed
    faults = parse_faults("stall@0:8,lie@3:8")
    assert faults[1] == Fault("lie", 3, factor=8.0)
    claim = claimed_speed(faults)
    assert claim(2, 0.008) == 0.008 and claim(3, 0.008) == 0.001
    assert claimed_speed(parse_faults("stall@0"))(5, 0.008) == 0.008
    with pytest.raises(FaultSpecError, match="lie factor must be >= 1"):
        parse_faults("lie@0:0.5")


def test_a_hang_drops_forwards_only_from_its_iteration_and_for_its_seconds():
    assert parse_faults("hang@4") == [Fault("hang", 4, factor=20.0)]
    for bad, message in (("hang@4:0", "> 0 seconds"), ("hang@4:x", "must be a number")):
        with pytest.raises(FaultSpecError, match=message):
            parse_faults(bad)
    clock = [100.0]
    hook = make_hook(parse_faults("hang@4:5"), Recorder().set_slowdown, clock=lambda: clock[0])
    assert not hook(3, "FORWARD")                     # before its iteration
    assert not hook(4, "ORIGIN_FORWARD") and not hook(4, "BACKWARD") and not hook(4, "START")
    assert hook(4, "FORWARD")                         # the clock starts at the first dropped forward
    clock[0] += 4.9
    assert hook(5, "FORWARD")
    clock[0] += 0.2
    assert not hook(6, "FORWARD")                     # over: it works again


def test_chaos_hang_reaches_the_peer_as_a_fault():
    assert parse_chaos("hang:2@iter4:8", 6) == ({2: "hang@4:8"}, [])
    with pytest.raises(ChaosSpecError, match="seconds > 0"):
        parse_chaos("hang:2@iter4:0", 6)
