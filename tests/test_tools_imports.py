"""tools/ is a package whose modules import one another in one direction only, through the package.

Every ``import`` / ``from ... import`` / ``importlib.import_module("...")`` of every ``tools/*.py``
counts, at module level and inside functions alike (an import moved into a function still runs).
An import of a tools module by its bare name (``import sass_cost``) resolves only while tools/
itself is on ``sys.path``; it counts as an edge of the graph too, so a circle spelled that way is
still a circle. Each tool also still runs as the script the docs name (``python tools/x.py``),
which puts tools/, not the repository root, on ``sys.path``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Set

import pytest
from test_import_graph import cycles

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"


class Edge(NamedTuple):
    source: str  # the importing module's name in tools/
    target: str  # the imported module's name in tools/
    line: int
    bare: bool  # spelled without the package (``import sass_cost``)


def _target(name: str, mods: Set[str]):
    """(tools module, spelled bare) that an absolute module name ``name`` imports, or None."""
    parts = name.split(".")
    if parts[0] == "tools":
        return (parts[1], False) if len(parts) > 1 and parts[1] in mods else None
    return (parts[0], True) if parts[0] in mods else None


def tool_edges(folder: Path) -> List[Edge]:
    """The imports of tools modules by the modules of ``folder`` (a tools/ folder)."""
    mods = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    edges: List[Edge] = []
    for path in sorted(folder.glob("*.py")):
        source = path.stem
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            found = []
            if isinstance(node, ast.Import):
                found = [_target(a.name, mods) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:  # ``from . import x`` / ``from .x import y``
                    names = [node.module] if node.module else [a.name for a in node.names]
                    found = [(n.split(".")[0], False) if n.split(".")[0] in mods else None for n in names]
                elif node.module == "tools":  # ``from tools import x``
                    found = [(a.name, False) if a.name in mods else None for a in node.names]
                else:
                    found = [_target(node.module or "", mods)]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found = [_target(node.args[0].value, mods)]
            for hit in found:
                if hit is not None and hit[0] != source:
                    edges.append(Edge(source, hit[0], node.lineno, hit[1]))
    return edges


def graph_of(edges: List[Edge]) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    return graph


def test_tools_imports_form_no_cycle():
    found = cycles(graph_of(tool_edges(TOOLS)))
    assert not found, (
        f"import cycles among tools/ (function-level imports included): {found}; move what both sides need "
        "into a leaf module that imports neither"
    )


def test_tools_import_one_another_through_the_package():
    bare = [e for e in tool_edges(TOOLS) if e.bare]
    assert not bare, "\n".join(
        f"tools/{e.source}.py:{e.line} imports {e.target} by its bare name, which resolves only with tools/ on "
        f"sys.path; write `from tools import {e.target}`"
        for e in bare
    )


def test_tools_is_a_package():
    assert (TOOLS / "__init__.py").is_file(), "tools/__init__.py is missing: tests and tools import tools.<module>"


def test_the_checker_sees_lazy_bare_and_package_imports(tmp_path):
    """The checker itself: a circle closed by a function-level bare import, and every other spelling."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "__init__.py").write_text("")
    (tools / "a.py").write_text("from tools import b\nfrom tools.c import f\n")
    (tools / "b.py").write_text("def main():\n    import a as ck\n")
    (tools / "c.py").write_text("import importlib\nfrom . import d\nimportlib.import_module('tools.e')\n")
    (tools / "d.py").write_text("import os, tools.c\nfrom .e import g\n")
    (tools / "e.py").write_text("import numpy\nfrom tools import missing\n\ndef g():\n    pass\n")
    edges = tool_edges(tools)
    assert {(e.source, e.target, e.bare) for e in edges} == {
        ("a", "b", False),
        ("a", "c", False),
        ("b", "a", True),
        ("c", "d", False),
        ("c", "e", False),
        ("d", "c", False),
        ("d", "e", False),
    }
    assert sorted(cycles(graph_of(edges))) == [["a", "b"], ["c", "d"]]


@pytest.mark.slow  # four fresh Python processes, two of them importing torch and Triton
@pytest.mark.parametrize("tool", ["bench", "check_kernels", "sass_cost", "host_time"])
def test_each_tool_runs_as_the_documented_script(tool):
    """``python tools/<tool>.py --help`` from the repository root, as the docs write it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, f"tools/{tool}.py", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"usage: {tool}.py"), proc.stdout[:500]


def test_the_launch_model_imports_without_switching_triton_to_compiling():
    """Importing ``tools.sass_cost`` (the tests do, in a worker whose Triton runs in the interpreter)
    loads neither ``tools.check_kernels`` (whose import turns ``TRITON_INTERPRET`` off) nor Triton."""
    code = (
        "import os, sys; import tools.sass_cost\n"
        "print(os.environ.get('TRITON_INTERPRET'), sorted(m for m in ('tools.check_kernels', 'triton') if m in "
        "sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "[]"], proc.stdout
