"""Prometheus text exposition format (version 0.0.4), written by hand: gauges, counters and
histograms with labels. https://prometheus.io/docs/instrumenting/exposition_formats/"""
import math
import os
import re
import resource

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """Cumulative-bucket histogram; observe() is O(buckets), fine for per-RPC use."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S):
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * len(self.buckets)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


def _value(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "+Inf" if v > 0 else "-Inf"
        return repr(v)
    return str(int(v))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str] | None) -> str:
    if not labels:
        return ""
    for key in labels:
        if not _LABEL.match(key):
            raise ValueError(f"bad Prometheus label name {key!r}")
    escaped = (f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


class Exposition:
    """Collects metric families in order and renders them; each family's HELP/TYPE once."""

    def __init__(self):
        self._lines: list[str] = []
        self._families: set[str] = set()

    def _family(self, name: str, kind: str, help_text: str) -> None:
        if not _NAME.match(name):
            raise ValueError(f"bad Prometheus metric name {name!r}")
        if name not in self._families:
            self._families.add(name)
            self._lines += [f"# HELP {name} {help_text.replace(chr(10), ' ')}", f"# TYPE {name} {kind}"]

    def gauge(self, name: str, help_text: str, value: float, labels: dict | None = None) -> None:
        self._family(name, "gauge", help_text)
        self._lines.append(f"{name}{_labels(labels)} {_value(value)}")

    def counter(self, name: str, help_text: str, value: float, labels: dict | None = None) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        self._family(name, "counter", help_text)
        self._lines.append(f"{name}{_labels(labels)} {_value(value)}")

    def histogram(self, name: str, help_text: str, hist: Histogram, labels: dict | None = None) -> None:
        self._family(name, "histogram", help_text)
        base = dict(labels or {})
        for bound, count in zip(hist.buckets, hist.counts):
            self._lines.append(f"{name}_bucket{_labels({**base, 'le': _value(float(bound))})} {count}")
        self._lines.append(f"{name}_bucket{_labels({**base, 'le': '+Inf'})} {hist.count}")
        self._lines.append(f"{name}_sum{_labels(base)} {_value(float(hist.sum))}")
        self._lines.append(f"{name}_count{_labels(base)} {hist.count}")

    def render(self) -> str:
        return "\n".join(self._lines) + "\n"


def process_rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; elsewhere the peak, from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
