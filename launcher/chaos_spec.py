"""`skippipe-swarm --chaos SPEC`: which local peer gets which injected fault.

SPEC: comma-separated `kill:P@iterN[:forward|backward|between]`, `stall:P@iterN[:FACTOR]` or
`corrupt:P@iterN[:SCALE]` (wrong activations, for spot checks), where P is the peer's index (local-P). Each peer receives its faults as `--fault`, and applies
them itself (so a kill can land mid-forward or mid-backward; see peer/chaos.py).
"""
import re

_FAULT = re.compile(r"^(kill|stall|corrupt):(\d+)@iter(\d+)(?::([a-z]+|\d+(?:\.\d+)?))?$")
_KILL_WHEN = ("forward", "backward", "between")


class ChaosSpecError(ValueError):
    pass


def parse_chaos(spec: str, peers: int) -> dict[int, str]:
    """Peer index -> that peer's `--fault` value."""
    faults: dict[int, list[str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = _FAULT.match(part)
        if match is None:
            raise ChaosSpecError(f"bad chaos fault {part!r}: expected kill:P@iterN[:forward|backward|between], "
                                 f"stall:P@iterN[:FACTOR] or corrupt:P@iterN[:SCALE]")
        action, peer, iteration, arg = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
        if peer >= peers:
            raise ChaosSpecError(f"chaos fault {part!r}: there is no peer {peer} (peers are 0..{peers - 1})")
        if action == "kill" and arg is not None and arg not in _KILL_WHEN:
            raise ChaosSpecError(f"chaos fault {part!r}: a kill happens at forward, backward or between")
        if action == "stall" and arg is not None and (not arg.replace(".", "", 1).isdigit() or float(arg) < 1):
            raise ChaosSpecError(f"chaos fault {part!r}: the stall factor must be a number >= 1")
        if action == "corrupt" and arg is not None and (not arg.replace(".", "", 1).isdigit() or float(arg) <= 0):
            raise ChaosSpecError(f"chaos fault {part!r}: the corruption scale must be a number > 0")
        faults.setdefault(peer, []).append(f"{action}@{iteration}" + (f":{arg}" if arg else ""))
    return {peer: ",".join(items) for peer, items in faults.items()}
