"""The layout's promises: data flows one way through layers that import only downwards,
no module on the processing path is over 400 lines, settings import alone, and no
module imports itself back."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agents", "analytics", "app", "delivery", "pairing", "tables", "tools", "web")
# The processing path, lowest layer first: a module imports only from its own layer or
# below. A module takes the layer of its longest prefix here.
LAYERS: dict[str, int] = {
    "pairing": 0,  # the rules: pure
    "delivery.rules": 0,
    "app.settings": 1,  # configuration and Kafka administration
    "app.kafka": 1,
    "delivery.client": 1,
    "delivery.latency": 1,
    "app.exactly_once": 2,  # the core
    "app.health": 2,  # when a worker is ready and alive: rules over its facts
    "delivery.dispatcher": 2,
    "app.faust_app": 3,  # the one app and its topics
    "app.worker": 3,
    "app.topics": 3,
    "tables": 4,  # state, declared
    "delivery.store": 4,
    "agents": 5,  # the stages
    "delivery.agent": 5,
    "delivery": 5,
    "web": 6,  # reads what the stages hand it
    "app.main": 7,  # assembles it all
    "app": 7,  # the package: `faust -A app` loads app.main from it
}
PROCESSING_PATH_MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_at_load(path: Path, known: set[str]) -> set[str]:
    """Project modules a module imports when it is loaded (top-level statements only:
    an import inside a function runs later, and cannot form a cycle at load time)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            # Importing app.topics runs app/__init__.py first.
            parts = name.split(".")
            found.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return found & known - {module_name(path)}


def imports_anywhere(path: Path, known: set[str]) -> set[str]:
    """Project modules a module imports anywhere: at load, in functions, for typing."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & known - {module_name(path)}


def layer(module: str) -> int | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(imports.items()):
        own = layer(module)
        if own is None:
            continue
        for target in sorted(targets):
            # A package's __init__ is loaded with its modules: only its own layer counts.
            there = layer(target)
            if there is None or (there > own and not module.startswith(target + ".")):
                found.append(f"{module} -> {target}")
    return found


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    paths = modules()
    return {name: imports_at_load(path, set(paths)) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    graph = import_graph()
    assert {"app.main", "agents.ingest", "app.settings"} <= set(graph)
    assert find_cycle(graph) == []


def test_settings_and_analytics_import_without_the_app() -> None:
    code = (
        "import sys, app.settings, analytics.lake, analytics.jobs\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('faust', 'agents', 'tables')"
        " or m in ('app.faust_app', 'app.main')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_worker_imports_nothing_of_the_analytics_extra() -> None:
    """Its image installs the project without pyspark, delta-spark and matplotlib."""
    code = (
        "import sys, app.main\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('pyspark', 'delta', 'matplotlib', 'numpy', 'analytics')))"
    )
    every_stage = {
        f"PAIRSTREAM_{part}_ENABLED": "true" for part in ("DELIVERY", "ENRICHMENT", "CHAIN")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, **every_stage},
    )  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_the_analytics_cli_without_its_extra_says_what_to_install() -> None:
    code = "import runpy, sys; sys.modules['pyspark'] = None; runpy.run_module('analytics')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 1
    assert "needs the analytics extra: pip install '.[analytics]'" in out.stderr


def test_the_layer_check_finds_an_upward_import() -> None:
    assert upward_imports({"app.exactly_once.step": {"agents.ingest"}}) == [
        "app.exactly_once.step -> agents.ingest"
    ]
    assert upward_imports({"pairing.rules": {"tools.generate"}}) == [
        "pairing.rules -> tools.generate"
    ]
    assert upward_imports({"web.pages": {"agents.pairing", "app.settings"}}) == []


def test_the_processing_path_imports_only_downwards() -> None:
    paths = modules()
    imports = {name: imports_anywhere(path, set(paths)) for name, path in paths.items()}
    assert {"app.exactly_once.step", "web.pages", "delivery.agent"} <= set(imports)
    assert upward_imports(imports) == []


# Declarations, not logic: all configuration stays in one module however many settings.
UNLIMITED = {"app.settings"}


def test_no_module_on_the_processing_path_is_over_the_limit() -> None:
    long = {
        name: lines
        for name, path in modules().items()
        if layer(name) is not None
        and name not in UNLIMITED
        and (lines := len(path.read_text().splitlines())) > PROCESSING_PATH_MAX_LINES
    }
    assert long == {}
