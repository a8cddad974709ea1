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
from typing import Dict, List, Set, Tuple

import pytest
from test_import_graph import cycles, imports

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"


def bare_imports(folder: Path) -> List[Tuple[str, str, int]]:
    """(module, tools module, line) of every import of a tools module by its bare name
    (``import sass_cost``, ``from check_kernels import Call``), function-level ones included."""
    stems = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found += [(path.stem, n.split(".")[0], node.lineno) for n in names if n.split(".")[0] in stems]
    return found


def tools_graph(folder: Path) -> Dict[str, Set[str]]:
    """``tools.<module>`` -> the tools modules it imports, through the package or by bare name."""
    graph = imports(folder)
    for source, target, _ in bare_imports(folder):
        if source != target:
            graph.setdefault(f"tools.{source}", set()).add(f"tools.{target}")
    return graph


def test_tools_imports_form_no_cycle():
    found = cycles(tools_graph(TOOLS))
    assert not found, (
        f"import cycles among tools/ (function-level imports included): {found}; move what both sides need "
        "into a leaf module that imports neither"
    )


def test_tools_import_one_another_through_the_package():
    bare = bare_imports(TOOLS)
    assert not bare, "\n".join(
        f"tools/{source}.py:{line} imports {target} by its bare name, which resolves only with tools/ on "
        f"sys.path; write `from tools import {target}`"
        for source, target, line in bare
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
    assert bare_imports(tools) == [("b", "a", 2)]
    graph = tools_graph(tools)
    assert graph == {
        "tools": set(),
        "tools.a": {"tools.b", "tools.c"},
        "tools.b": {"tools.a"},
        "tools.c": {"tools.d", "tools.e"},
        "tools.d": {"tools.c", "tools.e"},
        "tools.e": {"tools"},
    }
    assert sorted(cycles(graph)) == [["tools.a", "tools.b"], ["tools.c", "tools.d"]]


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
