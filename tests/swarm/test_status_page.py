"""Browser test: a small real swarm, its status page opened in headless Chromium (Debian's
`chromium`), checked through the rendered DOM; plus /metrics of the coordinator and a peer."""
import asyncio
import re
import shutil
import subprocess
import urllib.request
from html.parser import HTMLParser

import pytest

from tests.swarm.harness import coordinator, peers, wait_for
from tests.unit.test_status_prom import samples

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, timeout: float = 90) -> str:
    # --no-sandbox: CI runs as root; the budget lets the page fetch /api/status and draw
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--virtual-time-budget=8000", "--window-size=1280,1600", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout


class Dom(HTMLParser):
    """Counts what the page drew: rows per table body, SVG shapes by class."""

    def __init__(self):
        super().__init__()
        self.table, self.in_body, self.rows, self.cells = None, False, {}, {}
        self.shapes: dict[str, int] = {}
        self.svg = None
        self.error, self.in_error = "", False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.table = a.get("id")
        elif tag == "tbody":
            self.in_body = True
        elif tag == "tr" and self.in_body:
            self.rows.setdefault(self.table, []).append([])
        elif tag == "div" and a.get("id") == "error":
            self.in_error = True
        elif tag == "svg":
            self.svg = a.get("id")
        elif tag in ("rect", "polyline", "circle") and "class" in a:
            key = f"{self.svg}:{a['class']}"
            self.shapes[key] = self.shapes.get(key, 0) + 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self.in_body = False
        elif tag == "div":
            self.in_error = False

    def handle_data(self, data):
        if self.in_error:
            self.error += data
        if self.in_body and self.table in self.rows and data.strip():
            self.rows[self.table][-1].append(data.strip())


def metrics_url(log_path) -> str | None:
    m = re.search(r"metrics at (http://127\.0\.0\.1:\d+/)metrics", log_path.read_text(errors="replace"))
    return m.group(1) + "metrics" if m else None


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium: apt-get install -y chromium (.ci/run does)")
def test_status_page_renders_peers_stages_and_charts(tmp_path):
    async def scenario():
        async with coordinator(min_peers=3, num_stages=2, skip_ratio=0.0, max_steps=0, status_port=0) as app:
            url = app.http.url
            with peers(app, tmp_path, 3, "--metrics-port", "0"):
                await wait_for(lambda: len(app.summaries) >= 3, 200, "three iterations")
                dom_text = await asyncio.to_thread(chromium, "--dump-dom", url)
                shot = tmp_path / "status.png"
                await asyncio.to_thread(chromium, f"--screenshot={shot}", url)
                peer_metrics = metrics_url(tmp_path / "peer0.log")
                assert peer_metrics, "peer 0 did not log its metrics URL"
                peer_text = await asyncio.to_thread(lambda: urllib.request.urlopen(peer_metrics, timeout=10).read())
                coord_text = await asyncio.to_thread(lambda: urllib.request.urlopen(url + "metrics", timeout=10).read())
                return app.schedule.stage_of(), dom_text, shot, peer_text.decode(), coord_text.decode()

    stage_of, dom_text, shot, peer_text, coord_text = asyncio.run(scenario())
    dom = Dom()
    dom.feed(dom_text)
    peer_rows = dom.rows.get("peers", [])
    assert len(peer_rows) == 3 and all("ONLINE" in row for row in peer_rows), peer_rows
    # every peer's own self-test (loopback only here) and the coordinator's evidence are shown
    assert all(any(cell.endswith("self-test: local-only") for cell in row) for row in peer_rows), peer_rows
    stage_rows = dom.rows.get("stages", [])
    assert [row[0] for row in stage_rows] == ["0", "1"]
    assert sum(int(row[-1].split("/")[0]) for row in stage_rows) == len(stage_of) == 3
    assert dom.shapes.get("gantt:planned", 0) >= 3 * 2 and dom.shapes.get("gantt:measured", 0) >= 1, dom.shapes
    assert dom.shapes.get("loss-chart:series") == 1 and dom.shapes.get("loss-chart:point", 0) >= 3
    assert dom.shapes.get("time-chart:series") == 1
    assert dom.error.strip() == "" and 'data-rendered="' in dom_text   # the page's own error line is empty
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    peer = samples(peer_text)
    assert peer["skippipe_peer_up"] == 1 and peer["skippipe_peer_reachable"] == 1
    assert peer['skippipe_peer_microbatches_total{outcome="completed"}'] > 0 or peer["skippipe_peer_stage"] != 0
    assert peer["skippipe_peer_bytes_sent_total"] > 0 and peer['skippipe_peer_rpc_seconds_count{outcome="ok"}'] > 0
    assert peer["skippipe_peer_memory_rss_bytes"] > 10 * 2**20
    coord = samples(coord_text)
    assert coord["skippipe_coordinator_iterations_total"] >= 3 and coord['skippipe_coordinator_peers{state="online"}'] == 3
