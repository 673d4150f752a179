"""The organiser's member file (issue 24): invitations issued, which identity each is bound to,
and who was banned; `skippipe-coordinator invite` and `ban` write it, the running coordinator
(`--members FILE`) binds first claims into it and publishes it as a signed Roster every round.

The file is JSON, mode 0600, changed under an exclusive lock (the CLI and the running
coordinator may write it at once) and replaced atomically:
  {"run": NAME, "invites": {ID: {"issued": T, "peer": PEER|null, "note": TEXT}},
   "banned": {PEER: REASON}, "revoked": [ID, ...]}
"""
import contextlib
import fcntl
import json
import logging
import os
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.adverts import PeerAdvert
from protocol.invitations import Roster, issue
from protocol.signing import public_key_text
from swarmcore.dht.admission import AdmissionRules, push_rules

logger = logging.getLogger(__name__)
MAX_FILE_BYTES = 4 * 1024 * 1024
ROSTER_REPUT_S = 300.0


class MemberFileError(Exception):
    """The member file cannot be used; the message says why."""


class MemberFile:
    def __init__(self, path: str | os.PathLike, run: str):
        self.path, self.run = Path(path), run

    def read(self) -> dict:
        try:
            if self.path.stat().st_mode & 0o077:
                raise MemberFileError(f"member file {self.path} is readable by other users; run: chmod 600 {self.path}")
            data = json.loads(self.path.read_bytes()[:MAX_FILE_BYTES + 1] or b"{}")
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise MemberFileError(f"cannot read member file {self.path}: {exc}") from None
        if not isinstance(data, dict) or data.get("run", self.run) != self.run:
            raise MemberFileError(f"member file {self.path} belongs to run {data.get('run')!r}, not {self.run!r}")
        data.setdefault("run", self.run)
        for name, empty in (("invites", {}), ("banned", {}), ("revoked", [])):
            if not isinstance(data.setdefault(name, empty), type(empty)):
                raise MemberFileError(f"member file {self.path}: {name!r} must be a {type(empty).__name__}")
        return data

    @contextlib.contextmanager
    def changing(self):
        """The file's content to change in place; written back (atomically) on exit."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.read()
            yield data
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            tmp.replace(self.path)
        finally:
            os.close(lock)

    def invite(self, organiser: Ed25519PrivateKey, note: str = "") -> tuple[str, str]:
        """(invitation id, token) of a new invitation, recorded in the file."""
        invitation, token = issue(organiser, self.run)
        with self.changing() as data:
            data["invites"][invitation.invite_id] = {"issued": time.time(), "peer": None, "note": note}
        return invitation.invite_id, token

    def ban(self, who: str, reason: str = "banned by the organiser") -> list[str]:
        """Ban a peer id (and revoke its invitation), or revoke an invitation id (and ban its
        peer, if bound). The peer ids banned."""
        with self.changing() as data:
            invite = data["invites"].get(who)
            peers = [invite["peer"]] if invite and invite.get("peer") else []
            if invite is None:
                peers = [who]
                bound = [i for i, v in data["invites"].items() if v.get("peer") == who]
                data["revoked"] = sorted(set(data["revoked"]) | set(bound))
            else:
                data["revoked"] = sorted(set(data["revoked"]) | {who})
            for peer in peers:
                data["banned"][peer] = reason
        return peers

    def roster(self, data: dict) -> Roster:
        bindings = tuple(sorted((i, v["peer"]) for i, v in data["invites"].items()
                                if isinstance(v, dict) and isinstance(v.get("peer"), str)))
        return Roster(self.run, int(time.time() * 1000), bindings, tuple(sorted(data["banned"])),
                      tuple(sorted(set(data["revoked"]))))


class MemberBook:
    """The running coordinator's side: each round, binds the first claim of every unbound
    invitation, and re-publishes the roster when it changed (or every ROSTER_REPUT_S)."""

    def __init__(self, file: MemberFile | None, rules: AdmissionRules):
        self.file, self.rules = file, rules       # no file: a join key alone (no roster)
        self._published: tuple | None = None
        self._published_at = float("-inf")
        if file is not None:
            self.update(file.read())

    def update(self, data: dict) -> None:
        self.data = data
        self.rules.set_roster(self.file.roster(data))

    def bind_first_claims(self, adverts: dict[str, PeerAdvert]) -> list[tuple[str, str]]:
        """Bind each unbound issued invitation to the earliest advert claiming it; the new bindings."""
        first: dict[str, PeerAdvert] = {}
        for advert in sorted(adverts.values(), key=lambda a: (a.timestamp, a.peer_id)):
            invite = self.rules.invitation_of(advert)
            if invite is not None and invite not in first:
                first[invite] = advert
        issued = self.data["invites"]
        new = [(i, a.peer_id) for i, a in first.items()
               if i in issued and issued[i].get("peer") is None and i not in self.data["revoked"]]
        if new:
            with self.file.changing() as data:
                for invite, peer in new:
                    if invite in data["invites"] and data["invites"][invite].get("peer") is None:
                        data["invites"][invite]["peer"] = peer
                        logger.info("invitation %s is now bound to peer %s", invite, peer)
                self.update(data)
        return new

    def due(self) -> Roster | None:
        """The roster to publish now, if it changed or is due for a refresh."""
        roster = self.rules.roster
        content = (roster.bindings, roster.banned, roster.revoked)
        if content == self._published and time.monotonic() - self._published_at < ROSTER_REPUT_S:
            return None
        return roster

    def published(self, roster: Roster) -> None:
        self._published = (roster.bindings, roster.banned, roster.revoked)
        self._published_at = time.monotonic()

    async def round(self, records, adverts: dict[str, PeerAdvert]) -> dict[str, PeerAdvert]:
        """Reload the file (a `ban` or `invite` since), bind first claims, publish the roster,
        give our DHT node the rules; the adverts still admitted."""
        if self.file is not None:
            try:
                self.update(self.file.read())
            except MemberFileError as exc:
                logger.warning("%s; keeping the member list read before", exc)
            self.bind_first_claims(adverts)
            roster = self.due()
            if roster is not None and await records.put_roster(roster):
                self.published(roster)
        admitted = {p: a for p, a in adverts.items() if self.rules.advert_admitted(a)}
        self.rules.members = frozenset(admitted)
        await push_rules(records.dht, self.rules)
        return admitted


def admission_for(run: str, join_key: bytes | None, members_path: str,
                  organiser: Ed25519PrivateKey) -> tuple[AdmissionRules | None, MemberBook | None]:
    """The coordinator's rules for a private run (join key and/or a member file), and its book."""
    if join_key is None and not members_path:
        return None, None
    rules = AdmissionRules(run, join_key, organiser_key=public_key_text(organiser))
    return rules, MemberBook(MemberFile(members_path, run) if members_path else None, rules)
