"""peer/progress.py: long work shows a bar in the log, short work stays silent (issue 8)."""
import logging

import pytest

from peer.progress import Progress, bar


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_short_work_logs_nothing(caplog):
    clock = Clock()
    p = Progress("building stage 1", 4, "layers", logging.getLogger("t"), clock=clock)
    with caplog.at_level(logging.INFO, "t"):
        for _ in range(4):
            clock.t += 0.1
            p.advance()
        p.finish()
    assert caplog.records == [] and p.lines == 0


def test_long_work_logs_a_throttled_bar_and_a_last_line(caplog):
    clock = Clock()
    p = Progress("copying state", 100, "MB", logging.getLogger("t"), quiet_s=1.0, every_s=3.0, clock=clock)
    with caplog.at_level(logging.INFO, "t"):
        for _ in range(50):                     # 50 updates over 10 s
            clock.t += 0.2
            p.advance(1)
        p.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert 3 <= len(lines) <= 5                 # throttled to one per 3 s, plus the last
    assert "copying state [" in lines[0] and "MB" in lines[0] and "left" in lines[0]
    assert lines[-1].startswith("copying state [" + "#" * 24 + "] 100/100 MB (100%)")


def test_bar_and_scale():
    assert bar(0.5, 10) == "[#####-----]" and bar(2.0, 4) == "[####]" and bar(-1, 2) == "[--]"
    clock = Clock()
    p = Progress("x", 2_000_000, "MB", logging.getLogger("t"), quiet_s=0, clock=clock, scale=4 / 1e6)
    p.update(1_000_000)
    assert p.lines == 1
    with pytest.raises(ValueError):
        Progress("x", 0, "", logging.getLogger("t"))
