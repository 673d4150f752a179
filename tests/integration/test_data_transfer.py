"""Dataset files over real hivemind P2P (two P2P daemons in this process): a volunteer gets the
coordinator's bytes, refuses what does not match the manifest, and a holder serves only the
files it lists."""
import hashlib

import pytest

from protocol import messages as m
from protocol.errors import FieldError

from tokendata.transfer import DataServer, Downloader, TransferError, fetch_chunk

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def pair():
    from hivemind.p2p import P2P
    a = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    b = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=[str(x) for x in await a.get_visible_maddrs()])
    yield a, b
    await b.shutdown()
    await a.shutdown()


async def test_download_checks_hashes_and_holders_serve_only_listed_files(pair, tmp_path):
    server_p2p, client_p2p = pair
    data = bytes(range(256)) * 9000            # > 2 chunks of 1 MiB
    (tmp_path / "shard.bin").write_bytes(data)
    (tmp_path / "secret.txt").write_bytes(b"not listed")
    server = DataServer("ds1", {"shard.bin": tmp_path / "shard.bin"})
    await server.attach(server_p2p)
    holder = server_p2p.peer_id.to_base58()
    fetch = Downloader(client_p2p, "ds1", [holder], tmp_path / "copy", progress=lambda line: None, rounds=1)

    got = await fetch.fetch_file("shard.bin", hashlib.sha256(data).hexdigest(), len(data))
    assert got.read_bytes() == data and server.served_bytes == len(data)

    with pytest.raises(TransferError, match="sha256"):   # a holder that serves other bytes
        await Downloader(client_p2p, "ds1", [holder], tmp_path / "copy2", progress=lambda line: None,
                         rounds=1).fetch_file("shard.bin", "0" * 64, len(data))
    assert not list((tmp_path / "copy2").glob("*")), "a refused file was left behind"
    with pytest.raises(TransferError, match="no file"):
        await fetch_chunk(client_p2p, holder, m.DataRequest("ds1", "secret.txt"))
    with pytest.raises(TransferError, match="not ds2"):
        await fetch_chunk(client_p2p, holder, m.DataRequest("ds2", "shard.bin"))
    with pytest.raises(TransferError):                    # nobody serves at that peer id
        await Downloader(client_p2p, "ds1", [client_p2p.peer_id.to_base58()], tmp_path / "c3",
                         progress=lambda line: None, rounds=1).fetch_bytes("shard.bin", 10)


@pytest.mark.parametrize("name", ["../etc/passwd", "a/b", ".hidden", ""])
def test_a_request_names_a_plain_file_of_the_dataset(name):
    with pytest.raises(FieldError):
        m.DataRequest("ds1", name)


def test_a_request_asks_for_a_bounded_chunk():
    with pytest.raises(FieldError):
        m.DataRequest("ds1", "shard.bin", length=m.DATA_CHUNK_BYTES + 1)
    with pytest.raises(FieldError):
        m.DataRequest("ds1", "shard.bin", offset=-1)
