"""Protocol version and the compatibility rule.

Peers with the same major version interoperate; a minor bump only adds optional fields,
which older peers drop when decoding.
"""
from protocol.errors import VersionMismatch

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 3
PROTOCOL_VERSION = (PROTOCOL_MAJOR, PROTOCOL_MINOR)
PACKAGE_VERSION = "0.1.0"


def check_compatible(remote: tuple[int, int]) -> None:
    """Raise VersionMismatch unless `remote` shares our major version."""
    major, minor = remote
    if major != PROTOCOL_MAJOR:
        raise VersionMismatch(
            f"protocol version mismatch: remote speaks v{major}.{minor}, we speak "
            f"v{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}; upgrade the older side (pip install -U skippipe-swarm)",
            remote=(major, minor),
        )
