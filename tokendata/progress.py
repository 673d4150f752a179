"""Progress on stderr: 'label: 123.4 MB (5.6 MB/s)', rewritten in place at most twice a second."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, stream=None, interval_s: float = 0.5):
        self.label, self.stream, self.interval = label, stream or sys.stderr, interval_s
        self.start = self.last = time.monotonic()
        self.done, self.shown = 0, False

    def __call__(self, done: int) -> None:
        self.done = done
        if time.monotonic() - self.last >= self.interval:
            self._show("")

    def rate(self) -> float:
        return self.done / 1e6 / max(time.monotonic() - self.start, 1e-9)

    def close(self, final: bool = True) -> None:
        """The final figure on its own line (final) or just end the line (before an error)."""
        if final:
            self._show("\n")
        elif self.shown:
            print(file=self.stream, flush=True)

    def _show(self, end: str) -> None:
        self.last, self.shown = time.monotonic(), True
        print(f"\r{self.label}: {self.done / 1e6:,.1f} MB ({self.rate():.1f} MB/s)", end=end,
              file=self.stream, flush=True)
