"""Write docs/configuration.md, the configuration reference, from the console scripts' own
argparse parsers.

    python -m tools.gen_config_docs            # rewrite docs/configuration.md
    python -m tools.gen_config_docs --check    # exit 1 if it is out of date

Run it from the repository root after adding, renaming or changing a flag (its help, default
or choices); tests/unit/tools/test_config_docs.py fails while the file is out of date.

Where the parsers are found (change these when a CLI moves):
- `console_scripts()`: the scripts of pyproject.toml's [project.scripts], each `module:main`;
- `PARSER_FACTORY`: the function of that module that builds its parser;
- `settings_section()`: the config-file table and environment prefix each parser reads, as the
  scripts pass it to apply_settings (a subcommand of skippipe-coordinator reads its own name,
  except `run`, which reads `coordinator`).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "configuration.md"
PARSER_FACTORY = "build_parser"
ENV_PREFIX = "SKIPPIPE_"
# Defaults whose parsed value reads worse than what a user types: (program title, dest) -> text.
SHOWN_DEFAULTS = {("skippipe-peer", "stage"): "auto"}     # --stage auto parses to -1
REGENERATE = "python -m tools.gen_config_docs"


@dataclass(frozen=True)
class Program:
    title: str                      # "skippipe-peer", "skippipe-coordinator plan"
    parser: argparse.ArgumentParser
    section: str                    # its config-file table and SKIPPIPE_<SECTION>_* prefix
    summary: str = ""               # one line, for a subcommand


def console_scripts(root: Path = ROOT) -> dict[str, str]:
    """{script name: "module:function"} from pyproject.toml, in file order."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return dict(project["scripts"])


def settings_section(script: str, subcommand: str | None = None) -> str:
    if subcommand is None or subcommand == "run":
        return script.removeprefix("skippipe-")
    return subcommand


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def programs(root: Path = ROOT) -> list[Program]:
    """Every console script, and every subcommand of one that has them, with its parser."""
    found = []
    for script, target in console_scripts(root).items():
        module = importlib.import_module(target.split(":")[0])
        parser = getattr(module, PARSER_FACTORY)()
        sub = _subparsers(parser)
        if sub is None:
            found.append(Program(script, parser, settings_section(script)))
            continue
        summaries = {choice.dest: choice.help or "" for choice in sub._choices_actions}
        for name, command in sub.choices.items():
            found.append(Program(f"{script} {name}", command, settings_section(script, name),
                                 summaries.get(name, "")))
    return found


# -- rendering -----------------------------------------------------------------------------------
def _plain(value) -> str:
    """A default as text that does not depend on this machine (the home folder becomes ~)."""
    if isinstance(value, float):
        fraction = Fraction(value).limit_denominator(100)
        if fraction.denominator > 1 and abs(float(fraction) - value) < 1e-12 and len(repr(value)) > 8:
            return f"{fraction.numerator}/{fraction.denominator}"
        return repr(value)
    if isinstance(value, (list, tuple)):
        return " ".join(_plain(v) for v in value)
    text = str(value)
    home = str(Path.home())
    if len(home) > 1 and text.startswith(home):
        text = "~" + text[len(home):]
    return text


def _default(program_title: str, action: argparse.Action) -> str:
    if (program_title, action.dest) in SHOWN_DEFAULTS:
        return _cell(SHOWN_DEFAULTS[program_title, action.dest])
    if action.required:
        return "required"
    if action.nargs == 0:      # a switch
        return "off"
    if action.default in (None, "", [], (), argparse.SUPPRESS):
        return "—"
    return _cell(_plain(action.default))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as --help prints it (%(default)s expanded), plus the choices."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = parser.prog
    params["default"] = _plain(action.default) if action.default is not None else None
    for key, value in list(params.items()):
        if hasattr(value, "__name__"):
            params[key] = value.__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, action.choices))
    text = (action.help or "") % params if action.help else ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        listed = ", ".join(map(str, action.choices))
        text = f"{text} (one of: {listed})" if text else f"one of: {listed}"
    home = str(Path.home())
    if len(home) > 1:
        text = text.replace(home, "~")
    return " ".join(text.split()).replace("|", "\\|")


def _cell(text: str) -> str:
    return f"`{text}`"


def option_rows(program: Program) -> list[tuple[str, str, str, str, str]]:
    """(flag, environment, config key, default, meaning) for every option and positional."""
    rows = []
    for action in program.parser._actions:
        if action.dest in ("help", "version") or isinstance(action, argparse._SubParsersAction):
            continue
        if not action.option_strings:    # a positional argument: command line only
            name = action.metavar or action.dest
            rows.append((_cell(name), "—", "—", _default(program.title, action), _help(program.parser, action)))
            continue
        flag = max(action.option_strings, key=len)
        shorts = [o for o in action.option_strings if o != flag]
        shown = _cell(flag) + "".join(f" ({_cell(s)})" for s in shorts)
        if action.dest == "config":
            env, key = _cell(f"{ENV_PREFIX}CONFIG"), "—"
        else:
            env, key = _cell(f"{ENV_PREFIX}{action.dest.upper()}"), _cell(action.dest.replace("_", "-"))
        rows.append((shown, env, key, _default(program.title, action), _help(program.parser, action)))
    return rows


HEADER = f"""\
# Configuration reference

<!-- Generated from the console scripts' argparse parsers by `{REGENERATE}`.
     Do not edit by hand: change the flag's help in the code and regenerate. -->

Every flag of `skippipe-peer`, `skippipe-coordinator` (each subcommand) and `skippipe-swarm` can
also be given as an environment variable or in a TOML config file. Precedence: the command line,
then `SKIPPIPE_<SECTION>_<FLAG>`, then `SKIPPIPE_<FLAG>`, then the config file, then the default.

- **Environment variables** are the flag in upper case with `_` for `-`, e.g.
  `SKIPPIPE_PEER_STAGE=2` or `SKIPPIPE_INITIAL_PEERS="/ip4/... /ip4/..."`: lists are separated by
  spaces, switches are `true` or `false`.
- **The config file** is `--config FILE` (or `SKIPPIPE_CONFIG=FILE`). Its top-level keys apply to
  every program that has that flag (one file serves all three; a program skips the keys it lacks);
  a table applies to one program only, and an unknown key in it is an error. Keys are flag names
  (`initial-peers` or `initial_peers`), lists are TOML arrays, switches `true` / `false`.
- **Sections**: `[peer]` (`SKIPPIPE_PEER_*`) for skippipe-peer, `[coordinator]`
  (`SKIPPIPE_COORDINATOR_*`) for `skippipe-coordinator run`, `[swarm]` (`SKIPPIPE_SWARM_*`) for
  skippipe-swarm; the other coordinator subcommands read a table named after themselves
  (`[plan]`, `SKIPPIPE_PLAN_*`, ...).
- Positional arguments (shown without dashes) come from the command line only.

```toml
run = "demo"
log-format = "json"

[peer]
initial-peers = ["/ip4/203.0.113.5/tcp/31337/p2p/12D3KooW..."]
metrics-port = 9100

[coordinator]
stages = 3
skip = "1/3"
```

A bad value from any source is a one-line error naming where it came from (the flag, the
variable or the file and key), exit code 2, before any network or compute starts. Every script
also answers `--help` and `--version`.
"""


def render(root: Path = ROOT) -> str:
    out = [HEADER]
    for program in programs(root):
        out += [f"## {program.title}", ""]
        if program.summary:
            out += [program.summary[:1].upper() + program.summary[1:] + ".", ""]
        out += [f"Config table `[{program.section}]`, environment `{ENV_PREFIX}{program.section.upper()}_<FLAG>` "
                f"or `{ENV_PREFIX}<FLAG>`.", "",
                "| flag | environment | config key | default | meaning |", "|---|---|---|---|---|"]
        out += ["| " + " | ".join(row) + " |" for row in option_rows(program)]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gen_config_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/configuration.md is up to date")
    args = parser.parse_args(argv)
    text = render()
    current = OUTPUT.read_text() if OUTPUT.exists() else ""
    if args.check:
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        OUTPUT.parent.mkdir(exist_ok=True)
        OUTPUT.write_text(text)
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    else:
        print(f"{OUTPUT.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
