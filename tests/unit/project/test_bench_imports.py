"""Nothing in bench/ imports tests/: what a benchmark needs lives in the product or in bench/
itself (bench/support/), and the tests import it from there."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def uses_of_tests(source: str) -> list[str]:
    """Imports of tests.* and module names like "tests.x" (e.g. `python -m tests.x`) in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "tests":
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tests."):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_uses_of_tests_are_found():
    source = 'import tests.x\nfrom tests.swarm import y\nimport subprocess\nsubprocess.run(["-m", "tests.swarm.rogue"])\n'
    assert len(uses_of_tests(source)) == 3
    assert uses_of_tests("from bench.support import rogue\nimport testsuite\n'see tests/'\n") == []


def test_nothing_in_bench_imports_tests():
    files = sorted((ROOT / "bench").rglob("*.py"))
    assert files
    found = {str(f.relative_to(ROOT)): uses for f in files if (uses := uses_of_tests(f.read_text()))}
    assert not found, f"bench/ uses tests/ (move what it needs into bench/support/ or the product): {found}"
