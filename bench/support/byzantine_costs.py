"""What the signed control plane and the admission rules cost a peer per second (bench/byzantine.py
--overhead): each check timed on realistic records, times how often a peer of an N-peer private
run makes it (its DHT polls: the schedule and spec every second, the roster and the adverts every
announce period; its DHT node validates every member's records as they are stored)."""
import pickle
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.crypto import RSAPrivateKey

from protocol import codec, ids
from protocol.adverts import PeerAdvert, PeerState
from protocol.invitations import Roster, issue, make_claim
from protocol.owner import peer_id_of_subkey
from protocol.signing import public_key_text, sign, verify
from swarmcore.dht.admission import AdmissionRules
from swarmcore.dht.validators import MemberValidator

from bench.support.memory_swarm import make_schedule

RUN = "cost"


def timed(fn, repeats: int = 50, rounds: int = 5) -> float:
    """Seconds per call: the best of `rounds` (a loaded machine only ever adds time)."""
    fn()                                         # warm (caches, imports)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def control_plane_cost_per_s(peers: int = 8, poll_s: float = 1.0, announce_s: float = 1.5) -> dict:
    organiser = Ed25519PrivateKey.generate()
    key = public_key_text(organiser)
    stage_of = {f"p{i}": i % 4 for i in range(peers)}
    paths = {mb: [f"p{mb % 2 * 4}", f"p{1 + mb % 2 * 4}", f"p{2 + mb % 2 * 4}", f"p{3 + mb % 2 * 4}"] for mb in range(16)}
    schedule = sign("schedule", codec.encode(make_schedule(RUN, stage_of, paths)), organiser)
    roster = sign("roster", codec.encode(Roster(RUN, 1, tuple((f"{i:016x}", f"p{i}") for i in range(peers)))),
                  organiser)
    rules = AdmissionRules(RUN, organiser_key=key, roster=None)
    signers = [RSASignatureValidator(RSAPrivateKey()) for _ in range(peers)]
    adverts = []
    for signer in signers:
        invitation, _ = issue(organiser, RUN)
        peer = peer_id_of_subkey(signer.local_public_key)
        adverts.append((signer, PeerAdvert(peer, PeerState.ONLINE, "cpu", 1, 0.01,
                                           invite_claim=make_claim(invitation, RUN, peer))))
    rules.members = frozenset(a.peer_id for _, a in adverts)
    validator = MemberValidator(rules)
    records = [DHTRecord(DHTID.generate(source=ids.peers_key(RUN)).to_bytes(),
                         DHTProtocol.serializer.dumps(s.local_public_key),
                         DHTProtocol.serializer.dumps(codec.encode(a)), time.time() + 60) for s, a in adverts]
    costs = {
        "verify schedule": timed(lambda: verify(schedule, key, "schedule")),
        "verify roster": timed(lambda: verify(roster, key, "roster")),
        "admit adverts (claims cached)": timed(lambda: [rules.advert_admitted(a) for _, a in adverts]),
        "validate stores": timed(lambda: [validator.validate(r) for r in records]),
        "push rules": timed(lambda: pickle.dumps(rules.portable())),
        "sign schedule": timed(lambda: sign("schedule", schedule.payload, organiser)),
    }
    per_s = (costs["verify schedule"] * 2 / poll_s                    # the schedule and the spec, each poll
             + (costs["verify roster"] + costs["admit adverts (claims cached)"] + costs["push rules"]) / announce_s
             + costs["validate stores"] * 4 / announce_s               # every member's 4 records, at most
             + costs["sign schedule"] / 60.0)                          # the coordinator's spec re-put
    detail = ", ".join(f"{name} {1e6 * s:.0f}us" for name, s in costs.items())
    return {"cpu_s_per_s": per_s, "detail": f"{peers} peers: {detail}"}
