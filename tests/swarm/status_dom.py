"""Headless Chromium (Debian's `chromium`) and what a rendered status page drew, for the
browser test in tests/swarm/test_shared_swarm.py."""
import re
import shutil
import subprocess
from html.parser import HTMLParser

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
