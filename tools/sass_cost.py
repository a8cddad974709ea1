"""Static cost of compiled GPU kernels: SASS basic blocks, loops and their trip counts.

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
Used by ``tools/check_kernels.py --cost``; importable by tests.

The launch model (docs/cost_model.md) turns those counts into four bounds per launch: issue-bound
(every issue slot of every SM busy), occupancy / latency-bound (resident warps per SM from
registers, shared memory and warps per program; a warp alone on its scheduler issuing once per
:data:`WARP_CYCLES_PER_ISSUE` cycles), wave-quantised (programs over SMs x programs per SM, the last
wave at the occupancy it leaves) and DRAM-bound, and searches rows per program and register
ceilings for geometry that meets its targets. Run ``python tools/sass_cost.py [--launches]`` for
the tables of the loss calls (SSIM, D-SSIM + L1, MS-SSIM; forward and forward + backward; 1080p,
five 1080p frames and 4K; float32 and bfloat16), with fused-ssim's kernels modelled beside them.
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


# ------------------------------------------------------------------------------------------------
# Launch model: issue, occupancy / latency, waves, DRAM (docs/cost_model.md)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    """What the launch model needs of a GPU (vendor figures)."""

    name: str
    arch: int
    sms: int
    schedulers: int  # warp schedulers per SM, each issuing at most one warp-instruction per cycle
    clock_hz: float  # boost clock
    dram_bytes_per_s: float  # peak DRAM bandwidth


GPUS = {
    90: GPU("H100 SXM5", 90, 132, 4, 1.755e9, 3.35e12),
    80: GPU("A100 SXM4 80GB", 80, 108, 4, 1.41e9, 2.039e12),
}

#: Assumption L: cycles between two instructions one warp issues when it is alone on its scheduler
#: (its dependent-instruction, L1 and barrier stalls averaged over the kernel). A scheduler holding
#: ``w`` warps then fills ``min(1, w / L)`` of its issue slots: with L = 8, 8 warps per scheduler
#: (32 per SM) reach the issue bound, 4 (16 per SM) half of it. Measure: ncu
#: ``smsp__average_warp_latency_per_inst_issued.ratio`` ("warp cycles per issued instruction") at
#: the kernel's occupancy, and ``smsp__issue_active.avg.pct_of_peak_sustained_active``.
WARP_CYCLES_PER_ISSUE = 8.0

#: Assumption: the fraction of peak DRAM bandwidth a streaming kernel sustains (ncu
#: ``dram__throughput.avg.pct_of_peak_sustained_elapsed`` of a copy kernel).
DRAM_EFFICIENCY = 0.9

#: Assumption: the least GPU time any launch takes (launch, ramp-up and drain of a tiny grid; nsys:
#: ``gpu__time_duration.sum`` of a 1-element torch op, or the gaps between kernels of a call).
LAUNCH_FLOOR_S = 2e-6


def issue_fraction(resident_warps: float, schedulers: int = 4, cycles_per_issue: Optional[float] = None) -> float:
    """Fraction of an SM's issue slots its ``resident_warps`` fill: each of its ``schedulers``
    holds ``w = resident_warps / schedulers`` warps, each issuing at most once per
    ``cycles_per_issue`` cycles (default :data:`WARP_CYCLES_PER_ISSUE`), so
    ``min(1, w / cycles_per_issue)``."""
    cycles_per_issue = WARP_CYCLES_PER_ISSUE if cycles_per_issue is None else cycles_per_issue
    if resident_warps <= 0:
        raise ValueError(f"resident_warps must be > 0, got {resident_warps} (a kernel that cannot fit on an SM)")
    if cycles_per_issue < 1:
        raise ValueError(f"cycles_per_issue must be >= 1 (one issue per cycle at most), got {cycles_per_issue}")
    return min(1.0, resident_warps / schedulers / cycles_per_issue)


@dataclass(frozen=True)
class Waves:
    """How a grid of ``programs`` fills a GPU of ``sms`` SMs holding ``ctas`` programs each."""

    programs: int
    slots: int  # programs resident at once: SMs x CTAs per SM
    waves: float  # programs / slots
    full: int  # full waves
    last: int  # programs on the busiest SM in the last, partial wave (0: no partial wave)
    efficiency: float  # programs / (ceil(waves) x slots): the share of the slots the waves use


def waves(programs: int, sms: int, ctas: int) -> Waves:
    """Wave quantisation of a launch: ``programs`` CTAs dispatched ``sms x ctas`` at a time; the
    last, partial wave spreads its ``r`` programs over the SMs, ``ceil(r / sms)`` on the busiest."""
    if programs < 1 or sms < 1 or ctas < 1:
        raise ValueError(f"waves needs programs, sms and ctas >= 1, got {programs}, {sms}, {ctas}")
    slots = sms * ctas
    full, rem = divmod(programs, slots)
    last = -(-rem // sms) if rem else 0
    n = full + (1 if rem else 0)
    return Waves(programs, slots, programs / slots, full, last, programs / (n * slots))


@dataclass(frozen=True)
class LaunchEstimate:
    """The four bounds of one launch (seconds) and what they rest on; ``model_s`` is the largest
    of the wave-quantised, DRAM and launch-floor bounds, ``bound`` which one it is."""

    programs: int
    warps: int
    regs: int
    smem: int
    ctas: int  # resident CTAs per SM
    resident_warps: int  # per SM
    limiter: str
    waves: Waves
    issue_s: float  # warp-instructions / (SMs x schedulers x clock): every slot of every SM issues
    latency_s: float  # issue_s / issue_fraction(resident warps): full occupancy, latency from L
    wave_s: float  # per wave, the busiest SM's programs at the occupancy they leave it
    dram_s: float  # bytes / (bandwidth x DRAM_EFFICIENCY)
    model_s: float
    bound: str


def estimate_launch(
    gpu: GPU,
    warp_instructions: float,
    programs: int,
    warps: int,
    regs: int,
    smem: int,
    dram_bytes: float,
    cycles_per_issue: Optional[float] = None,
    dram_efficiency: Optional[float] = None,
    launch_floor_s: Optional[float] = None,
) -> LaunchEstimate:
    """Issue-bound, occupancy / latency-bound, wave-quantised and DRAM-bound time of a launch of
    ``programs`` CTAs of ``warps`` warps (``regs`` registers per thread, ``smem`` bytes of shared
    memory per CTA) issuing ``warp_instructions`` in all and moving ``dram_bytes``.

    Every program is assumed to issue the same (``warp_instructions / programs``). A wave in which
    the busiest SM holds ``k`` programs takes ``k p / (schedulers x clock x issue_fraction(k x
    warps))``: the full waves at the occupancy limit, the last one at the ``k`` programs it leaves
    on an SM (fewer warps hide less latency). The assumptions default to the module's
    :data:`WARP_CYCLES_PER_ISSUE`, :data:`DRAM_EFFICIENCY` and :data:`LAUNCH_FLOOR_S` at call time."""
    cycles_per_issue = WARP_CYCLES_PER_ISSUE if cycles_per_issue is None else cycles_per_issue
    dram_efficiency = DRAM_EFFICIENCY if dram_efficiency is None else dram_efficiency
    launch_floor_s = LAUNCH_FLOOR_S if launch_floor_s is None else launch_floor_s
    ctas, res_warps, limiter = occupancy(gpu.arch, regs, warps, smem)
    if ctas < 1:
        raise ValueError(
            f"a CTA of {warps} warps, {regs} registers per thread and {smem} B of shared memory does not fit "
            f"on an sm_{gpu.arch} SM ({limiter})"
        )
    per_sm_rate = gpu.schedulers * gpu.clock_hz  # warp-instructions per second per SM, all slots used
    issue_s = warp_instructions / (gpu.sms * per_sm_rate)
    latency_s = issue_s / issue_fraction(res_warps, gpu.schedulers, cycles_per_issue)
    wv = waves(programs, gpu.sms, ctas)
    per_program = warp_instructions / programs

    def wave_time(k: int) -> float:
        return k * per_program / (per_sm_rate * issue_fraction(k * warps, gpu.schedulers, cycles_per_issue))

    wave_s = wv.full * wave_time(ctas) + (wave_time(wv.last) if wv.last else 0.0)
    dram_s = dram_bytes / (gpu.dram_bytes_per_s * dram_efficiency)
    bounds = {"waves": wave_s, "DRAM": dram_s, "launch": launch_floor_s}
    bound = max(bounds, key=lambda k: bounds[k])
    return LaunchEstimate(
        programs,
        warps,
        regs,
        smem,
        ctas,
        res_warps,
        limiter,
        wv,
        issue_s,
        latency_s,
        wave_s,
        dram_s,
        bounds[bound],
        bound,
    )


def estimate_glue(
    gpu: GPU,
    warp_instructions: float,
    dram_bytes: float,
    dram_efficiency: Optional[float] = None,
    launch_floor_s: Optional[float] = None,
) -> Tuple[float, float, float]:
    """(issue, DRAM, model) seconds of a torch glue kernel, assumed to fill the GPU (an
    elementwise op or reduction over a large grid of light programs): its issue bound stands for
    the latency and wave bounds too; ``model`` is the largest of issue, DRAM and launch floor."""
    dram_efficiency = DRAM_EFFICIENCY if dram_efficiency is None else dram_efficiency
    launch_floor_s = LAUNCH_FLOOR_S if launch_floor_s is None else launch_floor_s
    issue_s = warp_instructions / (gpu.sms * gpu.schedulers * gpu.clock_hz)
    dram_s = dram_bytes / (gpu.dram_bytes_per_s * dram_efficiency)
    return issue_s, dram_s, max(issue_s, dram_s, launch_floor_s)


#: Geometry targets of a launch that carries at least ``TARGET_SHARE`` of its op's work.
TARGET_WARPS = 32
TARGET_EFFICIENCY = 0.85
TARGET_WAVES = 4
TARGET_SHARE = 0.05


def missed_targets(est: LaunchEstimate, spill_bytes: int) -> List[str]:
    """The geometry targets ``est`` misses: at least ``TARGET_WARPS`` resident warps per SM, no
    register spills, and a wave efficiency of at least ``TARGET_EFFICIENCY`` or at least
    ``TARGET_WAVES`` waves. Empty when it meets them all."""
    out = []
    if est.resident_warps < TARGET_WARPS:
        out.append(f"{est.resident_warps} warps/SM < {TARGET_WARPS} ({est.limiter})")
    if spill_bytes > 0:
        out.append(f"{spill_bytes} B spilled")
    if est.waves.efficiency < TARGET_EFFICIENCY and est.waves.waves < TARGET_WAVES:
        out.append(
            f"wave efficiency {est.waves.efficiency:.0%} < {TARGET_EFFICIENCY:.0%} with {est.waves.waves:.2f} "
            f"< {TARGET_WAVES} waves"
        )
    return out


def choose_geometry(
    candidates: Sequence[Tuple[object, LaunchEstimate, int]],
) -> Tuple[object, LaunchEstimate, List[str]]:
    """The best of ``candidates`` ``(label, estimate, spill bytes)`` of one launch: never one that
    spills when one does not; among those, the fastest that meets every target (:func:`missed_targets`),
    else the fastest, with the targets it misses."""
    if not candidates:
        raise ValueError("choose_geometry needs at least one candidate")
    pool = [c for c in candidates if c[2] == 0] or list(candidates)
    meeting = [c for c in pool if not missed_targets(c[1], c[2])]
    label, est, spill = min(meeting or pool, key=lambda c: c[1].model_s)
    return label, est, missed_targets(est, spill)


# ------------------------------------------------------------------------------------------------
# fused-ssim's CUDA kernels, modelled from their geometry and SASS (docs/cost_model.md)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaKernel:
    """A CUDA kernel of a peer library as the launch model needs it: a 2-D grid of ``tile`` x
    ``tile`` pixel tiles per image (channels looped inside a CTA), its resources, and what one
    warp issues: ``prologue`` instructions once, ``per_channel`` per channel, and an inner loop of
    ``inner`` instructions run ``inner_trips`` times per channel (averaged over the CTA's warps)."""

    name: str
    tile: int
    warps: int
    regs: int
    smem: int
    prologue: int
    per_channel: int
    inner: int
    inner_trips: float
    read_bytes: int  # DRAM bytes per pixel-channel
    write_bytes: int

    def programs(self, shape: Sequence[int]) -> int:
        B, _, H, W = shape
        return B * -(-H // self.tile) * -(-W // self.tile)

    def warp_instructions(self, shape: Sequence[int]) -> float:
        per_warp = self.prologue + shape[1] * (self.per_channel + self.inner * self.inner_trips)
        return self.programs(shape) * self.warps * per_warp


#: fused-ssim (rahul-goel/fused-ssim, ``ssim.cu``): 16x16 tiles of 256 threads, channels looped in
#: the CTA, compiled with its own flags (``-O3 --maxrregcount=32 --use_fast_math``) by nvcc 13.0
#: for sm_90 and counted by this module (nvdisasm, loops by their back edges): 32 registers, no
#: spills; the forward's channel loop 430 instructions per warp (70 outside it), the backward's 300
#: plus its row loop of 184 (``for (row = warp_id; row < 26; row += 8)``: 3.25 trips per warp).
#: DRAM: the training forward reads x, y and writes the map and three partial maps; the backward
#: reads x, y, dL/dmap and the partials and writes dL/dx; without a gradient the forward writes the
#: map alone.
FUSED_SSIM_FWD = CudaKernel("fusedssimCUDA", 16, 8, 32, 13728, 70, 430, 0, 0.0, 8, 16)
FUSED_SSIM_FWD_NOGRAD = CudaKernel("fusedssimCUDA (train=False)", 16, 8, 32, 13728, 70, 430, 0, 0.0, 8, 4)
FUSED_SSIM_BWD = CudaKernel("fusedssim_backwardCUDA", 16, 8, 32, 13104, 22, 300, 184, 26 / 8, 24, 4)


def estimate_cuda_kernel(gpu: GPU, k: CudaKernel, shape: Sequence[int], **kw) -> LaunchEstimate:
    """:func:`estimate_launch` of one launch of ``k`` on images of ``shape`` (B, C, H, W)."""
    px = 1
    for d in shape:
        px *= d
    return estimate_launch(
        gpu,
        k.warp_instructions(shape),
        k.programs(shape),
        k.warps,
        k.regs,
        k.smem,
        px * (k.read_bytes + k.write_bytes),
        **kw,
    )


# ------------------------------------------------------------------------------------------------
# The launch tables: python tools/sass_cost.py (docs/cost_model.md)
# ------------------------------------------------------------------------------------------------

#: Shapes of the launch tables: one and five 1080p RGB frames, one 4K frame.
TABLE_SHAPES = ((1, 3, 1080, 1920), (5, 3, 1080, 1920), (1, 3, 2160, 3840))
#: The ops of the tables, by the name of their call in ``check_kernels.cost_calls`` ("dssim_l1_masked":
#: D-SSIM + L1 under a soft ``(1, 1, H, W)`` mask; not in the default run).
TABLE_OPS = {
    "ssim": "ssim_loss_fwd_bwd",
    "dssim_l1": "dssim_l1_fwd_bwd",
    "ms_ssim": "ms_ssim_loss_fwd_bwd",
    "dssim_l1_masked": "dssim_l1_masked_fwd_bwd",
}
#: The ops of the default run.
DEFAULT_OPS = ("ssim", "dssim_l1", "ms_ssim")
#: Forward alone (no input requires a gradient) and forward + backward (gradient of x).
TABLE_MODES = {"fwd": (False, False), "fwd+bwd": (True, False)}
#: Rows per program the geometry search tries (launch argument ``ROWS``: no recompile); 99 and 50
#: split 1080 rows into 11 and 22 chunks, which with 24 programs per chunk fill 132 SMs x 2 exactly.
SEARCH_ROWS = (128, 99, 64, 50, 32, 25, 16, 8, 4)
#: Register ceilings the geometry search compiles besides the launched one (80: 24-28 warps per SM,
#: 64: 32).
SEARCH_MAXNREG = (80, 64)


def _shape_label(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def table_calls(ck, shapes, dtypes, ops, modes) -> Dict[str, object]:
    """``check_kernels.Call`` s of the tables, by ``"op mode shape dtype"``."""
    base = ck.cost_calls()
    out = {}
    for shape in shapes:
        for dtype in dtypes:
            for op in ops:
                for mode in modes:
                    call = base[TABLE_OPS[op]]._replace(shape=tuple(shape), dtype=dtype, grads=TABLE_MODES[mode])
                    out[f"{op} {mode} {_shape_label(shape)} {dtype}"] = call
    return out


def _launch_rows(ck, gpu: GPU, items, cache, maxnreg=None, counts_cache=None, heavy=None) -> List[dict]:
    """One record per launch of a recorded call: counts and :class:`LaunchEstimate` (Triton), or
    the glue model (torch ops). ``maxnreg``: a register ceiling to compile the Triton launches with
    instead of theirs, only those whose index is in ``heavy`` when given (the others as launched)."""
    rows = []
    for i, it in enumerate(items):
        if isinstance(it, ck.Glue):
            wi = it.elements * ck.GLUE_WARP_INSTR_PER_ELEMENT
            issue, dram, model = estimate_glue(gpu, wi, it.nbytes)
            rows.append(
                dict(
                    kernel=f"torch {it.op}",
                    glue=True,
                    elements=it.elements,
                    warp_instructions=wi,
                    dram_bytes=it.nbytes,
                    issue_s=issue,
                    latency_s=issue,
                    wave_s=issue,
                    dram_s=dram,
                    model_s=model,
                )
            )
            continue
        m = maxnreg if heavy is None or i in heavy else None
        variant = ck.compile_variant(it, gpu.arch, cache, maxnreg=m)
        key = (id(variant), tuple(it.grid), tuple(sorted((n, v) for n, v in it.args.items() if isinstance(v, int))))
        c = counts_cache.get(key) if counts_cache is not None else None
        if c is None:
            c = ck.count_launch(it, gpu.arch, variant)
            c = {k: v for k, v in c.items() if k not in ("variant", "counts")}
            if counts_cache is not None:
                counts_cache[key] = c
        dram = c["read"] + c["written"]
        est = estimate_launch(gpu, c["warp_instructions"], c["programs"], c["warps"], c["regs"], c["smem"], dram)
        rows.append(
            dict(
                kernel=it.fn.fn.__name__,
                glue=False,
                grid=list(it.grid),
                launched_rows=it.args.get("ROWS"),  # the launch's own rows per program (None: no ROWS)
                spill=c["spill"],
                maxnreg=m,
                warp_instructions=c["warp_instructions"],
                dram_bytes=dram,
                est=est,
                issue_s=est.issue_s,
                latency_s=est.latency_s,
                wave_s=est.wave_s,
                dram_s=est.dram_s,
                model_s=est.model_s,
            )
        )
    total = sum(r["warp_instructions"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["warp_instructions"] / total
    return rows


def _totals(rows: List[dict]) -> Dict[str, float]:
    return {k: sum(r[k] for r in rows) for k in ("issue_s", "latency_s", "wave_s", "dram_s", "model_s")}


def batch_launches(gpu: GPU, rows: List[dict]) -> List[dict]:
    """``rows`` with every launch of the call's heaviest Triton kernel but its largest merged into
    one (a hypothetical grouped launch: a program table maps each program to its scale), counts
    and bytes summed, at the worst resources of the merged launches."""
    tri = [r for r in rows if not r["glue"]]
    if not tri:
        return rows
    work: Dict[str, float] = {}
    for r in tri:
        work[r["kernel"]] = work.get(r["kernel"], 0.0) + r["warp_instructions"]
    heavy = max(work, key=lambda k: work[k])
    group = [r for r in tri if r["kernel"] == heavy]
    if len(group) < 2:
        return rows
    keep = max(group, key=lambda r: r["warp_instructions"])
    merged = [r for r in group if r is not keep]
    e = [r["est"] for r in merged]
    wi = sum(r["warp_instructions"] for r in merged)
    dram = sum(r["dram_bytes"] for r in merged)
    est = estimate_launch(
        gpu,
        wi,
        sum(x.programs for x in e),
        max(x.warps for x in e),
        max(x.regs for x in e),
        max(x.smem for x in e),
        dram,
    )
    new = dict(
        kernel=f"{heavy} x{len(merged)} batched",
        glue=False,
        grid=[est.programs],
        spill=max(r["spill"] for r in merged),
        maxnreg=None,
        warp_instructions=wi,
        dram_bytes=dram,
        est=est,
        issue_s=est.issue_s,
        latency_s=est.latency_s,
        wave_s=est.wave_s,
        dram_s=est.dram_s,
        model_s=est.model_s,
        share=sum(r["share"] for r in merged),
    )
    out, placed = [], False
    for r in rows:
        if any(r is m for m in merged):
            if not placed:
                out.append(new)
                placed = True
            continue
        out.append(r)
    return out


#: Torch glue launches on at most this many elements (read + written) count as the scalar
#: composition of a loss (MS-SSIM's weighted product and its gradient, the autograd seed...).
SCALAR_GLUE_ELEMENTS = 4096


def fuse_scalar_glue(rows: List[dict], max_elements: int = SCALAR_GLUE_ELEMENTS) -> List[dict]:
    """``rows`` with every torch glue launch on at most ``max_elements`` elements merged into one
    launch (a hypothetical fused composition kernel): its issue and DRAM figures summed, one
    launch floor instead of one per launch."""
    small = [r for r in rows if r["glue"] and r.get("elements", max_elements + 1) <= max_elements]
    if len(small) < 2:
        return rows
    issue = sum(r["issue_s"] for r in small)
    dram = sum(r["dram_s"] for r in small)
    merged = dict(
        kernel=f"torch glue x{len(small)} fused",
        glue=True,
        elements=sum(r["elements"] for r in small),
        warp_instructions=sum(r["warp_instructions"] for r in small),
        dram_bytes=sum(r["dram_bytes"] for r in small),
        issue_s=issue,
        latency_s=issue,
        wave_s=issue,
        dram_s=dram,
        model_s=max(issue, dram, LAUNCH_FLOOR_S),
        share=sum(r.get("share", 0.0) for r in small),
    )
    out, placed = [], False
    for r in rows:
        if any(r is m for m in small):
            if not placed:
                out.append(merged)
                placed = True
            continue
        out.append(r)
    return out


def _launch_json(r: dict) -> dict:
    out = {k: v for k, v in r.items() if k != "est"}
    e = r.get("est")
    if e is not None:
        out.update(
            programs=e.programs,
            warps=e.warps,
            regs=e.regs,
            smem=e.smem,
            ctas=e.ctas,
            resident_warps=e.resident_warps,
            limiter=e.limiter,
            waves=e.waves.waves,
            efficiency=e.waves.efficiency,
            bound=e.bound,
        )
    return out


def _us(s: float) -> str:
    return f"{s * 1e6:.1f}"


LAUNCH_HEADER = (
    f"{'launch':<34} {'grid':>6} {'w':>2} {'regs':>4} {'spill':>5} {'ROWS':>4} {'CTA':>3} {'w/SM':>4} {'waves':>5} "
    f"{'eff':>4} {'issue':>7} {'latency':>7} {'waved':>7} {'DRAM':>7} {'model':>7} {'work':>5}"
)


def _launch_line(r: dict, rows_per_program=None) -> str:
    if r["glue"]:
        return (
            f"{r['kernel'][:34]:<34} {'':>6} {'':>2} {'':>4} {'':>5} {'':>4} {'':>3} {'':>4} {'':>5} {'':>4} "
            f"{_us(r['issue_s']):>7} {_us(r['latency_s']):>7} {_us(r['wave_s']):>7} {_us(r['dram_s']):>7} "
            f"{_us(r['model_s']):>7} {r['share']:>5.0%}"
        )
    e = r["est"]
    return (
        f"{r['kernel'][:34]:<34} {e.programs:>6} {e.warps:>2} {e.regs:>4} {r['spill']:>5} "
        f"{rows_per_program if rows_per_program is not None else '':>4} {e.ctas:>3} {e.resident_warps:>4} "
        f"{e.waves.waves:>5.2f} {e.waves.efficiency:>4.0%} {_us(e.issue_s):>7} {_us(e.latency_s):>7} "
        f"{_us(e.wave_s):>7} {_us(e.dram_s):>7} {_us(e.model_s):>7} {r['share']:>5.0%}"
    )


def print_launches(title: str, rows: List[dict], rows_per_program: Optional[List] = None) -> None:
    """A call's launches, one line each (torch glue folded into one line), and their total."""
    print(f"\n{title}")
    print(LAUNCH_HEADER)
    glue = [r for r in rows if r["glue"]]
    for k, r in enumerate(rows):
        if not r["glue"]:
            print(_launch_line(r, rows_per_program[k] if rows_per_program else None))
    if glue:
        g = dict(kernel=f"torch glue ({len(glue)} launches)", glue=True, share=sum(r["share"] for r in glue))
        g.update({k: sum(r[k] for r in glue) for k in ("issue_s", "latency_s", "wave_s", "dram_s", "model_s")})
        print(_launch_line(g))
    t = _totals(rows)
    print(
        f"{'total (' + str(len(rows)) + ' launches)':<34} {'':>6} {'':>2} {'':>4} {'':>5} {'':>4} {'':>3} {'':>4} "
        f"{'':>5} {'':>4} {_us(t['issue_s']):>7} {_us(t['latency_s']):>7} {_us(t['wave_s']):>7} "
        f"{_us(t['dram_s']):>7} {_us(t['model_s']):>7}"
    )


def fused_ssim_rows(ck, gpu: GPU, shape: Sequence[int], op: str, mode: str) -> List[dict]:
    """fused-ssim's launches for ``op`` ("ssim" or "dssim_l1"; fp32) in ``mode``: its kernels
    (:data:`FUSED_SSIM_FWD` ...), the ``zeros_like`` of every output it allocates, the map's mean
    and its backward (a full-size dL/dmap), and for D-SSIM + L1 the torch L1 term recorded."""
    n = 1
    for d in shape:
        n *= d
    grad = TABLE_MODES[mode][0]
    kernels = [FUSED_SSIM_FWD if grad else FUSED_SSIM_FWD_NOGRAD] + ([FUSED_SSIM_BWD] if grad else [])
    glue = [("zeros_like", n, 4 * n)] * (4 if grad else 1) + [("mean", n, 4 * n)]
    if grad:
        glue += [("mean backward", n, 4 * n), ("zeros_like", n, 4 * n)]
    rows = []
    for k in kernels:
        est = estimate_cuda_kernel(gpu, k, shape)
        rows.append(
            dict(
                kernel=k.name,
                glue=False,
                spill=0,
                warp_instructions=k.warp_instructions(shape),
                dram_bytes=n * (k.read_bytes + k.write_bytes),
                est=est,
                issue_s=est.issue_s,
                latency_s=est.latency_s,
                wave_s=est.wave_s,
                dram_s=est.dram_s,
                model_s=est.model_s,
            )
        )
    for name, el, nb in glue:
        wi = el * ck.GLUE_WARP_INSTR_PER_ELEMENT
        issue, dram, model = estimate_glue(gpu, wi, nb)
        rows.append(
            dict(
                kernel=f"torch {name}",
                glue=True,
                elements=el,
                warp_instructions=wi,
                dram_bytes=nb,
                issue_s=issue,
                latency_s=issue,
                wave_s=issue,
                dram_s=dram,
                model_s=model,
            )
        )
    if op == "dssim_l1":
        l1 = ck.Call(lambda x, y: (x - y).abs().mean(), tuple(shape), "float32", TABLE_MODES[mode])
        rows += [r for r in _launch_rows(ck, gpu, ck.record_calls([gpu.arch], {"l1": l1})["l1"], None)]
    total = sum(r["warp_instructions"] for r in rows)
    for r in rows:
        r["share"] = r["warp_instructions"] / total
    return rows


def main(argv=None) -> int:
    global WARP_CYCLES_PER_ISSUE, LAUNCH_FLOOR_S
    import argparse
    import json
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import check_kernels as ck

    from splatloss.atomic import atomic_output, check_output_file

    ap = argparse.ArgumentParser(description="Launch model of the loss calls: issue, latency, waves, DRAM (modelled)")
    ap.add_argument("--arch", type=int, default=90, choices=sorted(GPUS))
    ap.add_argument("--shapes", nargs="+", default=[_shape_label(s) for s in TABLE_SHAPES], help="BxCxHxW ...")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--ops", nargs="+", default=list(DEFAULT_OPS), choices=list(TABLE_OPS))
    ap.add_argument("--modes", nargs="+", default=list(TABLE_MODES), choices=list(TABLE_MODES))
    ap.add_argument("--rows", type=int, nargs="*", default=list(SEARCH_ROWS), help="rows per program to try")
    ap.add_argument("--maxnreg", type=int, nargs="*", default=list(SEARCH_MAXNREG), help="register ceilings to try")
    ap.add_argument("--launches", action="store_true", help="print every call's launches, current and proposed")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--cycles-per-issue", type=float, default=WARP_CYCLES_PER_ISSUE, help="assumption L (A2)")
    ap.add_argument("--launch-floor-us", type=float, default=LAUNCH_FLOOR_S * 1e6, help="assumption A7")
    args = ap.parse_args(argv)
    shapes = []
    for s in args.shapes:
        try:
            shape = tuple(int(d) for d in s.lower().split("x"))
        except ValueError:
            shape = ()
        if len(shape) != 4 or min(shape) < 1:
            ap.error(f"--shapes takes BxCxHxW with positive sizes, got {s!r}")
        shapes.append(shape)
    if any(r < 1 for r in args.rows):
        ap.error(f"--rows takes rows per program >= 1, got {args.rows}")
    if any(not 1 <= r <= 255 for r in args.maxnreg):
        ap.error(f"--maxnreg takes register ceilings from 1 to 255, got {args.maxnreg}")
    if not args.cycles_per_issue > 0 or not args.launch_floor_us >= 0:
        ap.error(
            f"--cycles-per-issue must be > 0 and --launch-floor-us >= 0, got {args.cycles_per_issue} and "
            f"{args.launch_floor_us}"
        )
    if args.json:  # checked before the minutes of compiling, not after
        try:
            check_output_file("--json", args.json)
        except ValueError as e:
            ap.error(str(e))
    WARP_CYCLES_PER_ISSUE, LAUNCH_FLOOR_S = args.cycles_per_issue, args.launch_floor_us * 1e-6
    gpu = GPUS[args.arch]
    calls = table_calls(ck, shapes, args.dtypes, args.ops, args.modes)
    import importlib

    base_rows = getattr(importlib.import_module(ck.GEOMETRY_MODULE), "CUDA_ROWS", None)
    recorded = {None: ck.record_calls([gpu.arch], calls)}
    for R in args.rows:
        if R != base_rows:
            recorded[R] = ck.record_calls([gpu.arch], calls, geometry={"CUDA_ROWS": R})
    cache: Dict[str, dict] = {}
    counts: Dict[tuple, dict] = {}
    report = dict(
        gpu=gpu.__dict__,
        assumptions=dict(
            warp_cycles_per_issue=WARP_CYCLES_PER_ISSUE, dram_efficiency=DRAM_EFFICIENCY, launch_floor_s=LAUNCH_FLOOR_S
        ),
        calls={},
    )
    summary = []
    for name, call in calls.items():
        op, mode = name.split()[:2]
        current = _launch_rows(ck, gpu, recorded[None][name], cache, counts_cache=counts)
        kinds = [r["kernel"] for r in current]
        heavy = {i for i, r in enumerate(current) if not r["glue"] and r["share"] >= TARGET_SHARE}
        options = [(None, None, current)]
        for R, rec in recorded.items():
            for m in [None] + list(args.maxnreg):
                if R is None and m is None:
                    continue
                rows = _launch_rows(ck, gpu, rec[name], cache, maxnreg=m, counts_cache=counts, heavy=heavy)
                if [r["kernel"] for r in rows] != kinds:
                    raise RuntimeError(f"{name}: rows={R} launches other kernels than the launched geometry")
                options.append((R if R is not None else base_rows, m, rows))
        proposed, chosen, missed_all = [], [], []
        for i, r in enumerate(current):
            if r["glue"]:
                proposed.append(r)
                chosen.append(None)
                continue
            label, est, missed = choose_geometry([((R, m), rows[i]["est"], rows[i]["spill"]) for R, m, rows in options])
            pick = next(rows[i] for R, m, rows in options if (R, m) == label)
            proposed.append(dict(pick, share=r["share"]))
            # the rows the launch ran with: below the searched CUDA_ROWS where the launchers step down
            chosen.append(pick.get("launched_rows") or (label[0] if label[0] is not None else base_rows))
            if r["share"] >= TARGET_SHARE and missed:
                missed_all.append(f"{r['kernel']}: " + "; ".join(missed))
        plan = proposed
        if op == "ms_ssim":  # the batched launch's rows: the option whose merged launch is fastest
            best = None
            for R, m, rows in options:
                merged = [r for r in batch_launches(gpu, rows) if r["kernel"].endswith(" batched")]
                if merged and merged[0]["spill"] == 0 and (best is None or merged[0]["model_s"] < best[0]["model_s"]):
                    best = (dict(merged[0], rows=R), R)
            plan = batch_launches(gpu, proposed)
            if best is not None:
                plan = [best[0] if r["kernel"].endswith(" batched") else r for r in plan]
        plan = fuse_scalar_glue(plan)
        cur_rows = [(r.get("launched_rows") or base_rows) if not r["glue"] else None for r in current]
        if args.launches:
            print_launches(f"{name}: launched geometry (modelled, {gpu.name})", current, cur_rows)
            print_launches(f"{name}: proposed geometry (modelled, {gpu.name})", proposed, chosen)
            if len(plan) != len(proposed):
                what = "coarse scales batched, " if op == "ms_ssim" else ""
                print_launches(f"{name}: proposed, {what}scalar glue fused (modelled, {gpu.name})", plan)
            for m in missed_all:
                print(f"  misses a target: {m}")
        for r, R in zip(proposed, chosen):
            r["rows"] = R
        for r, R in zip(current, cur_rows):
            r["rows"] = R
        entry = dict(
            current=_totals(current),
            proposed=_totals(proposed),
            plan=_totals(plan),
            launches=len(current),
            plan_launches=len(plan),
            missed_targets=missed_all,
            current_launches=[_launch_json(r) for r in current],
            proposed_launches=[_launch_json(r) for r in proposed],
            plan_launch_list=[_launch_json(r) for r in plan],
        )
        dtype, shape = name.split()[3], tuple(int(d) for d in name.split()[2].split("x"))
        if op in ("ssim", "dssim_l1") and dtype == "float32":
            fs = fused_ssim_rows(ck, gpu, shape, op, mode)
            entry["fused_ssim"] = _totals(fs)
            entry["fused_ssim_launches"] = [_launch_json(r) for r in fs]
            if args.launches:
                print_launches(f"{name}: fused-ssim (modelled geometry, {gpu.name})", fs)
        report["calls"][name] = entry
        summary.append((name, entry))
    print(
        f"\nModelled, not measured: {gpu.name} ({gpu.sms} SMs, {gpu.clock_hz / 1e9:.3f} GHz boost, "
        f"{gpu.dram_bytes_per_s / 1e12:.2f} TB/s x {DRAM_EFFICIENCY}); L = {WARP_CYCLES_PER_ISSUE:g} cycles per issue "
        f"of a lone warp; launch floor {LAUNCH_FLOOR_S * 1e6:g} us. Times in us; 'model' = sum over launches of "
        "max(wave-quantised, DRAM, floor)."
    )
    width = max([42] + [len(name) for name, _ in summary])
    hdr = (
        f"{'call':<{width}} {'issue':>7} {'latency':>7} {'waved':>7} {'DRAM':>7} {'model':>7} | {'proposed':>8} "
        f"{'plan':>7} | {'fused-ssim':>10} {'launches':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for name, e in summary:
        c, p, b = e["current"], e["proposed"], e["plan"]
        fs = e.get("fused_ssim")
        print(
            f"{name:<{width}} {_us(c['issue_s']):>7} {_us(c['latency_s']):>7} {_us(c['wave_s']):>7} "
            f"{_us(c['dram_s']):>7} "
            f"{_us(c['model_s']):>7} | {_us(p['model_s']):>8} {(_us(b['model_s']) if b else '-'):>7} | "
            f"{(_us(fs['model_s']) if fs else '-'):>10} {e['launches']:>8}"
        )
    for op, base, title in (
        ("ms_ssim", "ssim", "MS-SSIM / SSIM loss"),
        ("dssim_l1_masked", "dssim_l1", "masked / unmasked D-SSIM + L1"),
    ):
        ratios = []
        for name, e in summary:
            this, rest = name.split(" ", 1)
            ref = report["calls"].get(f"{base} {rest}")
            if this == op and ref is not None:
                ratios.append((rest, *(e[k]["model_s"] / ref[k]["model_s"] for k in ("current", "proposed", "plan"))))
        if ratios:
            print(f"\n{title}, modelled: {'call':<32} {'launched':>8} {'proposed':>8} {'plan':>8}")
            for rest, a, b, c in ratios:
                print(f"{'':<{len(title) + 12}}{rest:<33} {a:>8.2f} {b:>8.2f} {c:>8.2f}")
    if args.json:
        with atomic_output(args.json) as tmp, open(tmp, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
