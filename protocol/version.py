"""Protocol version and the compatibility rule.

Peers with the same major version interoperate; a minor bump only adds optional fields,
which older peers drop when decoding.
"""
import re
from pathlib import Path

from protocol.errors import VersionMismatch

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 12         # 5: invitations (PeerAdvert.invite_claim, Roster); 6: quantised tensors;
                            # 7: PeerAdvert.measured_fwd_s_per_layer_sample, ProgressRecord.written_at,
                            #    backward spot checks (protocol/spot_checks.py BACKWARD_CHECKS_VERSION);
                            # 8: RunSpec.gradient_exchange, StateReply.pending (delayed updates);
                            # 9: IterationReport.timed_microbatches/round_trip_s (witnessed speed);
                            # 10: PeerAdvert.late_peers (hop deadlines); 11: Quantised.offsets;
                            # 12: Quantised.channels
PROTOCOL_VERSION = (PROTOCOL_MAJOR, PROTOCOL_MINOR)
PACKAGE_VERSION = "0.1.0"    # kept equal to pyproject.toml's by a unit test
DISTRIBUTION = "skippipe-swarm"


def package_version() -> str:
    """The installed distribution's version (what `--version` prints on all three scripts);
    from a source tree that is not installed, pyproject.toml's."""
    from importlib import metadata
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
        return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
    except (OSError, AttributeError):
        return PACKAGE_VERSION


def check_compatible(remote: tuple[int, int]) -> None:
    """Raise VersionMismatch unless `remote` shares our major version."""
    major, minor = remote
    if major != PROTOCOL_MAJOR:
        raise VersionMismatch(
            f"protocol version mismatch: remote speaks v{major}.{minor}, we speak "
            f"v{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}; upgrade the older side (pip install -U skippipe-swarm)",
            remote=(major, minor),
        )
