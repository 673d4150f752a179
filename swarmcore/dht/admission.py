"""Who is a member of a private run (issue 24), one rule for the DHT validators, the record
readers and the RPC gate.

A run is private when it has a join key or invitations. A peer is a member when it is not
banned by the organiser's roster and its advert carries either a valid join-key proof
(protocol/membership.py) or a valid invitation claim (protocol/invitations.py) whose invitation
is neither revoked nor bound to another peer id. Its other records (links, progress, spot
checks) are accepted only once its advert has been seen: `members`, refreshed by the reader
(peer: the RPC gate's refresh, coordinator: every round) and pushed into the DHT process's
validator by `push_rules`, since hivemind's validators run in the DHT's own process.
"""
import functools
import logging
from dataclasses import dataclass, field, replace

from protocol.adverts import PeerAdvert
from protocol.invitations import Roster, verify_claim
from protocol.membership import is_member

logger = logging.getLogger(__name__)
CLAIM_CACHE_ENTRIES = 1024


@dataclass
class AdmissionRules:
    run: str
    join_key: bytes | None = None
    organiser_key: str = ""                 # verifies invitation claims ("" until pinned)
    roster: Roster | None = None
    members: frozenset[str] = frozenset()   # peers whose admitted adverts were seen
    always: frozenset[str] = frozenset()    # ourselves
    _claims: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self._index()

    def _index(self) -> None:
        roster = self.roster
        self._bound = dict(roster.bindings) if roster else {}
        self._banned = frozenset(roster.banned) if roster else frozenset()
        self._revoked = frozenset(roster.revoked) if roster else frozenset()

    def set_roster(self, roster: Roster | None) -> None:
        if roster is not None and roster.run == self.run and (self.roster is None or roster.version >= self.roster.version):
            self.roster = roster
            self._index()

    def banned(self, peer_id: str) -> bool:
        return peer_id in self._banned

    def invitation_of(self, advert: PeerAdvert) -> str | None:
        """The invitation `advert` validly claims (bound or not), or None."""
        if not advert.invite_claim or not self.organiser_key:
            return None
        key = (advert.invite_claim, advert.peer_id, self.organiser_key)
        if key not in self._claims:                       # two signature checks: cached
            if len(self._claims) >= CLAIM_CACHE_ENTRIES:
                self._claims.clear()
            self._claims[key] = verify_claim(advert.invite_claim, self.run, advert.peer_id, self.organiser_key)
        return self._claims[key]

    def advert_admitted(self, advert: PeerAdvert) -> bool:
        if self.banned(advert.peer_id):
            return False
        if self.join_key is not None and is_member(self.join_key, self.run, advert.peer_id, advert.member_proof):
            return True
        invite = self.invitation_of(advert)
        if invite is None or invite in self._revoked:
            return False
        return self._bound.get(invite, advert.peer_id) == advert.peer_id

    def owner_admitted(self, peer_id: str) -> bool:
        """May `peer_id` write its other records (links, progress, spot checks)?"""
        return not self.banned(peer_id) and (peer_id in self.members or peer_id in self.always)

    def portable(self) -> "AdmissionRules":
        """A copy without the claim cache, for the DHT process."""
        return replace(self, _claims={})


async def _install(rules: AdmissionRules, _dht, node) -> int:
    installed = 0
    for validator in getattr(node.protocol.record_validator, "_validators", ()):
        if getattr(validator, "run", None) == rules.run and hasattr(validator, "rules"):
            rules._claims = validator.rules._claims       # verified claims stay verified
            validator.rules = rules
            installed += 1
    if rules.roster is not None and rules.roster.banned:
        _purge(node, rules)
    return installed


def _purge(node, rules: AdmissionRules) -> None:
    """Drop what banned peers stored here before their ban (hivemind never re-validates)."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.storage import DictionaryDHTValue
    from protocol import ids
    from protocol.owner import peer_id_of_subkey
    keys = (ids.peers_key, ids.links_key, ids.progress_key, ids.spot_checks_key)
    for storage in (node.protocol.storage, getattr(node.protocol, "cache", None)):
        for key in keys:
            found = storage.get(DHTID.generate(source=key(rules.run))) if storage is not None else None
            if found is None or not isinstance(found.value, DictionaryDHTValue):
                continue
            for subkey, _ in list(found.value.items()):
                try:
                    if rules.banned(peer_id_of_subkey(subkey)):
                        del found.value[subkey]
                except Exception:   # an unowned subkey: the schema validator refused it on the way in
                    continue


async def push_rules(dht, rules: AdmissionRules) -> bool:
    """Give the DHT process's member validator the current rules (its own copy)."""
    try:
        return bool(await dht.run_coroutine(functools.partial(_install, rules.portable()), return_future=True))
    except Exception as exc:   # a DHT shutting down: the validator keeps the previous rules
        logger.debug("cannot update the DHT's member rules: %s", exc)
        return False
