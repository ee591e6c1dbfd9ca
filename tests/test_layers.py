"""The import structure stays clean: the layers import only downward, no import cycles
(imports inside functions count), kernels/ imports nothing else of the project, and no module
imports another's private name. The installed wheel holds one top-level package, flashcheck,
with the data the suite needs."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Source folders and the subpackage of `flashcheck` each becomes (pyproject's package-dir).
PACKAGES = {
    "api": "flashcheck",
    "harness": "flashcheck.harness",
    "kernels": "flashcheck.kernels",
    "properties": "flashcheck.properties",
}
IMPORTERS = ("tests", "benchmarks")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    for folder in IMPORTERS:
        for path in (ROOT / folder).rglob("*.py"):
            out[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    return out


def _imports(path: Path, module: str):
    """(target module, imported name or None, line) for every import, nested ones included."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            for alias in node.names:
                yield base, alias.name, node.lineno


def _owner(target: str, modules: dict[str, Path]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _graph():
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    problems = []
    for mod, path in modules.items():
        for target, name, line in _imports(path, mod):
            full = f"{target}.{name}" if name else target
            dest = _owner(full, modules)
            if dest is None or dest == mod:
                continue
            graph[mod].add(dest)
            where = f"{path.relative_to(ROOT)}:{line}"
            if mod.startswith("flashcheck.kernels") and not dest.startswith("flashcheck.kernels"):
                problems.append(f"{where}: kernels/ imports {dest}")
            private = name and name.startswith("_") and not name.startswith("__")
            if private and full not in modules and not path.name.startswith("test_"):
                problems.append(f"{where}: imports private name {name} from {dest}")
    return graph, problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# The layers, from the bottom: a module imports only from its own layer or the layers before it.
# Semantics and formats; the oracle and the cases built on them; the numerics that judge an
# output (metrics, bounds, verdict); kernel contracts (registry, probing, the kernel worker); the
# checks of one kernel on one case; the campaign and the bench that run many checks; the CLI,
# the pytest plugin and the public API on top. kernels/ stands alone below all of them.
LAYERS = (
    ("flashcheck.kernels",),
    ("flashcheck.harness.core",),
    ("flashcheck.harness.oracle", "flashcheck.harness.cases", "flashcheck.harness.iomodel"),
    ("flashcheck.harness.judging",),
    ("flashcheck.harness.adapters",),
    ("flashcheck.harness.checks",),
    ("flashcheck.harness.campaign", "flashcheck.harness.bench"),
    ("flashcheck.harness.cli", "flashcheck.properties"),
    ("flashcheck", "flashcheck.strategies"),  # the public API (api/): these modules exactly
)
API = LAYERS[-1]
# harness/__init__.py only names the package; it imports nothing and sits at the bottom.
PACKAGE_ROOTS = {"flashcheck.harness": 1}


def _layer(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (the longest matching prefix), or ``None`` for
    modules outside the package (tests, benchmarks)."""
    if module in API:
        return len(LAYERS) - 1
    if module in PACKAGE_ROOTS:
        return PACKAGE_ROOTS[module]
    best = None
    for i, prefixes in enumerate(LAYERS[:-1]):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (i, prefix)
    return None if best is None else best[0]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    out = []
    for mod, targets in sorted(graph.items()):
        low = _layer(mod)
        if low is None:
            continue
        for dest in sorted(targets):
            high = _layer(dest)
            if high is not None and high > low:
                out.append(f"{mod} (layer {low}) imports {dest} (layer {high})")
    return out


def test_every_package_module_has_a_layer():
    graph, _ = _graph()
    package = [m for m in _modules() if m.startswith("flashcheck")]
    assert [m for m in package if _layer(m) is None] == []
    assert graph  # the graph is not empty: the test sees the imports


def test_layers_import_only_downward():
    graph, _ = _graph()
    assert _upward(graph) == []


def test_layer_check_finds_a_planted_upward_import():
    planted = {
        "flashcheck.harness.judging.verdict": {"flashcheck.harness.adapters.registry"},
        "flashcheck.harness.checks.accuracy": {"flashcheck.harness.judging.verdict"},
        "tests.test_x": {"flashcheck.harness.cli"},
    }
    assert _upward(planted) == [
        "flashcheck.harness.judging.verdict (layer 3) imports "
        "flashcheck.harness.adapters.registry (layer 4)"
    ]


def test_no_import_cycles():
    graph, _ = _graph()
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_kernels_stand_alone_and_no_private_names_cross_modules():
    _, problems = _graph()
    assert problems == []


def test_wheel_holds_one_top_level_package_with_its_data(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("flashcheck-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "flashcheck",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    needed = (
        "__init__.py",
        "strategies.py",
        "harness/cli/__init__.py",
        "kernels/triton_flash.py",
        "properties/plugin.py",
        "properties/suite.ini",
    )
    for name in needed:
        assert f"flashcheck/{name}" in names
    assert any(
        n.startswith("flashcheck/properties/regressions/") and n.endswith(".npz") for n in names
    )
    meta = next(n for n in names if n.endswith("entry_points.txt"))
    entry = zipfile.ZipFile(wheel).read(meta).decode()
    assert "flashcheck = flashcheck.harness.cli:main" in entry
    assert "[pytest11]" in entry and "flashcheck.properties.plugin" in entry
