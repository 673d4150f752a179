"""`skippipe-coordinator invite` and `ban`: admission per volunteer (coordinator/members.py).
They change the member file a running coordinator reads every round (`run --members FILE`), so
an invitation or a ban takes effect within a round, without a restart."""
import argparse

from protocol.ids import check_run_name
from protocol.errors import FieldError
from swarmcore.cli.support import EXIT_USAGE

from coordinator.members import MemberFile, MemberFileError
from coordinator.organiser_key import OrganiserKeyError, load_or_create_organiser_key, run_address


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, metavar="NAME", help="the run's name")
    p.add_argument("--members", required=True, metavar="FILE",
                   help="the member file the coordinator runs with (run --members FILE); created if missing")


def register(sub) -> None:
    p = sub.add_parser("invite", help="print an invitation for one volunteer",
                       description="Issue an invitation: a token the volunteer passes to skippipe-peer --invite. "
                                   "It admits the first peer identity that uses it, and nobody else.")
    _common(p)
    p.add_argument("--organiser-key", required=True, metavar="FILE",
                   help="the key file the coordinator runs with (run --organiser-key FILE)")
    p.add_argument("--note", default="", help="who it is for (kept in the member file)")
    p.set_defaults(func=invite_command)
    p = sub.add_parser("ban", help="revoke a member (a peer id or an invitation id)",
                       description="Ban a peer: its records are refused by every member's DHT node, it gets no "
                                   "route and no RPC; its invitation is revoked.")
    _common(p)
    p.add_argument("peer", metavar="PEER", help="a peer id, or an invitation id from the member file")
    p.add_argument("--reason", default="banned by the organiser")
    p.set_defaults(func=ban_command)


def _checked_run(args) -> str | None:
    try:
        return check_run_name(args.run)
    except FieldError as exc:
        print(f"skippipe-coordinator {args.command}: error: {exc}")
        return None


def invite_command(args: argparse.Namespace) -> int:
    run = _checked_run(args)
    if run is None:
        return EXIT_USAGE
    try:
        organiser, _ = load_or_create_organiser_key(args.organiser_key)
        invite_id, token = MemberFile(args.members, run).invite(organiser, args.note)
    except (OrganiserKeyError, MemberFileError) as exc:
        print(f"skippipe-coordinator invite: error: {exc}")
        return EXIT_USAGE
    print(f"invitation {invite_id} to run {run} (give it to one volunteer; it binds to the first identity "
          f"that uses it):\n  skippipe-peer --run {run_address(run, organiser)} --identity FILE --invite {token} "
          f"--initial-peers ...")
    print(f"TOKEN {token}")
    return 0


def ban_command(args: argparse.Namespace) -> int:
    run = _checked_run(args)
    if run is None:
        return EXIT_USAGE
    try:
        peers = MemberFile(args.members, run).ban(args.peer, args.reason)
    except MemberFileError as exc:
        print(f"skippipe-coordinator ban: error: {exc}")
        return EXIT_USAGE
    print(f"banned {', '.join(peers) or '(no peer yet)'}; invitation(s) revoked. The running coordinator publishes "
          f"it within a round.")
    return 0
