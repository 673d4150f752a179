"""`skippipe-coordinator`: run a swarm's coordinator, or use the planner offline.

Subcommands: run (default), plan, simulate, topology, eval, tokenizer, data, export, generate,
invite, ban.
"""
import argparse
import difflib
import sys

from opsweb.addresses import multiaddr
from swarmcore.cli.logsetup import add_logging_flags, setup_logging
from swarmcore.cli.run_flags import COORDINATOR, add_run_flags
from swarmcore.cli.settings import add_config_flag, apply_settings
from swarmcore.cli.support import EXIT_USAGE, OneLineErrorParser, add_version_flag, non_negative_int

from coordinator import data_cli, export_cli, members_cli, offline_cli
from coordinator.config import CoordinatorConfig
from coordinator.run_args import (hivemind_logs_as, print_path_length, resolve_arch, resolve_data_or_exit,
                                  run_config_fields)

DESCRIPTION = """\
Coordinate a SkipPipe Swarm training run, or plan and simulate schedules offline.

  run        start (or join) the DHT, publish the run spec, watch peers, plan SkipPipe
             routes and publish the schedule; re-plan when peers join or leave (default)
  plan       plan a schedule for a topology file
  simulate   predict a schedule's iteration time (and draw it as a Gantt chart)
  topology   write a preset topology (geo, clusters, single)
  tokenizer  train a byte-level BPE tokenizer on text files (tokenizer.json)
  data       tokenize text into a dataset folder (token shards + dataset.json)
  export     write a run's model as a Hugging Face folder (transformers loads it)
  generate   sample a continuation from a checkpoint or an exported folder
  invite     issue an invitation for one volunteer (--invite TOKEN)
  ban        revoke a member: its records, routes and RPCs are refused
"""
# Every subcommand; adding one: its name here and its module's register(sub) in build_parser.
SUBCOMMANDS = ("run", "plan", "simulate", "topology", "eval", "tokenizer", "data", "export", "generate",
               "invite", "ban")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    add_run_flags(p, COORDINATOR)   # shared with skippipe-swarm (swarmcore/cli/run_flags.py)
    p.add_argument("--warmup", type=non_negative_int, default=5, help="warm-up iterations")
    p.add_argument("--host-maddrs", type=multiaddr, nargs="+", default=["/ip4/0.0.0.0/tcp/0"], metavar="MADDR")
    p.add_argument("--announce-maddrs", type=multiaddr, nargs="+", default=[], metavar="MADDR")
    p.add_argument("--serve-relay", action="store_true",
                   help="relay connections for peers behind NAT (their --relay-via); only on a public address "
                        "(docs/nat.md)")
    p.add_argument("--initial-peers", type=multiaddr, nargs="+", default=[], metavar="MADDR",
                   help="join an existing DHT")
    p.add_argument("--min-peers", type=int, default=0, help="wait for this many peers before planning")
    p.add_argument("--status-host", default="127.0.0.1",
                   help="address for the status page (default: 127.0.0.1; 0.0.0.0 to show it to others)")
    p.add_argument("--maddrs-file", default="", metavar="FILE",
                   help="write the multiaddrs peers pass to --initial-peers into FILE once up (for scripts)")
    p.add_argument("--members", default="", metavar="FILE",
                   help="admission per volunteer: the member file that `invite` and `ban` write (needs a kept "
                        "--organiser-key); only invited, unbanned peers (and join-key holders) may write the run's "
                        "records")
    p.add_argument("--organiser-key", default="", metavar="FILE",
                   help="the key that signs the run spec and schedules (created, mode 0600, if missing); peers pin "
                        "its public half (--run NAME@KEY, printed at start), so keep it: a coordinator restarted with "
                        "it takes the run back (default: a new key each start)")
    add_logging_flags(p, "INFO")
    add_config_flag(p)
    p.set_defaults(func=run_command)


def config_from_args(args: argparse.Namespace) -> CoordinatorConfig:
    return CoordinatorConfig(
        **run_config_fields(args), warmup_steps=args.warmup,
        host_maddrs=tuple(args.host_maddrs), announce_maddrs=tuple(args.announce_maddrs),
        initial_peers=tuple(args.initial_peers), min_peers=args.min_peers,
        status_host=args.status_host, maddrs_file=args.maddrs_file, organiser_key_path=args.organiser_key,
        members_path=args.members, serve_relay=args.serve_relay)


def run_command(args: argparse.Namespace) -> int:
    if args.members and not args.organiser_key:
        print("skippipe-coordinator: error: --members needs --organiser-key FILE (the key that signed the "
              "invitations)", file=sys.stderr)
        return EXIT_USAGE
    run_data = resolve_data_or_exit("skippipe-coordinator", args)
    failed = resolve_arch("skippipe-coordinator", args, run_data.vocab_size)
    if failed is not None:
        return failed
    setup_logging(args.log_level, args.log_format)
    print_path_length(args)
    from coordinator.run_process import run_coordinator  # hivemind only once the flags are valid
    hivemind_logs_as(args.log_format)
    return run_coordinator(config_from_args(args), run_data)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="skippipe-coordinator", description=DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}",
                           parser_class=OneLineErrorParser)
    add_run_arguments(sub.add_parser("run", help="coordinate a live run (default)",
                                     description="Coordinate a live SkipPipe training run."))
    offline_cli.register(sub)
    data_cli.register(sub)
    export_cli.register(sub)
    members_cli.register(sub)
    for name, command in sub.choices.items():   # `--config FILE` works before or after any subcommand
        if not any("--config" in a.option_strings for a in command._actions):
            add_config_flag(command)
    return p


def with_subcommand(argv: list[str]) -> list[str] | str:
    """argv with its subcommand first: `--config F plan ...` -> `plan --config F ...`, and
    `--run X ...` (flags only) -> `run --run X ...`. A word that is no subcommand: the error."""
    lead = []   # --config FILE given before the subcommand
    rest = list(argv)
    while rest and (rest[0] == "--config" or rest[0].startswith("--config=")):
        take = 1 if "=" in rest[0] else 2
        lead, rest = lead + rest[:take], rest[take:]
    if not rest or rest[0].startswith("-"):
        if rest and rest[0] in ("-h", "--help", "--version") and not lead:
            return rest
        return ["run", *lead, *rest]    # `skippipe-coordinator --run X ...` means `run`
    if rest[0] not in SUBCOMMANDS:
        close = difflib.get_close_matches(rest[0], SUBCOMMANDS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f" (commands: {', '.join(SUBCOMMANDS)})"
        return f"unknown command {rest[0]!r}{hint}"
    return [rest[0], *lead, *rest[1:]]


def main(argv: list[str] | None = None) -> int:
    argv = with_subcommand(list(sys.argv[1:] if argv is None else argv))
    if isinstance(argv, str):
        print(f"skippipe-coordinator: error: {argv}", file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    if argv[0] in SUBCOMMANDS:   # a config file's top-level keys and [coordinator] / [plan] ... table
        apply_settings(subcommand_parser(parser, argv[0]), argv[1:], "coordinator" if argv[0] == "run" else argv[0])
    args = parser.parse_args(argv)
    return args.func(args)


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


if __name__ == "__main__":
    sys.exit(main())
