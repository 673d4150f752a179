"""Enforce the dependency direction of docs/architecture ("Dependency direction") with a small
AST check: every import statement (module level or inside functions, absolute or relative,
plus importlib.import_module / __import__ with a literal name) of every source file under
protocol/, coordinator/ and peer/ is resolved to an absolute module name and checked against
the rules below.

    protocol/             stdlib + msgpack + cryptography (the organiser's signature) only; nothing of ours;
                          no asyncio (nor torch, hivemind, numpy)
    coordinator/planner/  protocol + stdlib + numpy + itself; no asyncio, torch, hivemind, peer,
                          nor any coordinator.* module outside coordinator.planner
    coordinator/          never peer, never torch
    peer/                 never coordinator
    peer/compute/         no hivemind, no asyncio, no networking; no peer.* outside peer.compute
    modelconfig/          stdlib only, nothing of ours (model architectures, shared by both sides)
    opsweb/               stdlib (+ uvloop, multiaddr) only, nothing of ours (what coordinator/ and
                          peer/ share to run as services: the HTTP server + Prometheus text, clean
                          stops and the event loop, multiaddr flags; asyncio allowed, unlike protocol/)
    tokendata/            stdlib + numpy + tokenizers + regex + pyarrow + protocol + itself (tokenizers,
                          token datasets and the sample cursor, shared by coordinator/ and peer/):
                          no torch, nothing else of ours; only tokendata.transfer (dataset files
                          over P2P) uses hivemind
    swarmcore/            what peer/, coordinator/ and the launcher share (DHT record layer, path
                          rules, schedule history, run flags, CLI conventions): protocol + itself
                          of ours; only swarmcore.dht uses hivemind (and pydantic); the rest is
                          stdlib + protocol, so the pure planner may use swarmcore.path_rules
    launcher/             `skippipe-swarm`: may use every package of ours, never torch; nothing
                          imports it

Every top-level package is covered (test_every_top_level_package_is_checked), and no package
has an import cycle among its modules (test_no_import_cycle_inside_a_package): imports inside
functions and under TYPE_CHECKING count, since they couple the modules all the same.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path



ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("protocol", "coordinator", "peer", "opsweb", "tokendata", "modelconfig", "swarmcore", "launcher")
STDLIB = frozenset(sys.stdlib_module_names)
NETWORKING = {"socket", "ssl", "http", "urllib", "asyncio", "selectors", "socketserver",
              "hivemind", "grpc", "aiohttp", "requests", "httpx", "multiaddr", "zmq", "uvloop", "opsweb"}


# ---------------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    module: str          # absolute dotted name, e.g. "coordinator.planner.costs"
    line: int

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def within(self, package: str) -> bool:
        return self.module == package or self.module.startswith(package + ".")


def module_name(path: Path, root: Path = ROOT) -> tuple[str, bool]:
    """'coordinator/planner/paths.py' -> ('coordinator.planner.paths', False);
    '.../__init__.py' -> (package name, True)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def imports_of(source: str, module: str, is_package: bool = False,
               known_modules: frozenset[str] = frozenset()) -> list[Import]:
    """Every module `source` imports, as absolute names. `from pkg import name` counts as
    importing pkg.name when that is a module of ours (so `from coordinator import config` is
    seen as coordinator.config), else as importing pkg."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                if node.level - 1 > len(base_parts) - 1:
                    found.append(Import(f"<relative import beyond top level: level {node.level}>",
                                        node.lineno))
                    continue
                base = ".".join(base_parts[:len(base_parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known_modules]
            found += [Import(s, node.lineno) for s in subs]
            if len(subs) < len(node.names):
                found.append(Import(base, node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append(Import(node.args[0].value, node.lineno))
    return found


def _ours(imp: Import) -> bool:
    return imp.top in PACKAGES


def rule_problems(module: str, imp: Import) -> list[str]:
    """The rules of architecture.md, as (module doing the import, what it imports) -> problems."""
    problems = []
    if imp.module.startswith("<"):
        return [imp.module]

    def bad(why):
        problems.append(f"imports {imp.module}: {why}")

    if module == "protocol" or module.startswith("protocol."):
        if _ours(imp) and imp.top != "protocol":
            bad("protocol/ imports nothing of ours")
        elif imp.top == "asyncio":
            bad("protocol/ uses no asyncio")
        elif imp.top not in STDLIB and imp.top not in ("msgpack", "cryptography", "protocol"):
            bad("protocol/ depends on the standard library, msgpack and cryptography only")
    if module.startswith("coordinator.planner"):
        if imp.top == "asyncio":
            bad("the planner is pure: no asyncio")
        elif imp.top == "coordinator" and not imp.within("coordinator.planner") \
                and imp.module != "coordinator":
            bad("the planner imports no coordinator module outside coordinator.planner")
        elif imp.top == "swarmcore" and not imp.within("swarmcore.path_rules"):
            bad("the planner uses only the pure swarmcore.path_rules of swarmcore/")
        elif imp.top not in STDLIB and imp.top not in ("numpy", "protocol", "coordinator", "swarmcore"):
            bad("the planner depends only on protocol, the standard library and numpy")
    if module == "coordinator" or module.startswith("coordinator."):
        if imp.top == "peer":
            bad("coordinator/ never imports peer/")
        if imp.top == "torch":
            bad("coordinator/ never imports torch")
    if module == "peer" or module.startswith("peer."):
        if imp.top == "coordinator":
            bad("peer/ never imports coordinator/")
    if module == "opsweb" or module.startswith("opsweb."):
        if _ours(imp) and imp.top != "opsweb":
            bad("opsweb/ imports nothing of ours")
        elif imp.top not in STDLIB and imp.top not in ("opsweb", "uvloop", "multiaddr"):
            bad("opsweb/ depends on the standard library, uvloop and multiaddr only")
    if module == "modelconfig" or module.startswith("modelconfig."):
        if imp.top not in STDLIB and imp.top != "modelconfig":
            bad("modelconfig/ depends on the standard library only (the coordinator reads it)")
    if module == "tokendata" or module.startswith("tokendata."):
        if _ours(imp) and imp.top not in ("tokendata", "protocol"):
            bad("tokendata/ imports nothing of ours but protocol/")
        elif imp.top == "hivemind" and module != "tokendata.transfer":
            bad("only tokendata.transfer uses hivemind")
        elif imp.top not in STDLIB and imp.top not in ("numpy", "tokenizers", "pyarrow", "regex", "tokendata",
                                                       "protocol", "hivemind"):
            bad("tokendata/ depends on the standard library, numpy, tokenizers, regex, pyarrow and protocol only")
    if module == "swarmcore" or module.startswith("swarmcore."):
        if _ours(imp) and imp.top not in ("swarmcore", "protocol"):
            bad("swarmcore/ imports nothing of ours but protocol/")
        elif module.startswith("swarmcore.dht"):
            if imp.top not in STDLIB and imp.top not in ("swarmcore", "protocol", "hivemind", "pydantic"):
                bad("swarmcore.dht depends on the standard library, hivemind, pydantic and protocol only")
        elif imp.top not in STDLIB and imp.top not in ("swarmcore", "protocol"):
            bad("swarmcore/ outside swarmcore.dht depends on the standard library and protocol only")
        elif imp.top == "swarmcore" and imp.within("swarmcore.dht"):
            bad("only swarmcore.dht uses the DHT layer inside swarmcore/ (the rest stays hivemind-free)")
    if imp.top == "launcher" and not (module == "launcher" or module.startswith("launcher.")):
        bad("nothing imports the launcher")
    if (module == "launcher" or module.startswith("launcher.")) and imp.top == "torch":
        bad("the launcher never imports torch")
    if module.startswith("peer.compute"):
        if imp.top in NETWORKING:
            bad("peer/compute/ has no hivemind, no asyncio, no networking")
        elif imp.top == "peer" and not imp.within("peer.compute") and imp.module != "peer":
            bad("peer/compute/ depends on torch and protocol only, not on the rest of peer/")
    return problems


def check_source(source: str, module: str, is_package: bool = False,
                 known_modules: frozenset[str] = frozenset()) -> list[str]:
    return [f"{module}:{imp.line}: {p}"
            for imp in imports_of(source, module, is_package, known_modules)
            for p in rule_problems(module, imp)]


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES if (root / pkg).is_dir() for p in (root / pkg).rglob("*.py"))


def known_modules_of(files: list[Path], root: Path = ROOT) -> frozenset[str]:
    return frozenset(module_name(p, root)[0] for p in files)


def top_level_packages(root: Path = ROOT) -> set[str]:
    """Every folder at the top with an __init__.py; tests/ and tools/ (developer scripts, not
    installed) aside."""
    return {p.parent.name for p in root.glob("*/__init__.py")} - {"tests", "tools"}


def import_graph(files: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of its own top-level package that it imports."""
    known = known_modules_of(files, root)
    graph: dict[str, set[str]] = {}
    for path in files:
        module, is_package = module_name(path, root)
        top = module.split(".")[0]
        graph[module] = {imp.module for imp in imports_of(path.read_text(encoding="utf-8"), module, is_package, known)
                         if imp.module in known and imp.top == top and imp.module != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles

