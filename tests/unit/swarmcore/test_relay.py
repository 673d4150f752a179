"""swarmcore/relay.py: the relay settings handed to hivemind, and the wait for a relay slot."""
import asyncio

import pytest

from swarmcore.relay import (MIN_RELAYS, RelayConfigError, relay_count_advice, relay_kwargs, visible_maddrs,
                             wait_for_circuit, watch_circuits)

RELAY = "/ip4/11.0.0.1/tcp/4000/p2p/12D3KooWSukL1J4UWniYR6yUygbZHKe8wtwnYNJ63kuyyZXSLXWJ"


def test_off_keeps_hiveminds_defaults():
    assert relay_kwargs() == {}


def test_relay_via_reserves_on_exactly_those_relays_as_a_private_node():
    kwargs = relay_kwargs((RELAY,))
    assert kwargs["use_auto_relay"] and kwargs["force_reachability"] == "private"
    assert kwargs["trusted_relays"] == [RELAY]


def test_serve_relay_forces_public_so_the_relay_service_runs():
    assert relay_kwargs(serve_relay=True) == {"use_relay": True, "force_reachability": "public"}


@pytest.mark.parametrize("bad", ["/ip4/11.0.0.1/tcp/4000", f"{RELAY}/p2p-circuit"])
def test_a_relay_without_its_peer_id_or_a_circuit_address_is_refused(bad):
    with pytest.raises(RelayConfigError, match="peer id"):
        relay_kwargs((bad,))


def test_both_at_once_is_refused():
    with pytest.raises(RelayConfigError, match="exclude"):
        relay_kwargs((RELAY,), serve_relay=True)


def test_fewer_than_four_relays_warn_of_the_boot_delay():
    assert "3 minutes" in relay_count_advice((RELAY,) * 5)   # duplicates count once
    assert relay_count_advice(tuple(f"{RELAY[:-1]}{i}" for i in range(MIN_RELAYS))) == ""
    assert relay_count_advice(()) == ""


class FakeP2P:
    def __init__(self, after_calls: int):
        self.calls, self.after = 0, after_calls

    async def get_visible_maddrs(self, latest=False):
        self.calls += 1
        circuit = [f"{RELAY}/p2p-circuit/p2p/QmMe"] if self.calls > self.after else []
        return ["/ip4/192.168.1.2/tcp/5000/p2p/QmMe", *circuit]


def test_wait_for_circuit_returns_the_circuit_addresses_once_reserved():
    p2p = FakeP2P(after_calls=2)
    found = asyncio.run(wait_for_circuit(p2p, timeout_s=5, poll_s=0.01))
    assert found == [f"{RELAY}/p2p-circuit/p2p/QmMe"] and p2p.calls == 3


def test_wait_for_circuit_gives_up_empty():
    assert asyncio.run(wait_for_circuit(FakeP2P(after_calls=10**9), timeout_s=0.05, poll_s=0.01)) == []


class EmptyAtFirst:
    """hivemind raises "No multiaddrs found" while autorelay swaps our addresses."""
    def __init__(self, failures: int):
        self.failures = failures

    async def get_visible_maddrs(self, latest=False):
        if self.failures:
            self.failures -= 1
            raise ValueError("No multiaddrs found for peer QmMe")
        return ["/ip4/192.168.1.2/tcp/5000/p2p/QmMe"]


def test_visible_maddrs_asks_again_while_the_daemon_has_none():
    assert asyncio.run(visible_maddrs(EmptyAtFirst(3), poll_s=0.01)) == ["/ip4/192.168.1.2/tcp/5000/p2p/QmMe"]
    assert asyncio.run(visible_maddrs(EmptyAtFirst(10), tries=3, poll_s=0.01)) == []


def test_the_coordinator_and_the_peer_carry_the_relay_flags_into_their_configs(monkeypatch):
    import argparse

    from coordinator.cli import add_run_arguments, config_from_args
    coordinator = argparse.ArgumentParser()
    add_run_arguments(coordinator)
    import coordinator.cli as cli
    monkeypatch.setattr(cli, "run_config_fields", lambda args: {})   # the model and run flags: not ours
    assert config_from_args(coordinator.parse_args(["--serve-relay"])).serve_relay is True
    assert config_from_args(coordinator.parse_args([])).serve_relay is False
    from peer.cli import build_parser as peer_parser
    from peer.cli import config_from_args as peer_config
    cfg = peer_config(peer_parser().parse_args(["--initial-peers", RELAY, "--relay-via", RELAY]))
    assert cfg.relay_via == (RELAY,) and not cfg.serve_relay
    with pytest.raises(SystemExit):   # one or the other
        peer_parser().parse_args(["--initial-peers", RELAY, "--relay-via", RELAY, "--serve-relay"])


class Sequence:
    """get_visible_maddrs answers from a script: a list per call, or ValueError (none found)."""
    def __init__(self, answers):
        self.answers = list(answers)

    async def get_visible_maddrs(self, latest=False):
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is None:
            raise ValueError("No multiaddrs found for peer QmMe")
        return answer


def test_watch_circuits_reports_a_lost_slot_and_a_new_one_but_not_a_moment_without_addresses():
    local = "/ip4/192.168.1.2/tcp/5000/p2p/QmMe"
    old, new = f"{RELAY}/p2p-circuit/p2p/QmMe", f"{RELAY[:-1]}Y/p2p-circuit/p2p/QmMe"
    p2p = Sequence([[local, old], [local, old], None, None, None, None, [local], [local], [local, new]])
    changes = []

    async def watch_a_while():
        task = asyncio.create_task(watch_circuits(p2p, [old], lambda m, c: changes.append((m, c)), period_s=0.001))
        while len(p2p.answers) > 1:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        task.cancel()
    asyncio.run(watch_a_while())
    assert changes == [([local], []), ([local, new], [new])]
