"""The package's import graph, built from the source: imports point down the layers, and never in a circle.

Every ``import`` / ``from ... import`` (and ``importlib.import_module("splatloss...")``) of every
module under ``splatloss/`` counts, at module level and inside functions alike (an import moved into
a function still runs), relative imports resolved.
Only imports of splatloss itself form the graph; optional third-party dependencies (Triton,
Lightning, gsplat, ...) are not part of it. ``import splatloss`` itself must stay light: checked in a
fresh interpreter.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "splatloss"

# Layers, bottom first: a module may import its own layer or any layer below, never one above.
# ``splat`` sits below ``lightning`` so that the LightningModule may use scenes and renderers, never
# the other way round; the package root re-exports the public API of ``losses`` / ``compat`` /
# ``functional``, so it is that layer's facade.
LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("config", ("splatloss.config", "splatloss.atomic", "splatloss.extras")),
    ("checks / filtering", ("splatloss.checks", "splatloss.filtering")),
    ("multiscale", ("splatloss.multiscale",)),
    ("backends / reference", ("splatloss.backends", "splatloss.reference")),
    ("functional", ("splatloss.functional",)),
    ("conventions", ("splatloss.conventions",)),
    ("losses / compat / rays", ("splatloss.losses", "splatloss.compat", "splatloss.rays", "splatloss")),
    ("splat", ("splatloss.splat",)),
    ("lightning", ("splatloss.lightning",)),
    ("train", ("splatloss.train", "splatloss.__main__", "splatloss.evaluate")),
]


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> Dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _resolve_from(mod: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_package else mod.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root: Path) -> Dict[str, Set[str]]:
    """Module -> the splatloss modules it imports (anywhere in its body)."""
    mods = modules(root)
    top = root.name
    graph: Dict[str, Set[str]] = {}
    for mod, path in mods.items():
        is_package = path.name == "__init__.py"
        targets: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(mod, is_package, node)
                # ``from pkg import sub`` imports the module pkg.sub when there is one, else names of pkg
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names = [node.args[0].value]  # importlib.import_module("splatloss...."): a lazy import too
            else:
                continue
            for name in names:
                if name == top or name.startswith(top + "."):
                    while name not in mods:  # e.g. ``import splatloss.backends.triton.ssim`` of a non-module
                        name = name.rsplit(".", 1)[0]
                    if name != mod:
                        targets.add(name)
        graph[mod] = targets
    return graph


def layer_of(mod: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    out = []
    for mod, targets in sorted(graph.items()):
        for t in sorted(targets):
            if layer_of(t) > layer_of(mod):
                out.append(f"{mod} ({LAYERS[layer_of(mod)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})")
    return out


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    unplaced = [m for m in modules(PACKAGE) if layer_of(m) < 0]
    assert not unplaced, f"put these modules in a layer of LAYERS: {unplaced}"


@pytest.mark.slow
def test_imports_point_down_the_layers():
    bad = upward_imports(imports(PACKAGE))
    assert not bad, "upward imports:\n" + "\n".join(bad)


@pytest.mark.slow
def test_no_import_cycles():
    found = cycles(imports(PACKAGE))
    assert not found, f"import cycles (function-level imports included): {found}"


def test_the_checker_sees_function_level_relative_imports_and_cycles(tmp_path):
    """The checker itself: a function-level relative import that closes a cycle and points up."""
    pkg = tmp_path / "splatloss"
    (pkg / "backends").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "functional.py").write_text("from .backends import torch_fused\n")
    (pkg / "backends" / "__init__.py").write_text("")
    (pkg / "backends" / "torch_fused.py").write_text("def f():\n    from .. import functional\n")
    (pkg / "backends" / "lazy.py").write_text(
        "import importlib\nimportlib.import_module('splatloss.backends.torch_fused')\n"
    )
    graph = imports(pkg)
    assert graph["splatloss.backends.torch_fused"] == {"splatloss.functional"}
    assert graph["splatloss.backends.lazy"] == {"splatloss.backends.torch_fused"}
    assert cycles(graph) == [["splatloss.backends.torch_fused", "splatloss.functional"]]
    assert upward_imports(graph) == [
        "splatloss.backends.torch_fused (backends / reference) imports splatloss.functional (functional)"
    ]


@pytest.mark.parametrize(
    "statement",
    ["import splatloss", "import splatloss, torch; splatloss.ssim(torch.rand(1, 1, 12, 12), torch.rand(1, 1, 12, 12))"],
)
@pytest.mark.slow
def test_import_splatloss_imports_no_heavy_optional_dependency(statement):
    heavy = ("triton", "lightning", "pytorch_lightning", "hydra", "omegaconf", "gsplat", "numba")
    code = f"import sys; {statement}; print([m for m in {heavy!r} if m in sys.modules])"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]", res.stdout
