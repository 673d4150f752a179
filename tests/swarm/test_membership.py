"""Join, announce, expire and leave over a real DHT (the coordinator's stage assignment to auto
peers: tests/swarm/test_shared_swarm.py)."""
import asyncio
import os
import signal

import pytest

from protocol.adverts import PeerState
from bench.support.harness import coordinator, peers, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_adverts_online_offline_and_expiry(tmp_path):
    async def scenario():
        async with coordinator(min_peers=99) as app:  # never plans: we only watch adverts
            with peers(app, tmp_path, 2, "--announce-period", "1") as procs:
                adverts = await wait_for(lambda: _online(app, 2), 90, "two ONLINE adverts")
                assert len(adverts) == 2
                assert all(a.num_layers == 6 and a.fwd_s_per_layer_sample > 0 for a in adverts.values())
                procs[0].send_signal(signal.SIGTERM)                      # graceful: OFFLINE first
                await wait_for(lambda: _has_state(app, PeerState.OFFLINE), 20, "an OFFLINE advert")
                os.killpg(procs[1].pid, signal.SIGKILL)                   # no goodbye: must expire
                await wait_for(lambda: _online(app, 0, exact=True), 10, "the killed peer's advert to expire")
    asyncio.run(scenario())


async def _online(app, n, exact=False):
    adverts = {p: a for p, a in (await app.records.get_adverts()).items() if a.state == PeerState.ONLINE}
    ok = len(adverts) == n if exact else len(adverts) >= n
    return (adverts or True) if ok else None


async def _has_state(app, state):
    return any(a.state == state for a in (await app.records.get_adverts()).values())

