"""The package's layout rules, read from the code's own imports (every ``import``, function-level ones too).

One room per job; arrows point down only: a room imports only rooms below it in ``LAYERS``.
``protocol/`` imports neither verl nor vllm; ``server/`` imports only ``protocol/`` and itself
and is the only room that imports vllm; only ``scoring/``, ``online/``, ``plugin/`` (verl's seams)
and ``dev/`` import verl. No import cycles between modules. A file longer than ``LONG_FILE``
lines must still do one job: it is listed in ``LONG_FILES`` with that job, or split by job
(never squeezed under the bound).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from repo_paths import PACKAGE

# From the ground up: each room may import the rooms before it (and itself).
LAYERS = ["protocol", "options", "extra_info", "rows", "client", "rewards", "monitor", "replicas", "parity", "judge", "scoring",
          "weight_sync", "online", "plugin", "dev", "cli"]
SERVER_MAY_IMPORT = {"protocol"}  # nothing imports server/: it runs in its own environment
VERL_ROOMS = {"scoring", "online", "plugin", "dev"}
VLLM_ROOMS = {"server"}
LONG_FILE = 400
#: files past LONG_FILE lines that still do one job: path -> that job
LONG_FILES: dict[str, str] = {}


def modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package``."""
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str, is_package: bool) -> set[str]:
    """Every module name ``path`` imports (absolute; relative imports resolved; ``from m import x`` gives m.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(package: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> package modules it imports, module -> third-party top-level names it imports)."""
    mods = modules(package)
    inner, outer = {}, {}
    for name, path in mods.items():
        names = imports(path, name, path.name == "__init__.py")
        inner[name] = {n for n in names if n in mods and n != name}
        outer[name] = {n.split(".")[0] for n in names if n.split(".")[0] != package.name and n}
    return inner, outer


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(inner: dict[str, set[str]]) -> list[str]:
    problems = []
    for src, targets in sorted(inner.items()):
        for dst in sorted(targets):
            a, b = room(src), room(dst)
            if a == b or b == "__init__":  # the package's own __init__ defines only __version__
                continue
            if a == "server" or b == "server":
                allowed = a == "server" and b in SERVER_MAY_IMPORT
            else:
                allowed = a in LAYERS and b in LAYERS and LAYERS.index(b) < LAYERS.index(a)
            if not allowed:
                problems.append(f"{src} -> {dst} ({a}/ may not import {b}/)")
    return problems


def third_party_violations(outer: dict[str, set[str]]) -> list[str]:
    problems = []
    for src, names in sorted(outer.items()):
        if "vllm" in names and room(src) not in VLLM_ROOMS:
            problems.append(f"{src} imports vllm (only {sorted(VLLM_ROOMS)} may)")
        if "verl" in names and room(src) not in VERL_ROOMS:
            problems.append(f"{src} imports verl (only {sorted(VERL_ROOMS)} may)")
    return problems


def cycles(inner: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in inner.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(inner):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(PACKAGE)


def test_every_room_is_known(graph):
    rooms = {room(m) for m in graph[0]}
    assert rooms <= {*LAYERS, "server", "__init__"}, rooms - {*LAYERS, "server", "__init__"}


def test_arrows_point_down_only(graph):
    assert layer_violations(graph[0]) == []


def test_no_import_cycles(graph):
    assert cycles(graph[0]) == []


def test_vllm_only_in_server_and_verl_only_where_it_belongs(graph):
    assert third_party_violations(graph[1]) == []


def test_the_server_imports_only_protocol_and_itself(graph):
    inner, _ = graph
    server_deps = {room(dst) for src, dsts in inner.items() if room(src) == "server" for dst in dsts}
    assert server_deps <= {"server", "protocol"}
    assert not [src for src, dsts in inner.items() if room(src) != "server" and any(room(d) == "server" for d in dsts)]


def test_a_long_file_is_named_with_its_one_job():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LONG_FILE}
    assert set(long) <= set(LONG_FILES), f"split these by job, or name their one job in LONG_FILES: {long}"


def test_the_checks_catch_what_they_forbid(tmp_path):
    """A planted upward import, a cycle, a stray vllm/verl import and a server import are all reported
    (parity/ stands below scoring/: the client both use is in client/)."""
    pkg = tmp_path / "verl_vllm_rm"
    files = {
        "__init__.py": "",
        "protocol/__init__.py": "",
        "protocol/score.py": "import verl\nfrom verl_vllm_rm.scoring import client\n",
        "scoring/__init__.py": "",
        "scoring/client.py": "from verl_vllm_rm.parity.probe import ParityProbe\n",
        "parity/__init__.py": "",
        "parity/probe.py": "def f():\n    from ..scoring.client import X\n    import vllm\n",
        "server/__init__.py": "",
        "server/entry.py": "from verl_vllm_rm.rewards import compose\n",
        "rewards/__init__.py": "from . import compose\n",
        "rewards/compose.py": "",
        "dev/__init__.py": "",
        "dev/launch.py": "import verl_vllm_rm.server.entry\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    inner, outer = import_graph(pkg)
    assert layer_violations(inner) == [
        "verl_vllm_rm.dev.launch -> verl_vllm_rm.server.entry (dev/ may not import server/)",
        "verl_vllm_rm.parity.probe -> verl_vllm_rm.scoring.client (parity/ may not import scoring/)",
        "verl_vllm_rm.protocol.score -> verl_vllm_rm.scoring (protocol/ may not import scoring/)",
        "verl_vllm_rm.protocol.score -> verl_vllm_rm.scoring.client (protocol/ may not import scoring/)",
        "verl_vllm_rm.server.entry -> verl_vllm_rm.rewards (server/ may not import rewards/)",
        "verl_vllm_rm.server.entry -> verl_vllm_rm.rewards.compose (server/ may not import rewards/)",
    ]
    assert cycles(inner) == [["verl_vllm_rm.parity.probe", "verl_vllm_rm.scoring.client"]]
    assert third_party_violations(outer) == [
        "verl_vllm_rm.parity.probe imports vllm (only ['server'] may)",
        "verl_vllm_rm.protocol.score imports verl (only ['dev', 'online', 'plugin', 'scoring'] may)",
    ]
