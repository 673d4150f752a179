"""The README stays a short entry point, and the links between README.md and docs/ resolve
(files and #anchors), so moving a section does not leave dead links behind."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move detail into docs/"


def test_anchor_slugs():
    assert anchors("## Multi-host swarm in network namespaces (`bench/multihost.py`)\n") == \
        {"multi-host-swarm-in-network-namespaces-benchmultihostpy"}
    assert anchors("## Models, checkpoints and export\n") == {"models-checkpoints-and-export"}


def test_relative_links_resolve():
    dead = []
    for doc in DOCS:
        text = doc.read_text()
        for target in LINK.findall(text):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                dead.append(f"{doc.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                dead.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not dead, dead
