"""Progress of long work (building a large stage, copying a replica's state) as log lines
with a bar, so an operator watching a big model start can tell slow from stuck:
nothing for work that ends within `quiet_s`, then at most one line every `every_s`, and a
last line when it is done. Log lines, not terminal tricks, so it reads the same in a file,
in `--log-format json` and on a terminal."""
import logging
import time
from typing import Callable

WIDTH = 24


def bar(fraction: float, width: int = WIDTH) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class Progress:
    def __init__(self, what: str, total: float, unit: str, logger: logging.Logger,
                 quiet_s: float = 1.0, every_s: float = 3.0, clock: Callable[[], float] = time.monotonic,
                 scale: float = 1.0):
        if total <= 0:
            raise ValueError("total must be positive")
        self.what, self.total, self.unit, self.logger = what, total, unit, logger
        self.quiet_s, self.every_s, self.clock, self.scale = quiet_s, every_s, clock, scale
        self.done = 0.0
        self.started = clock()
        self._last_line: float | None = None
        self.lines = 0

    def advance(self, amount: float = 1.0) -> None:
        self.update(self.done + amount)

    def update(self, done: float) -> None:
        self.done = min(done, self.total)
        now = self.clock()
        if now - self.started < self.quiet_s:
            return
        if self._last_line is None or now - self._last_line >= self.every_s:
            self._line(now)

    def finish(self) -> None:
        """A closing line, only if progress was shown at all (short work stays silent)."""
        if self._last_line is not None:
            self.done = self.total
            self._line(self.clock())

    def _line(self, now: float) -> None:
        elapsed = now - self.started
        fraction = self.done / self.total
        left = f", ~{elapsed * (1 - fraction) / fraction:.0f}s left" if 0 < fraction < 1 else ""
        self.logger.info("%s %s %s/%s %s (%.0f%%), %.0fs%s", self.what, bar(fraction),
                         _num(self.done * self.scale), _num(self.total * self.scale), self.unit,
                         100 * fraction, elapsed, left)
        self._last_line = now
        self.lines += 1


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 or x == int(x) else f"{x:.1f}"
