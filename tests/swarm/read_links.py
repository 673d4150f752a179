"""Print the run's published link measurements as JSON (run inside a test's namespace):
python -m tests.swarm.read_links RUN MADDR... -> {reporter: {peer: bandwidth_bytes_s}}."""
import asyncio
import json
import sys

from hivemind import DHT
from opsweb.dht_process import safe_for_large_calls

from coordinator.dht_io import CoordinatorRecords
from swarmcore.dht.validators import record_validators


def main(run: str, maddrs: list[str]) -> int:
    dht = safe_for_large_calls(DHT(start=True, initial_peers=maddrs, client_mode=True,
                                   record_validators=record_validators(run)[1]))
    try:
        links = asyncio.run(CoordinatorRecords(dht, run).get_links())
    finally:
        dht.shutdown()
    print(json.dumps({r: {m.peer_id: m.bandwidth_bytes_s for m in rep.links} for r, rep in links.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
