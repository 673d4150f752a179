"""opsweb.prom: hand-written Prometheus text exposition."""
import math
import re

import pytest

from opsweb.prom import Exposition, Histogram, process_rss_bytes

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')


def samples(text: str) -> dict[str, float]:
    """A strict reader of the text format: every non-comment line must be `name{labels} value`."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* \S", line), line
            continue
        m = SAMPLE.match(line)
        assert m, f"not a valid sample line: {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(4).replace("Inf", "inf"))
    return out


def test_histogram_buckets_are_cumulative():
    h = Histogram(buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 3.0):
        h.observe(v)
    e = Exposition()
    e.histogram("x_seconds", "test", h, {"outcome": "ok"})
    got = samples(e.render())
    assert got['x_seconds_bucket{outcome="ok",le="0.1"}'] == 1
    assert got['x_seconds_bucket{outcome="ok",le="1.0"}'] == 3
    assert got['x_seconds_bucket{outcome="ok",le="+Inf"}'] == 4 == got['x_seconds_count{outcome="ok"}']
    assert got['x_seconds_sum{outcome="ok"}'] == pytest.approx(4.25)


def test_families_declared_once_and_labels_escaped():
    e = Exposition()
    e.counter("m_total", "by outcome", 3, {"outcome": "a"})
    e.counter("m_total", "by outcome", 4, {"outcome": 'we"ird\\name\n'})
    text = e.render()
    assert text.count("# TYPE m_total counter") == 1
    assert 'm_total{outcome="we\\"ird\\\\name\\n"} 4' in text
    assert samples(text)['m_total{outcome="a"}'] == 3


def test_special_values():
    e = Exposition()
    e.gauge("g", "nan", float("nan"))
    e.gauge("h", "inf", float("inf"))
    e.gauge("b", "bool", True)
    text = e.render()
    assert "g NaN" in text and "h +Inf" in text and "b 1" in text
    assert math.isnan(samples(text)["g"])


@pytest.mark.parametrize("call", [
    lambda e: e.gauge("bad-name", "x", 1),
    lambda e: e.counter("no_suffix", "x", 1),
    lambda e: e.gauge("ok", "x", 1, {"bad-label": "v"}),
])
def test_invalid_names_are_refused(call):
    with pytest.raises(ValueError):
        call(Exposition())


def test_rss_is_plausible():
    assert 10 * 2**20 < process_rss_bytes() < 64 * 2**30
