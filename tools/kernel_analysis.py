"""What a compiled GPU kernel issues, read from its SASS and its Triton IR; no GPU needed.

Reads the disassembly of a cubin (``cuobjdump -sass`` listings, whose branches name hex addresses,
or ``nvdisasm -c -gi`` listings, whose branches name labels and which carry source lines), splits
each function into basic blocks, finds the loops (back edges of a depth-first walk from the entry)
and counts what one warp issues when each loop runs a given number of times.

Trip counts come from the Triton IR of the same compile (:func:`ttgir_loops`,
:func:`loop_iterations`): every ``scf.for`` there has scalar bounds computed from the kernel's
arguments and program ids by integer ``arith`` ops, which are evaluated per program at the real
launch arguments (``tl.static_range`` loops are unrolled before that IR, so they are straight code
in both). The SASS loops are matched to the ``scf.for`` loops by their nesting (pre-order of the
loop trees) or, when the trees differ (a loop ptxas unrolled into a main and a remainder loop),
by the source line of each SASS loop's back-edge branch (:func:`loop_trips`).

Counting rules (what a block costs, see :func:`warp_counts`): a block inside loops runs as many
times as its innermost loop's body, a block outside loops once per program; blocks not reachable
from the entry by branches (the trap loop after ``EXIT``, subroutines reached only by ``CALL``,
alignment ``NOP`` s) count nothing. Every reachable block of a loop body is counted on every
iteration (a conditional block inside the loop is counted as if taken: an upper bound).
:func:`pointer_access` tells which pointer arguments a kernel reads and writes, :func:`occupancy`
how many of its warps an SM holds.

A leaf module (the standard library only): ``tools/check_kernels.py`` counts the compiled kernels
with it and ``tools/sass_cost.py`` models their launches with it; it imports neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# ------------------------------------------------------------------------------------------------
# SASS
# ------------------------------------------------------------------------------------------------

_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+(.*?)\s*;")
_FUNC_CUOBJDUMP = re.compile(r"^\s*Function\s*:\s*(\S+)")
_FUNC_NVDISASM = re.compile(r"^\s*\.text\.(\S+?):\s*$")
_LABEL = re.compile(r"^\s*(\.L\w+):\s*$")
_LINE = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(?:.*inlined at "([^"]+)", line (\d+))?')
_GUARD = re.compile(r"^@(!?)(U?P\w+|PT)\s+")


@dataclass
class Instruction:
    addr: int
    guard: str  # "" or e.g. "!P0"
    opcode: str  # with modifiers, e.g. "BAR.SYNC.DEFER_BLOCKING"
    operands: str
    line: Optional[Tuple[str, int]] = None  # (file, line) of the kernel-level source line

    @property
    def op(self) -> str:
        """Opcode without modifiers (``BRA``, ``BAR``, ``FFMA``...)."""
        return self.opcode.split(".")[0]

    def branch_target(self, labels: Dict[str, int]) -> Optional[int]:
        if self.op not in ("BRA", "BRX", "JMP", "CALL"):
            return None
        m = re.search(r"`\((\.L\w+)\)", self.operands)
        if m:
            return labels.get(m.group(1))
        m = re.search(r"0x([0-9a-fA-F]+)", self.operands)
        return int(m.group(1), 16) if m else None


@dataclass
class Block:
    start: int  # address of the first instruction
    instrs: List[Instruction]
    succ: List[int] = field(default_factory=list)  # start addresses of successors

    @property
    def n(self) -> int:
        return len(self.instrs)

    def count(self, op: str) -> int:
        return sum(1 for i in self.instrs if i.op == op)


@dataclass
class Loop:
    header: int  # start address of the header block
    latch: int  # start address of the block holding the back edge
    blocks: List[int]  # start addresses of every block of the loop (nested loops included)
    parent: Optional[int] = None  # index of the enclosing loop in Function.loops
    depth: int = 1


@dataclass
class Function:
    name: str
    instrs: List[Instruction]
    labels: Dict[str, int]
    blocks: Dict[int, Block] = field(default_factory=dict)
    reachable: List[int] = field(default_factory=list)
    loops: List[Loop] = field(default_factory=list)

    def innermost_loop(self, block: int) -> Optional[int]:
        best = None
        for i, lp in enumerate(self.loops):
            if block in lp.blocks and (best is None or lp.depth > self.loops[best].depth):
                best = i
        return best


def parse_sass(text: str) -> List[Function]:
    """Functions of a ``cuobjdump -sass`` or ``nvdisasm -c [-g|-gi]`` listing, with their basic
    blocks, reachable blocks and loops filled in."""
    funcs: List[Function] = []
    cur: Optional[Function] = None
    pending_labels: List[str] = []
    line: Optional[Tuple[str, int]] = None
    for raw in text.splitlines():
        m = _FUNC_CUOBJDUMP.match(raw) or _FUNC_NVDISASM.match(raw)
        if m:
            cur = Function(m.group(1), [], {})
            funcs.append(cur)
            pending_labels, line = [], None
            continue
        if cur is None:
            continue
        m = _LABEL.match(raw)
        if m:
            pending_labels.append(m.group(1))
            continue
        m = _LINE.match(raw)
        if m:
            # the kernel-level line: the outermost "inlined at" site, else the line itself
            line = (m.group(3), int(m.group(4))) if m.group(3) else (m.group(1), int(m.group(2)))
            continue
        m = _INSTR.match(raw)
        if not m:
            continue
        addr = int(m.group(1), 16)
        body = m.group(2).strip()
        guard = ""
        g = _GUARD.match(body)
        if g:
            guard = g.group(1) + g.group(2)
            body = body[g.end() :]
        parts = body.split(None, 1)
        opcode = parts[0]
        operands = parts[1] if len(parts) > 1 else ""
        for lab in pending_labels:
            cur.labels[lab] = addr
        pending_labels = []
        cur.instrs.append(Instruction(addr, guard, opcode, operands, line))
    for f in funcs:
        _build_cfg(f)
    return funcs


def _build_cfg(f: Function) -> None:
    ins = f.instrs
    if not ins:
        return
    addrs = [i.addr for i in ins]
    leaders = {addrs[0]}
    for k, i in enumerate(ins):
        tgt = i.branch_target(f.labels)
        if i.op in ("BRA", "BRX", "JMP", "EXIT", "RET", "CALL") and k + 1 < len(ins):
            leaders.add(addrs[k + 1])
        if tgt is not None and tgt in addrs:
            leaders.add(tgt)
    starts = sorted(leaders)
    index = {a: k for k, a in enumerate(addrs)}
    for n, s in enumerate(starts):
        end = index[starts[n + 1]] if n + 1 < len(starts) else len(ins)
        f.blocks[s] = Block(s, ins[index[s] : end])
    for n, s in enumerate(starts):
        b = f.blocks[s]
        last = b.instrs[-1]
        nxt = starts[n + 1] if n + 1 < len(starts) else None
        tgt = last.branch_target(f.labels)
        uncond = last.guard in ("", "PT")
        if last.op in ("BRA", "JMP"):
            if tgt is not None:
                b.succ.append(tgt)
            if not uncond and nxt is not None:
                b.succ.append(nxt)
        elif last.op in ("EXIT", "RET"):
            if not uncond and nxt is not None:
                b.succ.append(nxt)
        elif nxt is not None:  # fall through (CALL returns to the next instruction)
            b.succ.append(nxt)
    _find_loops(f)


def _find_loops(f: Function) -> None:
    """Reachable blocks (from the entry, by branches) and natural loops of the back edges."""
    entry = min(f.blocks)
    state: Dict[int, int] = {}  # 1 = on the DFS stack, 2 = done
    back_edges: List[Tuple[int, int]] = []
    order: List[int] = []
    stack = [(entry, iter(f.blocks[entry].succ))]
    state[entry] = 1
    order.append(entry)
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            state[node] = 2
            stack.pop()
            continue
        if nxt not in f.blocks:
            continue
        s = state.get(nxt)
        if s is None:
            state[nxt] = 1
            order.append(nxt)
            stack.append((nxt, iter(f.blocks[nxt].succ)))
        elif s == 1:
            back_edges.append((node, nxt))
    f.reachable = sorted(order)
    preds: Dict[int, List[int]] = {b: [] for b in f.blocks}
    for b in f.reachable:
        for s in f.blocks[b].succ:
            if s in preds:
                preds[s].append(b)
    loops: Dict[int, Loop] = {}
    for latch, header in back_edges:
        body = {header, latch}
        work = [latch]
        while work:
            n = work.pop()
            if n == header:
                continue
            for p in preds[n]:
                if p not in body:
                    body.add(p)
                    work.append(p)
        if header in loops:  # several back edges to one header: one loop
            lp = loops[header]
            lp.blocks = sorted(set(lp.blocks) | body)
            lp.latch = max(lp.latch, latch)
        else:
            loops[header] = Loop(header, latch, sorted(body))
    ordered = sorted(loops.values(), key=lambda lp: (lp.header, -len(lp.blocks)))
    for i, lp in enumerate(ordered):
        parents = [j for j, o in enumerate(ordered) if j != i and set(lp.blocks) < set(o.blocks)]
        if parents:
            lp.parent = min(parents, key=lambda j: len(ordered[j].blocks))
    for lp in ordered:
        d, p = 1, lp.parent
        while p is not None:
            d, p = d + 1, ordered[p].parent
        lp.depth = d
    f.loops = ordered


def loop_shape(loops: Sequence) -> List[int]:
    """Depth of each loop in pre-order (the order both SASS and IR loops are listed in)."""
    return [lp.depth for lp in loops]


@dataclass
class Counts:
    """What one warp issues in one program."""

    instructions: float
    bar_sync: float  # BAR.SYNC / BAR.SYNC.DEFER_BLOCKING (not BAR.ARV / BAR.RED)
    per_block: Dict[int, float]


def warp_counts(f: Function, iterations: Sequence[float], programs: float = 1) -> Counts:
    """Instructions and ``bar.sync`` one warp issues over ``programs`` programs, where loop ``i``
    of ``f.loops`` runs its body ``iterations[i]`` times in total (over all entries and programs)
    and every block outside loops runs once per program."""
    if len(iterations) != len(f.loops):
        raise ValueError(f"{f.name}: {len(f.loops)} SASS loops, got {len(iterations)} trip counts")
    per_block: Dict[int, float] = {}
    ins = bar = 0.0
    for b in f.reachable:
        lp = f.innermost_loop(b)
        times = float(programs) if lp is None else float(iterations[lp])
        blk = f.blocks[b]
        per_block[b] = times
        ins += times * blk.n
        bar += times * sum(1 for i in blk.instrs if i.op == "BAR" and ".SYNC" in i.opcode)
    return Counts(ins, bar, per_block)


# ------------------------------------------------------------------------------------------------
# Triton IR: scf.for loops and their bounds
# ------------------------------------------------------------------------------------------------

_FOR = re.compile(
    r"^\s*(?:(%[\w.#:]+)\s*=\s*)?scf\.for\s+(%[\w.]+)\s*=\s*(%[\w.#]+)\s+to\s+(%[\w.#]+)\s+step\s+(%[\w.#]+)"
    r"(?:\s+iter_args\((.*?)\))?"
)
_OP = re.compile(r"^\s*(%[\w.]+)(?::\d+)?\s*=\s*([\w.]+)\s*(.*)$")
# a scalar integer result; casts (``%a = arith.extui %b : i1 to i32``) name both types
_SCALAR_TYPE = re.compile(r":\s*(?:(?:i1|i8|i16|i32|i64|index)\s+to\s+)?(i1|i8|i16|i32|i64|index)(?:\s+loc\(|\s*$)")
_FUNC_ARGS = re.compile(r"%([\w.]+):\s*(?:!tt\.ptr<[^>]*>|i\d+|f\d+|bf16|index)")


_LOC_DEF = re.compile(r"^(#loc\d*)\s*=\s*loc\((.*)\)\s*$")


def _loc_line(text: str, locs: Dict[str, str], depth: int = 0) -> Optional[int]:
    """Kernel-level source line of a location: ``"file":L:C`` directly, through a name
    (``"x"(#loc3)``), or the outermost call site of an inlined one (``callsite(#a at #b)``)."""
    if depth > 50:
        return None
    m = re.search(r"loc\((.*)\)", text)
    body = m.group(1) if m else text
    cs = re.match(r"\s*callsite\((.*)\s+at\s+(#loc\d*|.*)\)\s*$", body)
    if cs:
        return _loc_line(cs.group(2), locs, depth + 1)
    fl = re.match(r'\s*"[^"]*":(\d+):\d+', body)
    if fl:
        return int(fl.group(1))
    ref = re.search(r"(#loc\d*)", body)
    if ref and ref.group(1) in locs:
        return _loc_line(locs[ref.group(1)], locs, depth + 1)
    return None


@dataclass
class IrLoop:
    lb: str
    ub: str
    step: str
    iv: str
    body: List  # ops and nested IrLoops / IrIfs, in order
    depth: int = 1
    line: int = 0  # index in pre-order
    src_line: Optional[int] = None  # kernel-level source line of the ``for`` statement


@dataclass
class IrIf:
    cond: str
    results: List[str]
    then: List
    other: List


def _split_args(s: str) -> List[str]:
    return [a.strip() for a in s.split(",") if a.strip()]


def ttgir_loops(text: str) -> Tuple[List[str], List, List[IrLoop]]:
    """(function argument names in order, top-level body, every ``scf.for`` in pre-order) of
    the single ``tt.func`` in a TTIR / TTGIR listing. Ops are kept as ``(result, opname, rest)``
    for the scalar integer ops :func:`loop_iterations` evaluates, tensors are dropped."""
    lines = text.splitlines()
    locs = {m.group(1): m.group(2) for m in map(_LOC_DEF.match, lines) if m}
    start = next(k for k, ln in enumerate(lines) if "tt.func public" in ln)
    header = lines[start][: lines[start].find(") attributes")] if ") attributes" in lines[start] else lines[start]
    args = _FUNC_ARGS.findall(header[header.find("(") :])
    loops: List[IrLoop] = []
    top: List = []
    stack: List[Tuple[str, object, List]] = [("func", None, top)]  # (kind, node, current list)
    for ln in lines[start + 1 :]:
        s = ln.strip()
        if not s:
            continue
        if s.startswith("}"):
            kind, node, _ = stack[-1]
            if kind == "func":
                break
            if s.startswith("} else {"):
                stack[-1] = ("else", node, node.other)
                continue
            if kind == "for":
                node.src_line = _loc_line(s, locs)
            stack.pop()
            continue
        m = _FOR.match(ln)
        if m:
            res, iv, lb, ub, step, it = m.groups()
            node = IrLoop(lb, ub, step, iv, [], depth=sum(1 for k in stack if k[0] == "for") + 1)
            node.line = len(loops)
            loops.append(node)
            inits = []
            if it:
                for pair in _split_args(it):
                    a, _, b = pair.partition("=")
                    inits.append((a.strip(), b.strip()))
            stack[-1][2].append(("for", node, inits, res))
            stack.append(("for", node, node.body))
            continue
        if " scf.if " in f" {s} " or s.startswith("scf.if") or "= scf.if" in s:
            m2 = re.match(r"^\s*(?:(%[\w.]+)(?::(\d+))?\s*=\s*)?scf\.if\s+(%[\w.]+)", ln)
            if m2:
                res, n, cond = m2.groups()
                results = []
                if res:
                    results = [f"{res}#{k}" for k in range(int(n))] if n else [res]
                node = IrIf(cond, results, [], [])
                stack[-1][2].append(("if", node))
                stack.append(("if", node, node.then))
                continue
        if s.startswith("scf.yield"):
            ops = s[len("scf.yield") :].split(":")[0]
            stack[-1][2].append(("yield", _split_args(ops)))
            continue
        if s.endswith("{"):  # any other region (e.g. reductions' combine bodies): skipped as one unit
            stack.append(("other", None, []))
            continue
        m = _OP.match(ln)
        if m and _SCALAR_TYPE.search(s):
            stack[-1][2].append(("op", m.group(1), m.group(2), m.group(3)))
    return args, top, loops


def _wrap(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_CMP = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "slt": lambda a, b: a < b,
    "sle": lambda a, b: a <= b,
    "sgt": lambda a, b: a > b,
    "sge": lambda a, b: a >= b,
    "ult": lambda a, b: a % 2**64 < b % 2**64,
    "ule": lambda a, b: a % 2**64 <= b % 2**64,
    "ugt": lambda a, b: a % 2**64 > b % 2**64,
    "uge": lambda a, b: a % 2**64 >= b % 2**64,
}
_BIN = {
    "arith.addi": lambda a, b: a + b,
    "arith.subi": lambda a, b: a - b,
    "arith.muli": lambda a, b: a * b,
    "arith.divsi": _tdiv,
    "arith.divui": lambda a, b: a // b,
    "arith.remsi": lambda a, b: a - b * _tdiv(a, b),
    "arith.remui": lambda a, b: a % b,
    "arith.floordivsi": lambda a, b: a // b,
    "arith.ceildivsi": lambda a, b: -((-a) // b),
    "arith.minsi": min,
    "arith.maxsi": max,
    "arith.minui": min,
    "arith.maxui": max,
    "arith.andi": lambda a, b: a & b,
    "arith.ori": lambda a, b: a | b,
    "arith.xori": lambda a, b: a ^ b,
    "arith.shli": lambda a, b: a << b,
    "arith.shrsi": lambda a, b: a >> b,
    "arith.shrui": lambda a, b: a >> b,
}


def _has_loop(items: List) -> bool:
    """Whether a region holds an ``scf.for``, in its branches included."""
    for it in items:
        if it[0] == "for" or (it[0] == "if" and (_has_loop(it[1].then) or _has_loop(it[1].other))):
            return True
    return False


class _Eval:
    def __init__(self, env: Dict[str, int], counts: List[float], entries: List[float]):
        self.env = env
        self.counts = counts
        self.entries = entries

    def val(self, name: str) -> Optional[int]:
        return self.env.get(name)

    def op(self, res: str, name: str, rest: str) -> None:
        rest = rest.split(" loc(")[0]
        bits = 1 if ": i1" in rest else 64 if (": i64" in rest or ": index" in rest) else 32
        if name == "arith.constant":
            m = re.match(r"\s*(-?\d+|true|false)", rest)
            if m:
                t = m.group(1)
                self.env[res] = 1 if t == "true" else 0 if t == "false" else int(t)
            return
        if name == "tt.get_program_id":
            axis = {"x": 0, "y": 1, "z": 2}[rest.split()[0]]
            self.env[res] = self.env[f"__pid{axis}"]
            return
        if name == "tt.get_num_programs":
            axis = {"x": 0, "y": 1, "z": 2}[rest.split()[0]]
            self.env[res] = self.env[f"__npid{axis}"]
            return
        operands = re.findall(r"%[\w.#]+", rest.split(":")[0])
        if name == "arith.cmpi":
            pred = rest.split(",")[0].strip()
            a, b = (self.val(o) for o in operands[:2])
            if a is not None and b is not None:
                self.env[res] = int(_CMP[pred](a, b))
            return
        if name == "arith.select":
            c, a, b = (self.val(o) for o in operands[:3])
            if c is not None:
                v = a if c else b
                if v is not None:
                    self.env[res] = v
            return
        if name in ("arith.extsi", "arith.extui", "arith.index_cast", "arith.index_castui", "arith.trunci"):
            a = self.val(operands[0])
            if a is not None:
                if name == "arith.trunci":
                    tb = re.search(r"to\s+i(\d+)", rest)
                    a = _wrap(a, int(tb.group(1))) if tb else a
                self.env[res] = a
            return
        fn = _BIN.get(name)
        if fn is not None and len(operands) >= 2:
            a, b = self.val(operands[0]), self.val(operands[1])
            if a is not None and b is not None:
                try:
                    self.env[res] = _wrap(fn(a, b), bits) if bits > 1 else fn(a, b) & 1
                except ZeroDivisionError:
                    pass

    def region(self, items: List) -> Optional[List[Optional[int]]]:
        """Evaluate a region; returns the values of its ``scf.yield`` (None entries unknown)."""
        for it in items:
            kind = it[0]
            if kind == "op":
                self.op(it[1], it[2], it[3])
            elif kind == "yield":
                return [self.val(v) for v in it[1]]
            elif kind == "if":
                node = it[1]
                c = self.val(node.cond)
                if c is None:
                    if _has_loop(node.then) or _has_loop(node.other):
                        raise ValueError(
                            f"loop bound depends on a condition not computable from the arguments ({node.cond})"
                        )
                    continue  # a data-dependent branch without loops: no trip count depends on it
                ys = self.region(node.then if c else node.other)
                for r, v in zip(node.results, ys or []):
                    if v is not None:
                        self.env[r] = v
            elif kind == "for":
                self.loop(it[1], it[2], it[3])
        return None

    def loop(self, node: IrLoop, inits: List[Tuple[str, str]], res: Optional[str]) -> None:
        lb, ub, st = self.val(node.lb), self.val(node.ub), self.val(node.step)
        if lb is None or ub is None or st is None or st <= 0:
            raise ValueError(
                f"scf.for #{node.line}: bounds ({node.lb}, {node.ub}, {node.step}) are not computable from "
                "the kernel arguments and program ids"
            )
        n = max(0, -(-(ub - lb) // st))
        self.counts[node.line] += n
        self.entries[node.line] += 1
        scalar_carried = [a for a, b in inits if self.val(b) is not None]
        # the body matters for the counts only through the loops nested in it (their bounds may
        # follow the iteration) or the scalars it carries to the next iteration; a branch without a
        # loop inside changes no count (the moments kernel's stores from the K-th row on)
        needs_body = _has_loop(node.body) or scalar_carried
        if not needs_body or n == 0:
            return
        for a, b in inits:
            self.env[a] = self.val(b)
        for k in range(n):
            self.env[node.iv] = lb + k * st
            ys = self.region(node.body) or []
            for (a, _), v in zip(inits, ys):
                if v is None:
                    self.env.pop(a, None)
                else:
                    self.env[a] = v


def loop_iterations(
    ir: Tuple[List[str], List, List[IrLoop]],
    args: Dict[str, int],
    grid: Sequence[int],
) -> Tuple[List[float], List[float]]:
    """Total body executions and entries of every ``scf.for`` summed over all programs of
    ``grid``, given the integer values of the function's arguments (by IR argument name)."""
    names, top, loops = ir
    counts = [0.0] * len(loops)
    entries = [0.0] * len(loops)
    g = list(grid) + [1] * (3 - len(grid))
    base = {f"%{n}": v for n, v in args.items() if v is not None}
    base.update({"__npid0": g[0], "__npid1": g[1], "__npid2": g[2]})
    for z in range(g[2]):
        for y in range(g[1]):
            for x in range(g[0]):
                env = dict(base)
                env.update({"__pid0": x, "__pid1": y, "__pid2": z})
                _Eval(env, counts, entries).region(top)
    return counts, entries


def match_loops(sass_loops: Sequence[Loop], ir_loops: Sequence[IrLoop], name: str = "") -> List[int]:
    """Index of the IR loop of each SASS loop: both lists are in pre-order, so equal nesting shapes
    map one to one. Raises when the shapes differ (unrolled or rotated-away loops)."""
    a, b = loop_shape(sass_loops), [lp.depth for lp in ir_loops]
    if a != b:
        raise ValueError(
            f"{name}: SASS loop nesting {a} differs from the Triton IR's scf.for nesting {b}; "
            "trip counts cannot be matched (did ptxas unroll or split a loop?)"
        )
    return list(range(len(a)))


def pointer_access(text: str) -> Dict[str, str]:
    """Which pointer arguments of the ``tt.func`` a TTGIR listing loads from ("r"), stores to
    ("w") or both ("rw"): the pointer operand of every global load / store traced back through
    the ops that compute it (``tt.splat``, ``tt.addptr``, ``scf.for`` iter_args, the values an
    ``scf.if`` / ``scf.for`` yields...).

    Names are scoped as the IR scopes them: two sibling regions (the branches of an ``scf.if``,
    two inlined copies of one body) may each define a value of the same name, and a use means the
    innermost definition before it (so one copy's pointers never pass for the other's)."""
    defs: Dict[str, List[str]] = {}  # value -> the values it is computed from (unique ids)
    access: Dict[str, str] = {}
    uses: List[Tuple[str, str]] = []
    names, _, _ = ttgir_loops(text)
    args = {"%" + n for n in names}
    scopes: List[Dict[str, str]] = [{a: a for a in args}]  # name -> unique id, innermost last
    frames: List[Tuple[List[str], List[str]]] = [([], [])]  # each open region: (results, iter args) a yield feeds
    count = [0]

    def define(name: str, sources: List[str]) -> str:
        count[0] += 1
        uid = f"{name}@{count[0]}"
        scopes[-1][name] = uid
        defs[uid] = sources
        return uid

    def resolve(name: str) -> str:
        for sc in reversed(scopes):
            if name in sc:
                return sc[name]
        return name

    for ln in text.splitlines():
        s = ln.split(" loc(")[0].strip()
        opens = ln.rstrip().endswith("{")  # (a function's line ends with "{" after its arguments' locations)
        if s.startswith("}"):  # a region ends (``} else {`` opens its sibling, fed by the same yields)
            scopes.pop()
            frame = frames.pop()
            if opens:
                scopes.append({})
                frames.append(frame)
            continue
        if s.startswith("^bb"):  # a block's arguments (a reduction's combiner): defined, computed from nothing
            for a in re.findall(r"(%[\w.]+):", s):
                define(a, [])
            continue
        m = _FOR.match(ln)
        m_op = re.match(r"^(%[\w.]+)(?::\d+)?\s*=\s*([\w.\"]+)\s*(.*)$", s)
        if m_op:
            opname, rest = m_op.group(2).strip('"'), m_op.group(3)
        else:
            parts = s.split(None, 1)
            opname, rest = (parts[0], parts[1]) if len(parts) == 2 else (s, "")
        ops = [resolve(o) for o in re.findall(r"%[\w.]+", rest.split(" : ")[0])]
        if opname == "scf.yield":
            results, iters = frames[-1]
            for r in results:
                defs[r].extend(ops)
            for it, o in zip(iters, ops):
                defs[it].append(o)
            continue
        result = define(m_op.group(1), list(ops)) if m_op else None
        if opens:  # a region opens: what its yields feed; a loop's own arguments in it
            scopes.append({})
            iters: List[str] = []
            if m:
                define(m.group(2), [])  # the induction variable
                for pair in _split_args(m.group(6) or ""):
                    a, _, b = pair.partition("=")
                    iters.append(define(a.strip(), [resolve(b.strip())]))
            frames.append(([result] if result else [], iters))
            continue
        if not ops:
            continue
        if opname in ("tt.load", "ttg.async_copy_global_to_local", "tt.descriptor_load"):
            uses.append((ops[0], "r"))
        elif opname in ("tt.store", "tt.descriptor_store"):
            uses.append((ops[0], "w"))
        elif opname.startswith("tt.atomic"):
            uses.append((ops[0], "rw"))
    for start, kind in uses:
        seen, work = set(), [start]
        while work:
            v = work.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in args:
                old = access.get(v[1:], "")
                access[v[1:]] = "".join(sorted(set(old + kind), reverse=True)).replace("wr", "rw")
            work.extend(defs.get(v, []))
    return access


def _own_size(f: Function, i: int, skip_line: Optional[int] = None) -> int:
    """Instructions of SASS loop ``i``'s own blocks (nested loops excluded), leaving out those
    of source line ``skip_line`` (the loop's own control: counter, compare, branch)."""
    return sum(
        1
        for b in f.loops[i].blocks
        if f.innermost_loop(b) == i
        for ins in f.blocks[b].instrs
        if skip_line is None or ins.line is None or ins.line[1] != skip_line
    )


def loop_trips(
    f: Function, ir_loops: Sequence[IrLoop], counts: Sequence[float], entries: Sequence[float]
) -> Tuple[List[float], str]:
    """Body executions of every SASS loop of ``f`` from those of the IR loops (``counts``, over
    ``entries`` entries), and how they were matched: "nesting" when both loop trees have the same
    shape (one to one, in pre-order), else "lines": each SASS loop goes to the ``scf.for`` whose
    ``for`` line its back-edge branch carries (``nvdisasm -gi`` line info). Several SASS loops on
    one ``scf.for`` are a loop ptxas unrolled ``u`` times plus its remainder loop(s): the largest
    runs ``(n - e (u - 1) / 2) / u`` times for ``n`` iterations over ``e`` entries (``u`` = the
    ratio of its body instructions to the others', loop control left out), the remainder loops
    the expected ``e (u - 1) / 2`` (an approximation: the IR gives totals, not each entry's n)."""
    if loop_shape(f.loops) == [lp.depth for lp in ir_loops]:
        return [float(counts[i]) for i in range(len(f.loops))], "nesting"
    by_line: Dict[int, List[int]] = {}
    for j, lp in enumerate(ir_loops):
        if lp.src_line is not None:
            by_line.setdefault(lp.src_line, []).append(j)
    groups: Dict[int, List[int]] = {}
    for i, lp in enumerate(f.loops):
        line = f.blocks[lp.latch].instrs[-1].line
        cands = by_line.get(line[1]) if line else None
        if not cands or len(cands) != 1:
            raise ValueError(
                f"{f.name}: SASS loop nesting {loop_shape(f.loops)} differs from the Triton IR's scf.for nesting "
                f"{[lp.depth for lp in ir_loops]}, and SASS loop {i} (back edge at {lp.latch:#x}, source line "
                f"{line[1] if line else '?'}) names no single scf.for; trip counts cannot be matched"
            )
        groups.setdefault(cands[0], []).append(i)
    trips = [0.0] * len(f.loops)
    for j, members in groups.items():
        if len(members) == 1:
            trips[members[0]] = float(counts[j])
            continue
        sizes = {i: _own_size(f, i, ir_loops[j].src_line) for i in members}
        main = max(members, key=lambda i: sizes[i])
        rest = [i for i in members if i != main]
        u = max(1, round(sizes[main] / max(1, max(sizes[i] for i in rest))))
        rem = entries[j] * (u - 1) / 2
        trips[main] = max(0.0, (counts[j] - rem) / u)
        for i in rest:
            trips[i] = min(float(counts[j]), rem) / len(rest)
    return trips, "lines"


# ------------------------------------------------------------------------------------------------
# Occupancy
# ------------------------------------------------------------------------------------------------

#: Per-SM limits (CUDA occupancy calculator): registers, warps, CTAs, shared memory per SM and the
#: shared memory the driver reserves per CTA (bytes).
SM_LIMITS = {
    80: dict(regs=65536, warps=64, ctas=32, smem=167936, smem_reserved=1024),
    90: dict(regs=65536, warps=64, ctas=32, smem=233472, smem_reserved=1024),
}


def resident_warps(arch: int, regs: int, warps: int, smem: int) -> Tuple[int, int]:
    """(resident CTAs, resident warps) per SM for a kernel of ``warps`` warps per CTA using
    ``regs`` registers per thread and ``smem`` bytes of shared memory per CTA. Registers are
    allocated per warp in units of 256 (``regs`` rounded up to a multiple of 8)."""
    ctas, warps_per_sm, _ = occupancy(arch, regs, warps, smem)
    return ctas, warps_per_sm


def occupancy(arch: int, regs: int, warps: int, smem: int) -> Tuple[int, int, str]:
    """(resident CTAs, resident warps, limiter) per SM, as :func:`resident_warps`; ``limiter``
    names the resources that bind: "registers", "warps", "ctas" or "shared memory" (joined by "+"
    when several bind at once)."""
    lim = SM_LIMITS[arch]
    per_warp = ((max(regs, 1) + 7) // 8 * 8) * 32
    per_warp = (per_warp + 255) // 256 * 256
    by = {
        "registers": lim["regs"] // (per_warp * warps),
        "warps": lim["warps"] // warps,
        "ctas": lim["ctas"],
        "shared memory": lim["smem"] // (smem + lim["smem_reserved"]),
    }
    ctas = max(0, min(by.values()))
    return ctas, ctas * warps, "+".join(k for k, v in by.items() if max(0, v) == ctas)
