"""pyproject.toml declares what the code imports, and the code uses what it declares
(issue 23: pydantic was imported undeclared; uvloop and multiaddr were declared unused)."""
import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OURS = {"protocol", "opsweb", "coordinator", "peer", "modelconfig", "tokendata", "swarmcore", "launcher"}


def third_party_imports() -> set[str]:
    found = set()
    for package in OURS:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in OURS}


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[ <>=!;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_import_is_declared_and_every_dependency_imported():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = names(project["dependencies"])
    plot = names(project["optional-dependencies"]["plot"])
    dists = packages_distributions()
    imported = {dists[m][0].lower().replace("_", "-") for m in third_party_imports()}
    assert imported <= declared | plot, f"imported but not declared: {imported - declared - plot}"
    assert declared <= imported, f"declared but never imported: {declared - imported}"
    assert plot == {"matplotlib"} and plot <= names(project["optional-dependencies"]["dev"])
    assert project["license"] == "Apache-2.0"
    assert "torch>=2.3" in project["dependencies"]


def test_setup_installs_the_tested_versions_through_constraints():
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert set(pins) == {"torch", "hivemind"}
    setup = "python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e '.[dev]'"
    assert setup in (ROOT / "README.md").read_text() and setup in (ROOT / ".ci/run").read_text()
