"""Every DHT read and write of the run's records visits the nodes nearest the key, not
hivemind's default of 20 (in a smaller swarm: every node, each answering with the key's whole
dictionary). A write lands on hivemind's num_replicas nearest, so a read's beam must reach them."""
import asyncio
import inspect

from hivemind.dht.node import DHTNode

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
        self.calls.append(("store", kwargs))
        return self._done(True)

    def get(self, key, latest=False, return_future=False, **kwargs):
        self.calls.append(("get", dict(kwargs, latest=latest)))
        return self._done(None)


def test_reads_and_writes_visit_the_nodes_a_write_lands_on_not_the_whole_swarm():
    hivemind_replicas = inspect.signature(DHTNode.create).parameters["num_replicas"].default
    hivemind_beam = inspect.signature(DHTNode.create).parameters["bucket_size"].default
    assert hivemind_replicas <= DHT_BEAM < hivemind_beam
    dht = RecordingDHT()
    records = RunRecords(dht, "run-1")

    async def exercise():
        await records._store("skippipe/key", PeerAdvert("p", PeerState.ONLINE, "cpu", 0, 1e-3), ttl_s=10.0, subkey=b"s")
        assert await records.get_adverts() == {}
    asyncio.run(exercise())
    assert [op for op, _ in dht.calls] == ["store", "get"]
    assert all(kwargs["beam_size"] == DHT_BEAM for _, kwargs in dht.calls)
    assert dht.calls[1][1]["latest"]   # dictionaries merge across every node the read visits
