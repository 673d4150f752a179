"""Conventions shared by every console script: one-line errors, exit codes, the argument
types the three scripts share (run names, model names, skip ratios, folders), --version.

Shared here because peer/ and coordinator/ may not import each other; the user-facing
contract is "bad flag -> one line on stderr, exit 2". Stdlib and protocol only (the multiaddr check, which needs the multiaddr package, is opsweb/addresses.py).
"""
import argparse
import math
import sys

from protocol.errors import FieldError
from protocol.ids import check_run_name
from protocol.messages import MAX_LEARNING_RATE
from protocol.signing import split_run_address
from protocol.version import package_version

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (plus a pointer to --help), exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog.split()[0]} --help)\n")
        sys.exit(EXIT_USAGE)


def fail_usage(prog: str, message: str) -> int:
    """Print a one-line usage error and return the usage exit code."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    return EXIT_USAGE


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def learning_rate(text: str) -> float:
    """The run spec's bound (protocol/messages.py), checked where the flag is parsed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and 0.0 < value <= MAX_LEARNING_RATE):
        raise argparse.ArgumentTypeError(f"must be in (0, {MAX_LEARNING_RATE:g}], got {text}")
    return value


DEFAULT_SKIP = "1/3"   # the paper's k; the coordinator, skippipe-swarm and `plan` all default to it


def run_name(text: str) -> str:
    try:
        return check_run_name(text)
    except (FieldError, ValueError) as exc:
        raise argparse.ArgumentTypeError(getattr(exc, "problem", None) or str(exc)) from None


def run_address(text: str) -> tuple[str, str]:
    """--run NAME or NAME@KEY (the organiser key to pin, as the coordinator prints it):
    (name, key or "")."""
    try:
        name, key = split_run_address(text)
        return check_run_name(name), key or ""
    except (FieldError, ValueError) as exc:
        raise argparse.ArgumentTypeError(getattr(exc, "problem", None) or str(exc)) from None


def folder_problem(path, flag: str) -> str | None:
    """Why `path` cannot serve as a folder we write into (created if missing), or None: so a
    cache or checkpoint folder fails as one line at start-up, not as a traceback later."""
    import os
    import tempfile
    from pathlib import Path
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{flag} {path} cannot be written ({exc.strerror or exc}); pick a folder you can write to"
    return None


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")


def skip_ratio(text: str) -> float:
    """Parse a skip ratio: a float or a fraction like 1/3; must lie in [0, 1)."""
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            value = float(num) / float(den)
        else:
            value = float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a number or fraction: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"skip ratio must be in [0, 1), got {text}")
    return value
