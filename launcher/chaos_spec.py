"""`skippipe-swarm --chaos SPEC`: which local peer gets which injected fault.

SPEC: comma-separated `kill:P@iterN[:forward|backward|between]`, `stall:P@iterN[:FACTOR]`,
`lie:P@iterN[:FACTOR]` (an advert claiming a faster measured speed), `corrupt:P@iterN[:SCALE]`
(wrong activations, for spot checks), `hang:P@iterN[:SECONDS]` (forwards taken and dropped,
pings answered: for hop deadlines) or `pause:P@iterN[:SECONDS]` (SIGSTOP, then SIGCONT),
where P is the peer's index (local-P). Each peer receives its kill, stall, lie, corrupt and hang
faults as `--fault` and applies them itself (so a kill can land mid-forward or
mid-backward; see peer/chaos.py); pauses are the launcher's (launcher/pauses.py).
"""
import re

from launcher.pauses import Pause

_FAULT = re.compile(r"^(kill|stall|lie|corrupt|hang|pause):(\d+)@iter(\d+)(?::([a-z]+|\d+(?:\.\d+)?))?$")
_KILL_WHEN = ("forward", "backward", "between")


class ChaosSpecError(ValueError):
    pass


def parse_chaos(spec: str, peers: int) -> tuple[dict[int, str], list[Pause]]:
    """(peer index -> that peer's `--fault` value, the launcher's pauses)."""
    faults: dict[int, list[str]] = {}
    pauses: list[Pause] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = _FAULT.match(part)
        if match is None:
            raise ChaosSpecError(f"bad chaos fault {part!r}: expected kill:P@iterN[:forward|backward|between], "
                                 f"stall:P@iterN[:FACTOR], lie:P@iterN[:FACTOR], corrupt:P@iterN[:SCALE], "
                                 f"hang:P@iterN[:SECONDS] or pause:P@iterN[:SECONDS]")
        action, peer, iteration, arg = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
        if peer >= peers:
            raise ChaosSpecError(f"chaos fault {part!r}: there is no peer {peer} (peers are 0..{peers - 1})")
        if action == "kill" and arg is not None and arg not in _KILL_WHEN:
            raise ChaosSpecError(f"chaos fault {part!r}: a kill happens at forward, backward or between")
        if action in ("stall", "lie") and arg is not None and (not arg.replace(".", "", 1).isdigit() or float(arg) < 1):
            raise ChaosSpecError(f"chaos fault {part!r}: the {action} factor must be a number >= 1")
        if action == "corrupt" and arg is not None and (not arg.replace(".", "", 1).isdigit() or float(arg) <= 0):
            raise ChaosSpecError(f"chaos fault {part!r}: the corruption scale must be a number > 0")
        if action in ("pause", "hang") and arg is not None and (not arg.replace(".", "", 1).isdigit() or float(arg) <= 0):
            raise ChaosSpecError(f"chaos fault {part!r}: the {action} must be a number of seconds > 0")
        if action == "pause":
            pauses.append(Pause(peer, iteration, float(arg)) if arg else Pause(peer, iteration))
            continue
        faults.setdefault(peer, []).append(f"{action}@{iteration}" + (f":{arg}" if arg else ""))
    return {peer: ",".join(items) for peer, items in faults.items()}, pauses
