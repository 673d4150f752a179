"""A DHT call larger than the command socket's buffer must not kill hivemind's DHT child
(opsweb/dht_process.py says why it did)."""
from hivemind import DHT
from hivemind.utils import get_dht_time

from opsweb.dht_process import safe_for_large_calls
from opsweb.stopping import shutdown_dht


def test_large_stores_leave_the_dht_child_alive_and_in_step():
    dht = safe_for_large_calls(DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], shutdown_timeout=1.5))
    try:
        for size in (1_000, 400_000, 2_000_000, 50):
            assert dht.store(f"k{size}", b"x" * size, get_dht_time() + 60, return_future=True).result(timeout=20)
        assert dht.is_alive()
        found = dht.get("k50", latest=True, return_future=True).result(timeout=20)
        assert found is not None and found.value == b"x" * 50     # later calls still line up
    finally:
        shutdown_dht(dht)
