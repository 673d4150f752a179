"""Backward spot checks (issue 24): the backward of a sampled hop is recomputed by the second
replica that recomputed its forward, and compared where the checked peer's input gradient lands.

    W --ForwardRequest(x)-->  P  --ForwardRequest-->  Z          (training traffic, unchanged)
    W <--BackwardRequest(gx)-- P <--BackwardRequest(g)-- Z
    W --SpotCheckRequest(x)--> P' --SpotCheckReference--> Z      (the forward check, spot_checks.py)
    Z --SpotCheckGradient(g, suspect=P)--> P' --SpotCheckGradientReference(gx')--> W

W sampled the hop (its secret rule: P cannot tell checked microbatches from others) and knows
which P' it asked; P' keeps the input x it was given; Z learns of the check from P''s forward
reference and, when it sends P the output gradient g (or when the reference comes, if that is
later), sends P' the same values (what P decodes, when the wire quantises them). P' runs the
stage's forward and backward from x and g with that iteration's parameters (nothing stashed, no
parameter gradient kept) and sends the input gradient to W, which compares it with the gx P
sent (spot_check_rules.compare_outputs, with the quantisation allowance when gx came
quantised) and reports kind "backward" about P. A report
counts at the coordinator only from W: the receiver of the checked hop's backward
(swarmcore/schedule_history.backward_check_receivers).

Best effort like the forward check: bounded waits and queues, failures logged at debug level,
nothing raised into the worker. A check is lost when P' has stepped past the iteration before g
comes (the iteration's last backwards, sometimes).
"""
import collections
import dataclasses
import logging
import statistics
from typing import Callable

import torch

from protocol.messages import BackwardRequest, WorkHeader
from protocol.schedule import Route
from protocol.spot_checks import SpotCheckGradient, SpotCheckGradientReference, speaks_backward_checks
from protocol.tensors import TensorPayload

from peer.compute import tensor_codec
from peer.pipeline import plan_view as pv
from peer.pipeline.check_halves import Half, Key, Pending, key_of

logger = logging.getLogger(__name__)
MAX_INPUTS = 8             # P': inputs kept for a gradient that may follow (each one activation)
MAX_KEYS = 64              # W's and Z's notes of which hops are checked
MAX_SENT = 8               # Z: gradients sent before the forward's reference came, kept for it
BOUND_FACTOR = 20.0        # a returned gradient more than this x the typical one is left out
BOUND_WINDOW = 16          # the typical one: from the last this many of a producer (few: honest
#                            norms fall 10x in the first iterations)
BOUND_MIN_SEEN = 4         # a kind's own window is used from this many on
MAX_HEADS = 256            # head gradient norms kept for the gain of their microbatch


def gradient_problem(route: Route, hop: int, remote: str, suspect: str, me: str,
                     my_stage: int | None) -> str | None:
    """Why a SpotCheckGradient for `hop` from `remote` is not ours to recompute (None: it is):
    we must be another replica of that hop's stage, and `remote` the hop that sends it its gradient."""
    if not 1 <= hop < len(route.hops):
        return f"hop {hop} of microbatch {route.microbatch_id} is not a checked middle hop"
    checked = route.hops[hop]
    if checked.stage != my_stage or checked.peer == me or suspect != checked.peer:
        return f"hop {hop} is stage {checked.stage} on {checked.peer[:12]}; we are another replica of stage {my_stage}"
    if remote != pv.next_hop(route, hop):
        return f"{remote[:12]} does not send hop {hop} its gradient"
    return None


def gradient_reference_problem(route: Route, hop: int, remote: str, suspect: str, me: str,
                               replicas: Callable[[int], list[str]]) -> str | None:
    """Why a SpotCheckGradientReference for the backward we get at `hop` is refused (None:
    accepted): only another replica of the next hop's stage, about that hop."""
    checked = hop + 1
    if not 1 <= checked < len(route.hops) or route.hops[hop].peer != me:
        return f"hop {hop} of microbatch {route.microbatch_id} is not a backward we receive from a checked hop"
    stage = route.hops[checked].stage
    if suspect != route.hops[checked].peer:
        return f"{suspect[:12]} is not the hop after ours"
    if remote == suspect or remote not in replicas(stage):
        return f"{remote[:12]} is not another replica of stage {stage}"
    return None


class GradientBound:
    """Returned gradients of outlying size are left out, as outlying gradient shares are
    (robust_shares.py): a backward gradient more than BOUND_FACTOR x the typical one of its kind
    is taken as zero and logged, with spot checks on or off. This bounds a poisoner before any
    check samples it (a large gradient would also inflate Adam's second moments for hundreds of
    steps); a gradient of ordinary size but wrong (a sign flip) is left to the checks.

    What is compared, per kind (scales differ by stage: one window for all once left out an
    honest stage's gradients, norm 1.02 against a typical 0.0135, and split its replicas):
    - at the origin, the gradient back from the route's first hop is divided by the norm of the
      head gradient we sent that microbatch: the gain of the hops after stage 0, per chain of
      their stages. A loss spike raises both (that 1.02 came back for a head gradient 5x the
      usual: a gain of 14 against the usual 1), a poisoner's factor shows in full;
    - elsewhere, the norm itself, per producer (the stage whose input gradient it is, or the
      origin's "head"): we cannot see what our next hop was given.
    The typical one is the lower quartile of the last BOUND_WINDOW of its kind (so a poisoning
    replica that returns fewer than three quarters of them cannot raise it); until
    BOUND_MIN_SEEN came, the norm is compared with the median of the gradients we sent upstream
    ourselves (trusted: the scale from the first microbatch on). Every value joins its window,
    so a real change of scale is followed once it holds for three quarters of it."""

    def __init__(self, factor: float = BOUND_FACTOR, window: int = BOUND_WINDOW, min_seen: int = BOUND_MIN_SEEN):
        self.factor, self.window, self.min_seen = factor, window, min_seen
        self.sent: collections.deque[float] = collections.deque(maxlen=window)
        self.heads: collections.OrderedDict[object, float] = collections.OrderedDict()   # (i, mb) -> norm
        self.seen: dict[object, collections.deque[float]] = {}
        self.left_out: collections.Counter[str] = collections.Counter()
        self.judged = 0                  # returned gradients seen, taken or not

    def note(self, grad: torch.Tensor, head_of: object = None) -> None:
        """A gradient we send upstream (ours: trusted); `head_of`: the (iteration, microbatch)
        whose head gradient it is."""
        norm = float(torch.linalg.vector_norm(grad.float()))
        self.sent.append(norm)
        if head_of is not None:
            self.heads[head_of] = norm
            self.heads.move_to_end(head_of)
            while len(self.heads) > MAX_HEADS:
                self.heads.popitem(last=False)

    def admit(self, sender: str, grad: torch.Tensor, producer: object = None, head_of: object = None) -> bool:
        """Whether `sender`'s gradient is taken: produced by `producer` (a stage, "head", or at
        the origin the chain of stages after stage 0, with `head_of` naming the microbatch)."""
        norm = float(torch.linalg.vector_norm(grad.float()))
        self.judged += 1
        head = self.heads.get(head_of) if head_of is not None else None
        kind, value = (("gain", producer), norm / max(head, 1e-30)) if head else (producer, norm)
        seen = self.seen.setdefault(kind, collections.deque(maxlen=self.window))
        own = len(seen) >= self.min_seen          # else the norm against what we sent
        typical = sorted(seen)[len(seen) // 4] if own else (statistics.median(self.sent) if self.sent else None)
        measured = value if own else norm
        seen.append(value)
        if typical is None or measured <= self.factor * max(typical, 1e-30):
            return True
        self.left_out[sender] += 1
        if self.left_out[sender] == 1 or self.left_out[sender] % 100 == 0:
            what = "gain" if own and head else "norm"
            logger.warning("a backward gradient from %s (stages %s) of %s %.3g (typical %.3g) is left out (%d so far)",
                           sender[:12], producer, what, measured, typical, self.left_out[sender])
        return False


class BackwardChecks:
    """The backward part of SpotChecks (`spot`: its rpc, compute thread, clock, parameters,
    comparisons and reports): W's watch, P''s recomputation and Z's forwarding of gradients."""

    def __init__(self, spot):
        self.spot = spot
        self.inputs = Pending(cap=MAX_INPUTS, clock=spot.clock)     # P': x by the checked hop's key
        self.outputs, self.references = Pending(clock=spot.clock), Pending(clock=spot.clock)   # W's halves
        self.watching: collections.OrderedDict[Key, tuple[str, str, int]] = collections.OrderedDict()
        self.wanted: collections.OrderedDict[Key, str] = collections.OrderedDict()   # Z: key -> P'
        # Z: the reference of a checked forward may come after we sent the hop its gradient (P'
        # recomputes behind its own work; P answered first): keep the last few gradients for it
        self.sent: collections.OrderedDict[Key, SpotCheckGradient] = collections.OrderedDict()

    def drop_before(self, iteration: int) -> None:
        for pending in (self.inputs, self.outputs, self.references):
            pending.drop_before(iteration)
        for notes in (self.watching, self.wanted, self.sent):
            for key in [k for k in notes if k[0] < iteration]:
                del notes[key]

    @staticmethod
    def _note(notes: collections.OrderedDict, key: Key, value, cap: int = MAX_KEYS) -> None:
        notes[key] = value
        while len(notes) > cap:
            notes.popitem(last=False)

    # ---- W: the checked hop's backward comes back to us ----

    def watch(self, forward: WorkHeader, suspect: str, checker: str, stage: int) -> None:
        """W asked `checker` to recompute `suspect`'s forward at forward.hop_index: compare the
        backward `suspect` sends us for it (hop_index - 1) with `checker`'s."""
        self._note(self.watching, key_of(forward, forward.hop_index - 1), (suspect, checker, stage))

    def saw_backward(self, header: WorkHeader, sender: str, tensor: torch.Tensor, dtype: str,
                     block: int = 0, offsets: bool = False, channels: bool = False) -> None:
        key = key_of(header)
        watched = self.watching.get(key)
        if watched is None or watched[0] != sender:
            return
        half = Half(sender, tensor, dtype, self.spot.clock(), stage=watched[2], block=block, offsets=offsets,
                    channels=channels)
        reference = self.references.pop(key)
        if reference is None:
            self.outputs.put(key, half)
        else:
            self._compare(key, header, half, reference)

    def add_reference(self, header: WorkHeader, suspect: str, checker: str, tensor: torch.Tensor,
                      dtype: str) -> None:
        """W: a validated reference; taken only from the replica we asked, about whom we asked."""
        key = key_of(header)
        watched = self.watching.get(key)
        if watched is None or watched[:2] != (suspect, checker):
            self.spot.stats["unasked_reference"] += 1
            return
        half = Half(checker, tensor, dtype, self.spot.clock(), suspect=suspect, stage=watched[2])
        output = self.outputs.pop(key)
        if output is None:
            self.references.put(key, half)
        else:
            self._compare(key, header, output, half)

    def _compare(self, key: Key, header: WorkHeader, output, reference) -> None:
        self.watching.pop(key, None)
        self.spot.spawn(self.spot.compare_and_report(header, output, reference, "backward"))

    # ---- P': keep the input, recompute the backward when the gradient comes ----

    def keep_input(self, forward: WorkHeader, tensor: torch.Tensor) -> None:
        self.inputs.put(key_of(forward), Half("", tensor, "float32", self.spot.clock()))

    def has_input(self, header: WorkHeader) -> bool:
        return key_of(header) in self.inputs

    def serve(self, route: Route, header: WorkHeader, grad: torch.Tensor) -> None:
        """P' (a validated gradient for a hop whose input we kept): recompute, send it to W."""
        kept = self.inputs.pop(key_of(header))
        if kept is None:
            return
        self.spot.serving += 1
        self.spot.spawn(self._recompute_and_send(route, header, kept.tensor, grad))

    async def _recompute_and_send(self, route: Route, header: WorkHeader, x: torch.Tensor,
                                  grad: torch.Tensor) -> None:
        hop, mb, spot = header.hop_index, header.microbatch_id, self.spot
        try:
            params = await spot.params_for(header.iteration, route.hops[hop].stage)
            out = None if params is None else await spot.compute(params[0].recompute, x, params[1], grad)
            if out is None:
                spot.stats["stale"] += 1
                logger.debug("backward check of microbatch %d: iteration %d's parameters are gone",
                             mb, header.iteration)
                return
            reference = SpotCheckGradientReference(dataclasses.replace(header, hop_index=hop - 1),
                                                   route.hops[hop].peer, tensor_codec.encode(out))
            await spot.rpc.call(route.hops[hop - 1].peer, reference, spot.rpc_timeout_s)
            spot.stats["served_backward"] += 1
        except Exception as exc:
            logger.debug("backward check of microbatch %d: recomputing hop %d failed: %s", mb, hop, exc)
        finally:
            spot.serving -= 1

    # ---- Z: pass the gradient of a checked hop to the replica that checked its forward ----

    def took_reference(self, header: WorkHeader, suspect: str, checker: str) -> None:
        """Z: `checker` sent a (validated) reference for `suspect`'s forward at hop header.hop_index - 1."""
        key = key_of(header, header.hop_index - 1)
        sent = self.sent.pop(key, None)
        if sent is not None and sent.suspect == suspect:
            self._send(checker, sent)              # its gradient went out already: it follows now
        else:
            self._note(self.wanted, key, checker)

    def gradient_sent(self, request: BackwardRequest, suspect: str, payload: TensorPayload) -> None:
        """Z sends `suspect` this backward; `payload`: the floats it decodes."""
        key = key_of(request.header)
        message = SpotCheckGradient(request.header, suspect, payload)
        checker = self.wanted.pop(key, None)
        if checker is not None:
            self._send(checker, message)
        elif self.spot.listening():                # a reference may still come
            self._note(self.sent, key, message, MAX_SENT)

    def _send(self, checker: str, message: SpotCheckGradient) -> None:
        version = getattr(self.spot.rpc, "versions", {}).get(checker)
        if version is not None and not speaks_backward_checks(version):
            return                  # an older replica: it would not know the message
        self.spot.spawn(self._send_gradient(checker, message))

    async def _send_gradient(self, checker: str, message: SpotCheckGradient) -> None:
        try:
            await self.spot.rpc.call(checker, message, self.spot.rpc_timeout_s)
            self.spot.stats["gradients_sent"] += 1
        except Exception as exc:
            logger.debug("backward check of microbatch %d: %s did not take the gradient: %s",
                         message.header.microbatch_id, checker[:12], exc)
