"""The control-plane, admission and transport attacks of bench/byzantine.py (issue 24), each
against the product code over real hivemind DHT nodes or P2P daemons on 127.0.0.1, or against
the coordinator's pure rules. Each returns an Outcome; every node it starts, it stops."""
import asyncio
import functools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.utils.crypto import RSAPrivateKey
from opsweb.dht_process import safe_for_large_calls

from coordinator.advert_check import AdvertGate
from coordinator.dht_io import CoordinatorRecords
from coordinator.members import MemberFile, admission_for
from coordinator.swarm_view import BanList
from peer.app import start_dht
from peer.config import PeerConfig
from peer.security.guard import PeerGuard
from protocol import codec, ids
from protocol import messages as m
from protocol.adverts import PeerAdvert, PeerState
from protocol.owner import peer_id_of_subkey
from protocol.signing import sign
from protocol.spot_checks import SpotCheckReport
from swarmcore.dht.validators import record_validators

from bench.support.memory_swarm import make_schedule

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
RUN = "byz"


@dataclass(frozen=True)
class Outcome:
    attack: str
    defended: bool
    detail: str


async def _stored_owners(key: str, _dht, node) -> list[str]:
    found = node.protocol.storage.get(DHTID.generate(source=key))
    if found is None or not isinstance(found.value, DictionaryDHTValue):
        return []
    owners = []
    for subkey, _ in found.value.items():
        try:
            owners.append(peer_id_of_subkey(subkey))
        except Exception:
            owners.append("unowned")
    return owners


async def stored_owners(dht, key: str) -> set[str]:
    """Who owns the subkeys `dht`'s node accepted under `key`."""
    return set(await dht.run_coroutine(functools.partial(_stored_owners, key), return_future=True))


class PrivateRun:
    """A coordinator's DHT node with the organiser key and a member file, and invited peers."""

    def __init__(self, folder: Path, spec: m.RunSpec):
        self.folder, self.spec = folder, spec
        self.organiser = Ed25519PrivateKey.generate()
        self.file = MemberFile(folder / "members.json", RUN)
        self.rules, self.book = admission_for(RUN, None, str(self.file.path), self.organiser)
        signer, validators = record_validators(RUN, admission=self.rules)
        self.coordinator = safe_for_large_calls(DHT(start=True, host_maddrs=LOOPBACK, record_validators=validators))
        self.maddrs = [str(a) for a in self.coordinator.get_visible_maddrs()]
        self.records = CoordinatorRecords(self.coordinator, RUN, None, self.organiser, signer.local_public_key,
                                          self.rules)
        self.dhts, self.guards = [self.coordinator], []

    def member(self, name: str, token: str = ""):
        config = PeerConfig(initial_peers=tuple(self.maddrs), run=RUN, host_maddrs=tuple(LOOPBACK),
                            identity_path=self.folder / f"{name}.key", invite=token)
        guard = PeerGuard(config)
        dht = start_dht(config, guard)
        self.dhts.append(dht)
        self.guards.append(guard)
        records = guard.records(dht, guard.identity.peer_id)
        guard.rpc_server(records, lambda **kw: None)       # its member gate: reads the roster, pushes the rules
        return guard, records, dht

    def rogue(self):
        """A process with no invitation and a DHT node that validates nothing."""
        dht = safe_for_large_calls(DHT(start=True, host_maddrs=LOOPBACK, initial_peers=self.maddrs))
        self.dhts.append(dht)
        return dht

    async def round(self):
        return await self.book.round(self.records, await self.records.get_adverts())

    def close(self):
        for dht in self.dhts:
            dht.shutdown()
        for guard in self.guards:
            guard.close()


def advert_of(guard) -> PeerAdvert:
    return guard.sign_advert(PeerAdvert(guard.identity.peer_id, PeerState.ONLINE, "cpu", 1, 0.01,
                                        timestamp=time.time()))


async def _forge_control_plane(run: PrivateRun, records) -> Outcome:
    await run.records.put_spec(run.spec)
    honest = make_schedule(RUN, {"a": 0, "b": 1}, {0: ["a", "b"]}, epoch=2)
    await run.records.put_schedule(honest)
    rogue = run.rogue()
    mallory = Ed25519PrivateKey.generate()
    forged = make_schedule(RUN, {"m": 0, "n": 1}, {0: ["m", "n"]}, epoch=1002)
    poison = m.RunSpec(**{**run.spec.__dict__, "learning_rate": 0.9, "skip_ratio": 0.5})
    rogue_subkey = RSASignatureValidator(RSAPrivateKey()).local_public_key
    far = time.time() + 30 * 86400
    for key, record in ((ids.schedule_key(RUN), sign("schedule", codec.encode(forged), mallory)),
                        (ids.spec_key(RUN), sign("spec", codec.encode(poison), mallory))):
        await rogue.store(key, codec.encode(record), far, return_future=True)                       # plain
        await rogue.store(key, codec.encode(record), time.time() + 600, subkey=rogue_subkey, return_future=True)
        await rogue.store(key, codec.encode(record), far, subkey=run.records.owner_subkey, return_future=True)
    schedule, spec = await records.get_schedule(), await records.get_spec()
    ok = schedule is not None and schedule.epoch == 2 and spec is not None and spec.learning_rate == run.spec.learning_rate
    return Outcome("forged spec/schedule", ok, f"peer reads epoch {schedule and schedule.epoch}, "
                                              f"lr {spec and spec.learning_rate} (forged: 1002, 0.9)")


async def _uninvited_writers(run: PrivateRun, alice, alice_rec, alice_dht) -> Outcome:
    _, dave_token = run.file.invite(run.organiser, "dave")
    dave, dave_rec, _ = run.member("dave", dave_token)
    await dave_rec.put_advert(advert_of(dave), ttl_s=60)
    await run.round()
    copy_token = alice.config.invite
    copy, copy_rec, _ = run.member("alice-copy", copy_token)     # the first token, on a second identity
    stranger, stranger_rec, _ = run.member("stranger")           # no invitation at all
    run.file.ban(dave.identity.peer_id)
    await run.round()
    for guard in (alice, dave, copy):
        await guard.gate.refresh()
    for guard, rec in ((alice, alice_rec), (dave, dave_rec), (copy, copy_rec), (stranger, stranger_rec)):
        await rec.put_advert(advert_of(guard), ttl_s=60)
        await rec.put_progress(m.ProgressRecord(guard.identity.peer_id, ()), ttl_s=60)
    honest = {alice.identity.peer_id}
    stored = set()
    for dht in (run.coordinator, alice_dht):
        for key in (ids.peers_key(RUN), ids.progress_key(RUN)):
            stored |= await stored_owners(dht, key)
    planned = set(await run.round())
    ok = stored == honest and planned == honest
    return Outcome("uninvited/banned writer", ok, f"honest nodes hold records of {len(stored)} peer(s), "
                                                  f"{len(stored - honest)} of them not members; planned {len(planned)}")


def control_plane_and_admission(spec: m.RunSpec) -> list[Outcome]:
    """Forged spec/schedule and uninvited, banned and second-identity writers, over real DHT nodes."""
    with tempfile.TemporaryDirectory(prefix="byzantine-") as tmp:
        run = PrivateRun(Path(tmp), spec)
        try:
            async def scenario():
                _, token = run.file.invite(run.organiser, "alice")
                alice, alice_rec, alice_dht = run.member("alice", token)
                await alice_rec.put_advert(advert_of(alice), ttl_s=60)
                await run.round()
                await alice.gate.refresh()
                return [await _forge_control_plane(run, alice_rec),
                        await _uninvited_writers(run, alice, alice_rec, alice_dht)]
            return asyncio.run(asyncio.wait_for(scenario(), 120))
        finally:
            run.close()


def lying_advert(spec: m.RunSpec) -> Outcome:
    gate = AdvertGate(spec)
    layers = gate.facts.num_layers
    facts = dict(activation_bytes_per_sample=gate.facts.activation_bytes_per_sample, param_bytes_per_layer=1000)
    honest = {f"h{s}": PeerAdvert(f"h{s}", PeerState.ONLINE, "cpu", 1 << 30, 1e-4, stage=s, num_layers=layers, **facts)
              for s in range(spec.num_stages)}
    liar = PeerAdvert("liar", PeerState.ONLINE, "cpu", 1 << 30, 1e-4, num_layers=layers + 5, **facts)
    kept = gate.admit({**honest, "liar": liar})
    return Outcome("lying advert", set(kept) == set(honest), f"kept {len(kept)} of {len(honest)} honest, "
                                                             f"liar ignored: {'liar' in gate.ignored}")


def forged_reports() -> Outcome:
    """One member's identities s1, s2 file failures about an honest replica h they never received from."""
    schedule = make_schedule(RUN, {"o": 0, "s1": 0, "s2": 0, "h": 1, "x": 1},
                             {0: ["o", "h"], 1: ["s1", "x"], 2: ["s2", "x"]}, epoch=1)
    routes = {(schedule.epoch, r.microbatch_id): r for r in schedule.routes}
    replicas = {(schedule.epoch, a.stage): set() for a in schedule.assignment}
    for a in schedule.assignment:
        replicas[(schedule.epoch, a.stage)].add(a.peer)
    bans = BanList(routes=lambda e, mb: routes.get((e, mb)), replicas=lambda e, s: replicas.get((e, s), set()))
    for sybil in ("s1", "s2"):
        reports = [SpotCheckReport("h", sybil, 1, i, mb, 1, 0.5, False) for i in range(4) for mb in range(3)]
        reports += [SpotCheckReport("h", sybil, 1, i, 0, 1, 1e3, False, kind="share") for i in range(4)]
        bans.observe(sybil, reports)
    return Outcome("forged spot-check reports (2 identities)", "h" not in bans.banned,
                   f"banned {sorted(bans.banned) or 'nobody'}; {bans.ignored_reports} reports ignored")


async def _starve(victim, attacker, honest, server) -> tuple[int, object, float]:
    """The attacker's idle streams and streams declaring 8 MiB; an honest ping meanwhile."""
    import torch
    from hivemind.p2p import PeerID
    from peer.compute import tensor_codec
    from peer.transport.hivemind_p2p import PROTOCOL_NAME
    from peer.transport.rpc import RpcClient
    from bench.support import rogue
    me, them = victim.peer_id.to_base58(), attacker.peer_id.to_base58()
    big = m.ForwardRequest(m.WorkHeader(RUN, 3, 0, 0, 1), tensor_codec.encode(torch.zeros(2048, 1024)))
    head = RpcClient(None, unary_tensor_bytes=0, chunk_bytes=1 << 20).frames_for(big)[:2]
    writers = []
    try:
        for i in range(24):
            _, _, writer = await attacker.call_binary_stream_handler(PeerID.from_base58(me), PROTOCOL_NAME)
            for frame in (head if i < 2 else []):
                writer.write(len(frame).to_bytes(4, "big") + frame)
            await writer.drain()
            writers.append(writer)
        admission = server.admission
        for _ in range(100):
            if admission._in_flight[them] >= admission.limits.max_in_flight_per_peer:
                break
            await asyncio.sleep(0.02)
        held = admission._in_flight[them]
        reply = await rogue.send(honest, me, rogue.Request("ping", [codec.encode(m.Ping(9))]))
        loop = asyncio.get_running_loop()
        start = loop.time()
        while admission.total_in_flight and loop.time() - start < 15:
            await asyncio.sleep(0.05)
        return held, reply, loop.time() - start
    finally:
        for writer in writers:
            writer.close()


def slow_streams() -> Outcome:
    """One peer's idle and oversized streams at a real RPC server over P2P: another's ping still
    answered, the attacker held to its quarter of the slots, everything freed within seconds."""
    from hivemind.p2p import P2P
    from peer.security.limits import Admission, Limits
    from peer.transport.hivemind_p2p import HivemindTransport
    from peer.transport.rpc import RpcServer

    async def scenario():
        victim = await P2P.create(host_maddrs=LOOPBACK)
        maddrs = [str(a) for a in await victim.get_visible_maddrs()]
        attacker = await P2P.create(host_maddrs=LOOPBACK, initial_peers=maddrs)
        honest = await P2P.create(host_maddrs=LOOPBACK, initial_peers=maddrs)
        transport = HivemindTransport(victim)
        server = RpcServer(max_tensor_bytes=8 << 20, admission=Admission(Limits(stream_bytes_budget=32 << 20)))

        async def pong(remote, request: m.Ping) -> m.Pong:
            return m.Pong(request.nonce, request.payload)
        server.register(m.Ping, pong)
        await transport.serve(server.handle)
        try:
            return await _starve(victim, attacker, honest, server)
        finally:
            await transport.close()
            for p2p in (honest, attacker, victim):
                await p2p.shutdown()
    held, reply, freed_s = asyncio.run(asyncio.wait_for(scenario(), 60))
    answered = reply is not None and isinstance(codec.decode(reply), m.Pong)
    return Outcome("oversized/slow streams", answered and held <= 16 and freed_s < 10,
                   f"attacker held {held} slots, honest ping {'answered' if answered else 'REFUSED'}, "
                   f"all freed after {freed_s:.1f}s")
