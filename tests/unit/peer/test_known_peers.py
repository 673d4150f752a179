"""The peers a peer remembers in its cache folder for its next start (peer/discovery/known_peers.py)."""
import json

from peer.discovery import known_peers


def test_one_address_per_other_peer_routable_ones_first_and_bounded(tmp_path):
    maddrs = ["/ip4/127.0.0.1/tcp/1/p2p/QmA", "/ip4/192.168.1.5/tcp/1/p2p/QmA", "/ip4/127.0.0.1/tcp/2/p2p/QmMe",
              "/ip4/127.0.0.1/tcp/3", *[f"/ip4/127.0.0.1/tcp/{10 + i}/p2p/QmP{i}" for i in range(20)]]
    assert known_peers.save(tmp_path, "run", maddrs, me="QmMe")
    saved = known_peers.load(tmp_path, "run")
    assert saved[0] == "/ip4/192.168.1.5/tcp/1/p2p/QmA"          # not QmA's loopback address too
    assert len(saved) == known_peers.KEEP and not any("QmMe" in a for a in saved)
    assert all("/p2p/" in a for a in saved)
    assert known_peers.load(tmp_path, "other-run") == []


def test_a_damaged_or_foreign_file_is_ignored(tmp_path):
    path = known_peers.path_for(tmp_path, "run")
    for text in ("not json", json.dumps({"a": 1}), json.dumps([1, "relative/p2p/x", "/ip4/1.2.3.4/tcp/1/p2p/QmOk"]),
                 "[" + " " * known_peers.MAX_FILE_BYTES + "]"):
        path.write_text(text)
        assert known_peers.load(tmp_path, "run") in ([], ["/ip4/1.2.3.4/tcp/1/p2p/QmOk"])
    assert not known_peers.save(tmp_path, "run", ["/ip4/127.0.0.1/tcp/2/p2p/QmMe"], me="QmMe")
