"""Every flag of the three console scripts can also come from an environment variable or a
TOML config file (stdlib only). Precedence: command line > environment > config file > default.

- environment: SKIPPIPE_<SECTION>_<FLAG> then SKIPPIPE_<FLAG>, e.g. SKIPPIPE_PEER_STAGE=2 or
  SKIPPIPE_INITIAL_PEERS="/ip4/.../p2p/Qm... /ip4/..." (lists are split on whitespace);
- config file: --config FILE or SKIPPIPE_CONFIG=FILE; top-level keys apply to every program,
  a [peer] / [coordinator] / [swarm] table to that one only; keys are flag names
  (initial-peers or initial_peers); lists are TOML arrays, switches true/false. A top-level
  key a program lacks is skipped (one file serves all three); in its own table it is an error.
"""
import argparse
import os
import tomllib
from typing import Any

ENV_PREFIX = "SKIPPIPE_"
SECTIONS = ("peer", "coordinator", "swarm")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def port_or_off(text: str) -> int | None:
    if text.lower() in ("off", "none", ""):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or 'off', got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help=f"TOML file of settings (also {ENV_PREFIX}CONFIG); flags and "
                             f"{ENV_PREFIX}* environment variables override it")


def _config_path(argv: list[str], env) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return env.get(ENV_PREFIX + "CONFIG")


def load_file(path: str, section: str) -> tuple[dict[str, Any], set[str]]:
    """(settings for `section`, the keys that came from its own table)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    own = data.get(section, {})
    if not isinstance(own, dict):
        raise ValueError(f"config file {path}: [{section}] must be a table")
    # tables are other programs' sections ([peer], [plan], ...): never top-level settings
    merged = {k.replace("-", "_"): v for k, v in data.items() if k not in SECTIONS and not isinstance(v, dict)}
    merged.update({k.replace("-", "_"): v for k, v in own.items()})
    return merged, {k.replace("-", "_") for k in own}


def _convert(action: argparse.Action, raw: Any, where: str) -> Any:
    if action.nargs == 0:  # store_true / store_false
        flag = raw if isinstance(raw, bool) else (str(raw).lower() in _TRUE if str(raw).lower()
                                                  in _TRUE | _FALSE else None)
        if flag is None:
            raise ValueError(f"{where}: expected true or false, got {raw!r}")
        return flag if action.const is True else not flag
    many = action.nargs in ("+", "*")
    items = (raw.split() if isinstance(raw, str) else list(raw)) if many else [raw]
    if isinstance(raw, list) and not many:
        raise ValueError(f"{where}: expected one value, got a list")
    out = []
    for item in items:
        try:
            value = action.type(str(item)) if action.type else str(item)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc or f'invalid value {item!r}'}") from None
        if action.choices is not None and value not in action.choices:
            raise ValueError(f"{where}: {item!r} is not one of {', '.join(map(str, action.choices))}")
        out.append(value)
    return out if many else out[0]


def apply_settings(parser: argparse.ArgumentParser, argv: list[str], section: str,
                   env: dict | None = None) -> None:
    """Turn config-file and environment settings into `parser`'s defaults; a bad setting is a
    one-line usage error naming where it came from."""
    env = os.environ if env is None else env
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config", "version")}
    try:
        found: dict[str, tuple[Any, str]] = {}
        path = _config_path(argv, env)
        if path:
            settings, own = load_file(path, section)
            for key, value in settings.items():
                if key not in actions and key not in own:
                    continue
                if key not in actions:
                    raise ValueError(f"config file {path}: unknown setting {key!r} for {parser.prog} "
                                     f"(known: {', '.join(sorted(actions))})")
                found[key] = (value, f"config file {path}, {key}")
        for dest in actions:
            for name in (f"{ENV_PREFIX}{section.upper()}_{dest.upper()}", f"{ENV_PREFIX}{dest.upper()}"):
                if name in env:
                    found[dest] = (env[name], name)
                    break
        defaults = {dest: _convert(actions[dest], value, where) for dest, (value, where) in found.items()}
    except ValueError as exc:
        parser.error(str(exc))
    for dest in defaults:
        actions[dest].required = False  # satisfied by the environment or the file
    parser.set_defaults(**defaults)
