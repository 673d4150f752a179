"""peer/relay_slots.py: a change in our relay slots is logged and goes into our advert."""
import logging

from peer.relay_slots import slots_changed

LOCAL = "/ip4/192.168.1.2/tcp/5000/p2p/QmMe"
CIRCUIT = "/ip4/11.0.0.1/tcp/4000/p2p/12D3KooWSukL1J4UWniYR6yUygbZHKe8wtwnYNJ63kuyyZXSLXWJ/p2p-circuit/p2p/QmMe"


class Announcer:
    def __init__(self):
        self.updates = []

    def update(self, **changes):
        self.updates.append(changes)


def test_a_new_slot_is_announced_and_losing_every_slot_is_a_warning(caplog):
    announcer = Announcer()
    with caplog.at_level(logging.INFO, logger="skippipe.peer"):
        slots_changed(announcer, [LOCAL, CIRCUIT], [CIRCUIT])
        slots_changed(announcer, [LOCAL], [])
    assert announcer.updates == [{"maddrs": (LOCAL, CIRCUIT)}, {"maddrs": (LOCAL,)}]
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records] == [
        (logging.INFO, "relay slots changed"), (logging.WARNING, "lost every relay slot (the relays left or died)")]
