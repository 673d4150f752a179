"""`--log-format json|text` and `--log-level` for every console script (stdlib logging only).

JSON logs are one object per line (ts, level, logger, msg, and exc when there is one), so a
log shipper can parse them without regexes."""
import argparse
import json
import logging
import sys
import time

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# hivemind renames WARNING to "WARN" on import; JSON consumers get the standard names
STANDARD_NAMES = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING",
                  logging.ERROR: "ERROR", logging.CRITICAL: "CRITICAL"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                 + f".{int(record.msecs):03d}Z", "level": STANDARD_NAMES.get(record.levelno, record.levelname),
                 "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def add_logging_flags(parser: argparse.ArgumentParser, default_level: str = "INFO") -> None:
    parser.add_argument("--log-level", default=default_level, choices=LEVELS,
                        help=f"least severe messages shown (default: {default_level})")
    parser.add_argument("--log-format", default="text", choices=FORMATS,
                        help="text for people, json for log collectors: one object per line (default: text)")


def setup_logging(level: str = "INFO", fmt: str = "text", stream=None) -> logging.Handler:
    """Replace the root logger's handlers with one that writes `fmt` to `stream` (stderr)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
