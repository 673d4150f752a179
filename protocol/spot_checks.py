"""Spot checks (issue 7): a sampled microbatch is recomputed on a second replica of a stage, and
the next hop reports whether the first replica's output matched. Reports are published in the
DHT under the reporter's own (signed) subkey of `skippipe/v1/<run>/spot_checks`; read by the
coordinator."""
from dataclasses import dataclass

from protocol.errors import FieldError
from protocol.messages import WorkHeader
from protocol.tensors import TensorPayload


@dataclass(frozen=True)
class SpotCheckRequest:
    """Previous hop -> a second replica of the checked stage (hop `header.hop_index`): compute
    this stage's forward of `tensor` (no stash), answered at once with ForwardReply(header) (no
    tensor); the output then goes to the next hop as a SpotCheckReference. (Not in the reply: a
    reply is one frame of at most 4 MiB, a request streams.)"""

    header: WorkHeader
    tensor: TensorPayload


@dataclass(frozen=True)
class SpotCheckReference:
    """Second replica -> next hop: its output for `header` (the header of the forward that
    `suspect` sends the next hop); the next hop compares the two and reports. The suspect sees
    no difference in its own traffic, so it cannot tell checked microbatches from others."""

    header: WorkHeader
    suspect: str
    tensor: TensorPayload


@dataclass(frozen=True)
class SpotCheckGradient:
    """v1.7 (BACKWARD_CHECKS_VERSION). Next hop -> the second replica whose SpotCheckReference it
    took: the output gradient it sends `suspect` for the checked hop (`header`: the backward
    header, hop_index = the checked hop). The second replica recomputes that hop's backward from
    the input of the SpotCheckRequest and this gradient, and sends the input gradient to the hop
    before as a SpotCheckGradientReference."""

    header: WorkHeader
    suspect: str
    tensor: TensorPayload


@dataclass(frozen=True)
class SpotCheckGradientReference:
    """v1.7. Second replica -> the previous hop of the checked hop (the one that asked for the
    check): its input gradient for `header` (the header of the backward `suspect` sends the
    previous hop: hop_index = the checked hop - 1); the previous hop compares the two and reports
    kind "backward"."""

    header: WorkHeader
    suspect: str
    tensor: TensorPayload


BACKWARD_CHECKS_VERSION = (1, 7)     # SpotCheckGradient, SpotCheckGradientReference, kind "backward"
REPORT_KINDS = ("forward", "share", "backward")


def speaks_backward_checks(version: tuple[int, int] | None) -> bool:
    """Whether a peer that spoke `version` (None: not heard from yet) takes a SpotCheckGradient."""
    return version is not None and tuple(version) >= BACKWARD_CHECKS_VERSION


@dataclass(frozen=True)
class SpotCheckReport:
    suspect: str                     # the peer whose output was checked
    checker: str                     # the peer that compared the outputs (and publishes this)
    epoch: int
    iteration: int
    microbatch_id: int
    stage: int
    relative_error: float            # ||suspect - checker|| / ||checker|| (a share: its norm over the reference)
    passed: bool
    kind: str = "forward"            # v1.5: "share": the suspect's gradient share was left out as an outlier;
    #                                  v1.7: "backward": the suspect's input gradient was checked

    def __post_init__(self):
        if self.kind not in REPORT_KINDS:
            raise FieldError("kind", f"must be one of {', '.join(REPORT_KINDS)}")
        if self.relative_error < 0:
            raise FieldError("relative_error", "must be >= 0")
        for name in ("epoch", "iteration", "microbatch_id", "stage"):
            if getattr(self, name) < 0:
                raise FieldError(name, "must be >= 0")


@dataclass(frozen=True)
class SpotCheckRecord:
    peer_id: str                     # the reporter (must own the subkey)
    reports: tuple[SpotCheckReport, ...]

    def __post_init__(self):
        if len(self.reports) > 64:
            raise FieldError("reports", "at most 64 reports per record")
