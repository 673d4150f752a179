"""The organiser's member file and the coordinator's binding of first claims (coordinator/members.py)."""
import os
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.members import MemberBook, MemberFile, MemberFileError, admission_for
from coordinator.cli import main
from protocol.adverts import PeerAdvert, PeerState
from protocol.invitations import make_claim, parse_token

ORG = Ed25519PrivateKey.generate()


def advert(peer: str, token: str, at: float) -> PeerAdvert:
    return PeerAdvert(peer, PeerState.ONLINE, "cpu", 1, 0.01, timestamp=at,
                      invite_claim=make_claim(parse_token(token), "run", peer))


def book(tmp_path) -> MemberBook:
    rules, book = admission_for("run", None, str(tmp_path / "members.json"), ORG)
    return book


def test_an_invitation_binds_to_the_first_identity_and_a_ban_revokes_it(tmp_path):
    file = MemberFile(tmp_path / "members.json", "run")
    invite_id, token = file.invite(ORG, "alice")
    assert os.stat(file.path).st_mode & 0o777 == 0o600
    b = book(tmp_path)
    now = time.time()
    first, second = advert("QmFirst", token, now), advert("QmSecond", token, now + 1)
    assert b.bind_first_claims({"QmSecond": second, "QmFirst": first}) == [(invite_id, "QmFirst")]
    assert b.rules.advert_admitted(first) and not b.rules.advert_admitted(second)
    assert MemberFile(file.path, "run").read()["invites"][invite_id]["peer"] == "QmFirst"   # kept across restarts
    assert book(tmp_path).rules.roster.bindings == ((invite_id, "QmFirst"),)
    assert file.ban("QmFirst") == ["QmFirst"]
    b.update(file.read())
    assert not b.rules.advert_admitted(first)
    assert b.rules.roster.revoked == (invite_id,) and b.rules.roster.banned == ("QmFirst",)


def test_a_stray_or_uninvited_claim_binds_nothing(tmp_path):
    MemberFile(tmp_path / "members.json", "run").invite(ORG)
    b = book(tmp_path)
    _, foreign = MemberFile(tmp_path / "other.json", "run").invite(Ed25519PrivateKey.generate())
    assert b.bind_first_claims({"QmX": advert("QmX", foreign, time.time())}) == []


def test_banning_an_invitation_id_bans_its_peer(tmp_path):
    file = MemberFile(tmp_path / "members.json", "run")
    invite_id, token = file.invite(ORG)
    book(tmp_path).bind_first_claims({"QmA": advert("QmA", token, 1.0)})
    assert file.ban(invite_id) == ["QmA"]


def test_a_loose_or_foreign_member_file_is_refused(tmp_path):
    file = MemberFile(tmp_path / "members.json", "run")
    file.invite(ORG)
    with pytest.raises(MemberFileError, match="belongs to run"):
        MemberFile(file.path, "other").read()
    os.chmod(file.path, 0o644)
    with pytest.raises(MemberFileError, match="chmod 600"):
        file.read()


def test_invite_and_ban_commands(tmp_path, capsys):
    members, key = str(tmp_path / "m.json"), str(tmp_path / "org.pem")
    assert main(["invite", "--run", "demo", "--members", members, "--organiser-key", key, "--note", "bob"]) == 0
    out = capsys.readouterr().out
    token = out.split("TOKEN ")[1].split()[0]
    assert parse_token(token).invite_id in MemberFile(members, "demo").read()["invites"]
    assert "skippipe-peer --run demo@ed25519:" in out and f"--invite {token}" in out
    assert main(["ban", "QmBad", "--run", "demo", "--members", members]) == 0
    assert "QmBad" in MemberFile(members, "demo").read()["banned"]
    assert main(["ban", "QmBad", "--run", "bad name", "--members", members]) == 2
