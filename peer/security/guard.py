"""The peer's security wiring in one place (peer/app.py stays a composition root): identity and
DHT validators for the DHT, signed records, the member proof in our advert, and the RPC guards."""
import asyncio
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path

from protocol.adverts import PeerAdvert
from protocol.invitations import InvitationError, make_claim, parse_token
from protocol.membership import JoinKeyError, load_join_key, member_proof
from protocol.tensors import DEFAULT_CHUNK_BYTES

from peer.config import PeerConfig
from peer.discovery.dht_records import PeerRecords
from swarmcore.dht.admission import AdmissionRules, push_rules
from swarmcore.dht.validators import record_validators
from peer.security.identity import IdentityError, duplicate_message, load_identity
from peer.security.limits import Admission, Limits
from peer.security.membership import MemberGate

logger = logging.getLogger(__name__)


class PeerGuard:
    def __init__(self, config: PeerConfig):
        self.config = config
        self._tmp: Path | None = None
        try:
            self.join_key = load_join_key(config.join_key_path) if config.join_key_path else None
            self.invitation = parse_token(config.invite) if config.invite else None
            path = config.identity_path
            if path is None:  # one key must serve libp2p and DHT signing, so even a fresh one is a file
                self._tmp = Path(tempfile.mkdtemp(prefix="skippipe-id-"))
                path = self._tmp / "identity.key"
            self.identity = load_identity(path)
        except (JoinKeyError, IdentityError, InvitationError) as exc:
            self.close()
            raise ValueError(str(exc)) from None
        if self.invitation is not None and config.organiser_key and config.organiser_key != self.invitation.organiser_key:
            self.close()
            raise ValueError("--invite is for another organiser key than --run NAME@KEY names")
        # a private run (a join key or an invitation): only members write its records
        self.member_rules = None
        if self.join_key is not None or self.invitation is not None:
            self.member_rules = AdmissionRules(config.run, self.join_key, organiser_key=self.organiser_key,
                                                always=frozenset({self.identity.peer_id}))
        self.signer, self.validators = record_validators(config.run, self.identity.private_key, self.join_key,
                                                         self.member_rules)
        self.gate: MemberGate | None = None

    @property
    def organiser_key(self) -> str:
        return self.config.organiser_key or (self.invitation.organiser_key if self.invitation else "")

    def dht_kwargs(self) -> dict:
        # hivemind's own duplicate check (a throwaway p2pd dials our id) only matters for a kept identity
        return dict(identity_path=str(self.identity.path), record_validators=self.validators,
                    check_if_identity_free=self._tmp is None)

    @staticmethod
    def is_duplicate(exc: Exception) -> bool:
        return "already taken" in str(exc)  # hivemind's P2PDaemonError for a live identity

    def duplicate_message(self) -> str:
        return duplicate_message(self.identity.path, self.identity.peer_id, "in the swarm")

    def records(self, dht, peer_id: str) -> PeerRecords:
        if peer_id != self.identity.peer_id:
            raise IdentityError(f"libp2p runs as {peer_id}, but the identity file is {self.identity.peer_id}")
        return PeerRecords(dht, self.config.run, peer_id, self.signer.local_public_key, self.join_key,
                           self.organiser_key, self.member_rules)

    def sign_advert(self, advert: PeerAdvert) -> PeerAdvert:
        if self.join_key is not None:
            advert = dataclasses.replace(advert, member_proof=member_proof(self.join_key, self.config.run, advert.peer_id))
        if self.invitation is not None:
            advert = dataclasses.replace(advert, invite_claim=make_claim(self.invitation, self.config.run, advert.peer_id))
        return advert

    def rpc_server(self, records: PeerRecords, server_class):
        cfg = self.config
        if self.member_rules is not None:
            async def members() -> set[str]:
                self.member_rules.organiser_key = records.organiser_key   # pinned on first use, maybe since
                await records.get_roster()
                admitted = set(await records.get_adverts())
                await push_rules(records.dht, self.member_rules)           # our DHT node refuses the others
                return admitted
            self.gate = MemberGate(members, always={records.peer_id})
        budget = max(cfg.max_request_mb * 1024 * 1024, DEFAULT_CHUNK_BYTES)
        # one peer's half-received streams may hold `budget` (the largest tensor), all peers 4x that
        limits = Limits(rate_per_s=cfg.max_requests_per_s, burst=max(1, int(2 * cfg.max_requests_per_s)),
                        stream_bytes_budget=4 * budget, stream_bytes_per_peer=budget)
        self.admission = Admission(limits)
        return server_class(max_tensor_bytes=budget, admission=self.admission, gate=self.gate)

    async def run(self, period_s: float) -> None:
        if self.gate is None:
            await asyncio.Event().wait()  # nothing to refresh; lives as long as the other loops
        await self.gate.run(period_s)

    def close(self) -> None:
        identity = getattr(self, "identity", None)
        if identity is not None:
            identity.release()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
