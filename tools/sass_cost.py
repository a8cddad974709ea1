"""The launch model of the loss calls' kernels: issue, occupancy / latency, waves and DRAM; no GPU needed.

The counts of what each compiled kernel issues come from :mod:`tools.kernel_analysis` (SASS blocks,
loops and their trip counts from the Triton IR) through ``tools/check_kernels.py``, which records and
compiles the launches. The launch model (docs/cost_model.md) turns those counts into four bounds per
launch: issue-bound (every issue slot of every SM busy), occupancy / latency-bound (resident warps
per SM from registers, shared memory and warps per program; a warp alone on its scheduler issuing
once per :data:`WARP_CYCLES_PER_ISSUE` cycles), wave-quantised (programs over SMs x programs per
SM, the last wave at the occupancy it leaves) and DRAM-bound, and searches rows per program and
register ceilings for geometry that meets its targets. Run ``python tools/sass_cost.py
[--launches]`` for the tables of the loss calls (SSIM, D-SSIM + L1, MS-SSIM; forward and forward +
backward; 1080p, five 1080p frames and 4K; float32 and bfloat16), with fused-ssim's kernels modelled
beside them.

Importable by tests: the model itself needs the standard library only; ``main`` imports
``tools.check_kernels`` when it runs, because importing that module turns the Triton interpreter
off for the whole process (it compiles for real).
"""

from __future__ import annotations

import os
import sys

if not __package__:
    # run as ``python tools/sass_cost.py``: Python puts tools/, not the repository root, on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import dataclass  # noqa: E402
from typing import Dict, List, Optional, Sequence, Tuple  # noqa: E402

from tools.kernel_analysis import occupancy  # noqa: E402

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

    from splatloss.atomic import atomic_output, check_output_file
    from tools import check_kernels as ck  # here, not at the top: see the module's docstring

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
