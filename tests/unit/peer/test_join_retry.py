"""Joining through --initial-peers is tried a few times before the peer gives up with a clear error."""
import pytest

import peer.app as app
from peer.discovery import known_peers
from peer.startup_errors import StartupError


class Guard:
    def __init__(self, duplicate=False):
        self.duplicate = duplicate

    def dht_kwargs(self):
        return {}

    def is_duplicate(self, exc):
        return self.duplicate

    def duplicate_message(self):
        return "identity already in use"


class Config:
    initial_peers = ("/ip4/127.0.0.1/tcp/1/p2p/QmX",)
    host_maddrs = ("/ip4/127.0.0.1/tcp/0",)
    announce_maddrs = ()
    run = "r"
    relay_via = ()
    serve_relay = False

    def __init__(self, cache_dir="/nonexistent"):
        self.cache_dir = cache_dir


@pytest.fixture
def joins(monkeypatch):
    calls, sleeps, failures = [], [], []
    monkeypatch.setattr(app.time, "sleep", sleeps.append)
    monkeypatch.setattr(app, "safe_for_large_calls", lambda dht: dht)

    def dht(**kwargs):
        calls.append(kwargs)
        if len(calls) <= failures[0]:
            raise RuntimeError("Daemon failed to start: failed to connect to bootstrap peers\nmore")
        return "dht"
    monkeypatch.setattr(app, "DHT", dht)
    return calls, sleeps, failures


def test_a_failed_join_is_tried_again_after_a_pause(joins):
    calls, sleeps, failures = joins
    failures.append(2)
    assert app.start_dht(Config(), Guard()) == "dht"
    assert len(calls) == 3 and sleeps == [app.JOIN_RETRY_S, 2 * app.JOIN_RETRY_S]


def test_retries_also_try_the_peers_remembered_from_earlier_runs(joins, tmp_path):
    calls, sleeps, failures = joins
    failures.append(1)
    known_peers.save(tmp_path, "r", ["/ip4/10.0.0.2/tcp/5/p2p/QmA", "/ip4/127.0.0.1/tcp/6/p2p/QmB"], me="QmMe")
    app.start_dht(Config(tmp_path), Guard())
    assert calls[0]["initial_peers"] == list(Config.initial_peers)     # first as configured
    assert calls[1]["initial_peers"] == [*Config.initial_peers, "/ip4/10.0.0.2/tcp/5/p2p/QmA",
                                         "/ip4/127.0.0.1/tcp/6/p2p/QmB"]


def test_a_join_that_keeps_failing_ends_in_one_clear_error(joins):
    calls, sleeps, failures = joins
    failures.append(99)
    with pytest.raises(StartupError, match=r"(?s)could not join the swarm through .* \(3 attempts\).*reachable"):
        app.start_dht(Config(), Guard())
    assert len(calls) == app.JOIN_ATTEMPTS


def test_an_identity_in_use_is_not_tried_again(joins):
    calls, sleeps, failures = joins
    failures.append(99)
    with pytest.raises(StartupError, match="already in use"):
        app.start_dht(Config(), Guard(duplicate=True))
    assert len(calls) == 1 and sleeps == []
