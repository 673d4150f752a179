"""Conventions shared by every console script (stdlib only): one-line errors, exit codes.

Lives in protocol/ because peer/ and coordinator/ may not import each other, and the
user-facing contract ("bad flag -> one line on stderr, exit 2") is part of the interface.
"""
import argparse
import sys

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
