"""DHT writes, and reads of single-writer records, visit the nodes nearest the key, not
hivemind's default of 20 (in a smaller swarm: every node, each answering with the key's whole
dictionary); reads that merge every peer's record keep hivemind's wide beam."""
import asyncio
import inspect

from hivemind.dht.node import DHTNode

from protocol import ids
from protocol.adverts import PeerAdvert, PeerState
from swarmcore.dht.records import DHT_BEAM, RunRecords


class RecordingDHT:
    def __init__(self):
        self.calls = []

    def _done(self, value):
        future = asyncio.get_running_loop().create_future()
        future.set_result(value)
        return future

    def store(self, key, value, expiration_time, subkey=None, return_future=False, **kwargs):
        self.calls.append(("store", key, kwargs))
        return self._done(True)

    def get(self, key, latest=False, return_future=False, **kwargs):
        self.calls.append(("get", key, dict(kwargs, latest=latest)))
        return self._done(None)


def test_writes_and_single_writer_reads_visit_the_nodes_a_write_lands_on_and_merged_reads_stay_wide():
    hivemind = inspect.signature(DHTNode.create).parameters
    assert hivemind["num_replicas"].default <= DHT_BEAM < hivemind["bucket_size"].default
    dht = RecordingDHT()
    records = RunRecords(dht, "run-1")
    advert = PeerAdvert("p", PeerState.ONLINE, "cpu", 0, 1e-3)

    async def exercise():
        await records._store(ids.peers_key("run-1"), advert, ttl_s=10.0, subkey=b"s")
        assert await records._get(ids.schedule_key("run-1")) is None
        assert await records.get_adverts() == {}
    asyncio.run(exercise())
    (store, _, stored), (get, _, single), (merged_get, key, merged) = dht.calls
    assert (store, get, merged_get) == ("store", "get", "get") and key == ids.peers_key("run-1")
    assert stored["beam_size"] == DHT_BEAM and single["beam_size"] == DHT_BEAM
    assert "beam_size" not in merged                   # hivemind's default: every node within 20
    assert single["latest"] and merged["latest"]       # dictionaries merge across the nodes visited
