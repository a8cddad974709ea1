"""Launch geometry of the Triton kernels: lanes, rows and warps per program, register ceilings,
launch options, the device guard, and the sizes of the SSIM map.

A program owns a strip of ``F`` map (or gradient) columns of one image channel -- or, when a whole
row fits in ``F``, ``G = BW // F`` channel rows side by side ("lanes": one column of one channel
per lane, ``BW`` lanes) -- and streams down ``ROWS`` rows of it (:mod:`.columns` and :mod:`.ring`
describe the two bodies that do the filtering). Everything here runs on the host; the kernels
import only :data:`COLUMN_TAPS` (which body a window size compiles).
"""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import triton.language as tl
from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction

#: Largest window the kernels accept. Tap / ring tiles are ``KP = next_pow2(K)`` rows deep; up to
#: 15 taps programs have 128 lanes, 17..31 taps 64 lanes (so a thread still holds 8 values of each
#: ``[KP, lanes]`` tile and nothing spills, tools/check_kernels.py); 33+ taps would need 32-lane
#: programs, narrower than the backward's ``K - 1`` halo, so they are refused.
MAX_WINDOW = 31

_PADDING_CODE = {"valid": 0, "same": 1, "reflect": 2}


class Geometry(NamedTuple):
    """Launch geometry: ``bw`` lanes per program, frame width ``f`` (map columns per strip in the
    forward; gradient columns + ``K - 1`` halo in the backward), ``rows`` streamed per program,
    ring depth ``kp`` (next power of two >= window size), ``warps``."""

    bw: int
    f: int
    rows: int
    kp: int
    warps: int


#: Rows streamed per program on CUDA (at most: see :data:`ROW_STEPS`); the interpreter (one program
#: at a time) uses wider and longer programs, see :func:`geometry`. Tests set
#: ``FORCE_CUDA_GEOMETRY`` to run the CUDA geometry in the interpreter.
CUDA_ROWS = 128
FORCE_CUDA_GEOMETRY = False

#: Shorter programs for launches whose ``CUDA_ROWS`` grid makes fewer than :data:`FULL_WAVES` waves
#: of the GPU's resident slots (SMs x programs per SM): of ``CUDA_ROWS`` and these (those below it),
#: the rows with the least wave-quantised time, ``ceil(programs / slots) x (rows + halo rows)`` (a
#: program streams its rows and the window's halo serially). A grid of a few long programs
#: (MS-SSIM's second scale at 1080p: 60 programs of 128 rows) otherwise leaves most SMs idle for as
#: long as a full scale takes, and a grid of 1.2 waves idles most of its second wave. Grids of more
#: waves keep ``CUDA_ROWS`` (measured fastest at five 1080p frames on an H200, docs/gpu_check.md).
#: ``ROWS`` is a plain launch argument (no recompile). Besides these steps the plan tries the rows
#: that split the tallest problem into equal chunks, ``ceil(rows / n)`` (down to the last step), so
#: that a grid just over a whole number of waves can shed its last programs (:func:`plan_rows`). On
#: 132 SMs: 99 rows for one 1080p image (backward: 264 programs, 2 per SM; forward 495 of 528
#: slots), 99 for one 4K image's backward (4 full waves), 39 for MS-SSIM's coarser scales' backward
#: at one 1080p image (259 programs in one wave, where 50 made 183 of 264 slots). An empty tuple
#: turns the search off (``CUDA_ROWS`` everywhere).
ROW_STEPS = (99, 64, 50, 32, 25, 16)

#: Waves from which a grid keeps ``CUDA_ROWS`` (:data:`ROW_STEPS`): with 4 or more, a partial last
#: wave costs at most a fifth of the launch.
FULL_WAVES = 4

#: SMs assumed where no CUDA device is asked (``FORCE_CUDA_GEOMETRY`` in the interpreter): an H100.
MODEL_SMS = 132
#: Its compute capability (major * 10 + minor): sm_90.
MODEL_ARCH = 90
_SMS: dict = {}
_ARCH: dict = {}


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launch sizes on the host (``triton.cdiv`` is a constexpr function there,
    whose argument unwrapping costs more than the division: dozens of calls per MS-SSIM loss)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two at least ``n`` (0 for 0), as ``triton.next_power_of_2``, on the host."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def device_arch(device: torch.device) -> int:
    """Compute capability of ``device`` as ``major * 10 + minor`` (cached per device), or
    :data:`MODEL_ARCH` off CUDA (and on ROCm, where it only picks register ceilings that the HIP
    backend does not take)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return MODEL_ARCH
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _ARCH:
        major, minor = torch.cuda.get_device_capability(index)
        _ARCH[index] = major * 10 + minor
    return _ARCH[index]


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (cached per device), or :data:`MODEL_SMS` off CUDA."""
    if device.type != "cuda":
        return MODEL_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def programs_per_sm(warps: int, maxnreg: int) -> int:
    """Programs of ``warps`` warps an SM holds at once with ``maxnreg`` registers per thread (sm_80 /
    sm_90: 64K registers, allocated per warp in multiples of 256, i.e. 8 per thread; 64 warps; 32
    programs), at least 1."""
    regs = cdiv(min(maxnreg, 255), 8) * 8
    return max(1, min(65536 // (regs * 32 * warps), 64 // warps, 32))


#: Register ceilings passed to the launches (and seen by tools/check_kernels.py). Column kernels
#: (``K <= COLUMN_TAPS``): 128 registers, so that four 4-warp CTAs (16 warps, 8-warp programs: two)
#: are resident per SM; their pending sums fit without spilling at sm_80 and sm_90 (checked for
#: every launched variant by tools/check_kernels.py), except the "reflect" backward's (its
#: mirrored taps: :func:`bwd_maxnreg`). Those and the ring kernels: 255, without which ptxas
#: chose 128 registers plus a 4-byte spill for several ring-kernel backward variants at sm_80.
COLUMN_MAXNREG = 128
MAXNREG = 255
#: The lean forward column launches' ceiling (:func:`fwd_maxnreg`) on sm_90 and newer: their last
#: ``K // 2`` rows' sums kept in scratch (:func:`.columns.vmoments_kept`), they fit 64 registers
#: there: eight 4-warp programs, 32 warps, per SM. On sm_8x the same code spills 16 to 40 B at 64
#: and fits 72 (:data:`FWD_MAXNREG_SM80`: seven programs, 28 warps).
FWD_MAXNREG = 64
FWD_MAXNREG_SM80 = 72


def launch_options(num_warps: int, hip: Optional[bool] = None, maxnreg: int = MAXNREG) -> dict:
    """Keyword options of a kernel launch: ``num_warps``, and the register ceiling ``maxnreg`` only
    on NVIDIA (Triton's HIP backend rejects it). ``hip`` defaults to whether torch was built for
    ROCm."""
    if hip is None:
        hip = torch.version.hip is not None
    return {"num_warps": num_warps} if hip else {"num_warps": num_warps, "maxnreg": maxnreg}


def device_guard(t: torch.Tensor):
    """Context in which to launch on ``t``'s device: Triton launches on the current CUDA device and
    stream, not the tensor's, so a tensor on ``cuda:1`` needs ``torch.cuda.device(1)`` around the
    launch. A no-op for CPU tensors (the interpreter)."""
    if t.device.type == "cuda":
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


#: Windows up to this many taps run the column kernels: one image column per thread, taps unrolled
#: into registers, the vertical sums as pending per-thread sums (registers grow with K: at 13+ taps
#: the heaviest backward variants spilled). Wider windows run the ring kernels (``[KP, lanes]``
#: tiles through an L1-resident scratch ring), whose registers do not grow with K.
COLUMN_TAPS = tl.constexpr(11)


def cuda_lanes(window_size: int) -> int:
    """Lanes (columns) per program on CUDA: 128, or 64 for the ring kernels' 32-deep tap tiles
    (K = 17..31)."""
    return 128 if next_power_of_2(window_size) <= 16 else 64


def cuda_warps(window_size: int) -> int:
    """Warps per program: one thread per lane for the column kernels; for the ring kernels each
    thread holds ``KP * lanes / (32 * warps)`` <= 8 values of every ``[KP, lanes]`` tile, so that
    no kernel spills (tools/check_kernels.py)."""
    lanes = cuda_lanes(window_size)
    if window_size <= COLUMN_TAPS.value:
        return lanes // 32
    return max(4, (next_power_of_2(window_size) * lanes) // (8 * 32))


def geometry(
    frame: int,
    rows: int,
    window_size: int,
    bc: int,
    device: torch.device,
    halo: bool = False,
    maxnreg: int = 128,
    wide_halo: bool = True,
) -> Geometry:
    """Geometry for rows of ``frame`` lanes of work (map width, or image width + K - 1 halo).

    On CUDA: 128 lanes (64 for windows of 17..31 taps), 128 rows per program; rows of at most
    half the lanes are packed several channels per program (MS-SSIM's coarse scales). ``halo``
    (the backward, whose programs recompute ``K - 1`` columns of their neighbours): the column
    kernels take 256 lanes and 8 warps, so that the recomputed halo is 4 %, not 8 %, of the work
    (``wide_halo`` False: 128 lanes and 4 warps, for kernels whose registers would leave an SM one
    8-warp program). In the
    interpreter programs run one after the other at a cost per operation, not per element: one
    program takes every row and column (up to 2048 lanes) of as many channels as fit.

    Rows per program: ``CUDA_ROWS``, or fewer (:data:`ROW_STEPS`) where that grid would make fewer
    than :data:`FULL_WAVES` waves of the SMs' resident slots (``maxnreg``: the launch's register
    ceiling, which sets how many programs an SM holds).

    Cached: a launcher plans on every call, and the geometry follows from these arguments and the
    module's settings alone (part of the cache key).
    """
    cuda = device.type == "cuda" or FORCE_CUDA_GEOMETRY
    sms = sm_count(device) if cuda else 0
    steps = tuple(ROW_STEPS)
    return _plan_geometry(frame, rows, window_size, bc, cuda, sms, halo, maxnreg, wide_halo, CUDA_ROWS, steps)


@functools.lru_cache(maxsize=4096)
def _plan_geometry(
    frame: int,
    rows: int,
    window_size: int,
    bc: int,
    cuda: bool,
    sms: int,
    halo: bool,
    maxnreg: int,
    wide_halo: bool,
    most: int,
    steps: Tuple[int, ...],
) -> Geometry:
    kp = next_power_of_2(window_size)
    need = next_power_of_2(max(frame, 1))
    if cuda:
        lanes = cuda_lanes(window_size)
        warps = cuda_warps(window_size)
        if halo and wide_halo and window_size <= COLUMN_TAPS.value:
            lanes, warps = 2 * lanes, 2 * warps
        f = min(lanes, need)
        # programs per row chunk: lane groups x column strips (a backward strip yields f - (K - 1)
        # gradient columns of the frame - (K - 1) image columns)
        halo_cols = window_size - 1 if halo else 0
        per_chunk = cdiv(bc, lanes // f) * cdiv(max(frame - halo_cols, 1), f - halo_cols)
        slots = sms * programs_per_sm(warps, maxnreg)
        halo_rows = (2 if halo else 1) * (window_size - 1)
        rows = max(rows, 1)

        n_rows = plan_rows((per_chunk,), (rows,), slots, halo_rows, most, steps)
        return Geometry(bw=lanes, f=f, rows=n_rows, kp=kp, warps=warps)
    f = min(need, 2048)
    bw = f * min(next_power_of_2(bc), max(1, 2048 // f))
    return Geometry(bw=bw, f=f, rows=max(rows, 1), kp=kp, warps=4)


def check_scales(window_size: int, dims: Sequence[tuple]) -> None:
    """What a launch over MS-SSIM's coarser scales (``dims``: their ``(H, W)``) needs: the column
    body (windows up to :data:`COLUMN_TAPS` taps) and each scale TF's ceil half of the one before
    (the kernels derive every scale's sizes from the first's)."""
    if window_size > COLUMN_TAPS.value:
        raise ValueError(
            f"the batched scales run the column body: window_size <= {COLUMN_TAPS.value}, got {window_size}"
        )
    for (h, w), (h2, w2) in zip(dims, dims[1:]):
        if (h2, w2) != ((h + 1) // 2, (w + 1) // 2):
            raise ValueError(f"dims must halve scale after scale (TF's ceil halves), got {list(dims)}")


def batched_rows(
    per_chunk: Sequence[int],
    heights: Sequence[int],
    window_size: int,
    warps: int,
    maxnreg: int,
    device: torch.device,
    halo: bool = True,
) -> int:
    """Rows per program of a launch holding several problems (MS-SSIM's coarser scales):
    ``per_chunk[s]`` programs per row chunk of problem ``s``, ``heights[s]`` its rows (the
    backward's: image rows; ``halo`` False, the forward's: map rows). On CUDA the rule of
    :func:`geometry` over the launch's programs together: ``CUDA_ROWS`` where that makes at least
    :data:`FULL_WAVES` waves, else of it and :data:`ROW_STEPS` those of least wave-quantised time (a
    program's time: its rows, at most the tallest problem's, plus the halo's). In the interpreter:
    the tallest problem's rows (one chunk per problem)."""
    top = max(heights)
    if device.type != "cuda" and not FORCE_CUDA_GEOMETRY:
        return max(top, 1)
    slots = sm_count(device) * programs_per_sm(warps, maxnreg)
    halo_rows = (2 if halo else 1) * (window_size - 1)
    return plan_rows(tuple(per_chunk), tuple(heights), slots, halo_rows, CUDA_ROWS, tuple(ROW_STEPS))


@functools.lru_cache(maxsize=4096)
def plan_rows(
    per_chunk: Tuple[int, ...], heights: Tuple[int, ...], slots: int, halo_rows: int, most: int, steps: Tuple[int, ...]
) -> int:
    """Rows per program of a launch whose problem ``s`` has ``per_chunk[s]`` programs per row chunk
    and ``heights[s]`` rows, on ``slots`` resident programs: ``most`` where that grid makes at least
    :data:`FULL_WAVES` waves; else, of ``most``, the ``steps`` below it and the rows that split the
    tallest problem into equal chunks (``ceil(top / n)``, down to the smallest step), those of least
    wave-quantised time ``ceil(programs / slots) x (rows + halo_rows)`` (ties: the longer programs).
    Cached: launchers plan on every call, and the rows follow from these integers alone."""
    top = max(heights)

    def programs(r: int) -> int:
        return sum(p * cdiv(h, r) for p, h in zip(per_chunk, heights))

    def waved(r: int) -> tuple:
        return (cdiv(programs(r), slots) * (min(r, top) + halo_rows), -r)

    if not steps or programs(most) >= FULL_WAVES * slots:
        return most
    return min(_row_tries(top, most, steps), key=waved)


def _row_tries(top: int, most: int, steps: Tuple[int, ...]) -> set:
    """The rows :func:`plan_rows` weighs: ``most``, the ``steps`` below it and the rows that split
    ``top`` rows into equal chunks, down to the smallest step."""
    least = min(steps)
    tries = {most, *(r for r in steps if r < most)}
    tries.update(r for r in (cdiv(top, n) for n in range(1, cdiv(top, least) + 1)) if least <= r < most)
    return tries


def group_rows(
    per_chunk: Sequence[int], height: int, window_size: int, warps: int, maxnreg: int, device: torch.device,
    halo: bool = True,
) -> int:  # fmt: skip
    """Rows per program of launches run one after the other, one per group of images, all at the
    same rows (their partial sums share one layout): ``per_chunk[g]`` programs per row chunk of
    group ``g``, ``height`` rows each. On CUDA the rows of :func:`plan_group_rows`; in the
    interpreter ``height`` (one chunk)."""
    if device.type != "cuda" and not FORCE_CUDA_GEOMETRY:
        return max(height, 1)
    slots = sm_count(device) * programs_per_sm(warps, maxnreg)
    halo_rows = (2 if halo else 1) * (window_size - 1)
    return plan_group_rows(tuple(per_chunk), max(height, 1), slots, halo_rows, CUDA_ROWS, tuple(ROW_STEPS))


def rows_over_groups(
    geo: Geometry, maxnreg: int, frame: int, height: int, window_size: int, B: int, group: int, C: int,
    device: torch.device, halo: bool,
) -> Geometry:  # fmt: skip
    """``geo`` (:func:`geometry` for a group of ``group`` images of ``C`` channels, ``frame`` lanes of
    work, ``height`` rows) for a batch of ``B`` run group after group: where the groups are uneven
    (five images as three and two), its rows planned over every group's launch
    (:func:`group_rows`)."""
    if B % group == 0:
        return geo
    halo_cols = window_size - 1 if halo else 0
    strips = cdiv(max(frame - halo_cols, 1), geo.f - halo_cols)
    per = [cdiv(min(group, B - b0) * C, geo.bw // geo.f) * strips for b0 in range(0, B, group)]
    return geo._replace(rows=group_rows(per, height, window_size, geo.warps, maxnreg, device, halo))


@functools.lru_cache(maxsize=1024)
def plan_group_rows(
    per_chunk: Tuple[int, ...], height: int, slots: int, halo_rows: int, most: int, steps: Tuple[int, ...]
) -> int:
    """:func:`plan_rows` for a sequence of launches (``per_chunk[g]``: launch ``g``'s programs per
    row chunk, ``height`` rows each): ``most`` where every launch makes at least :data:`FULL_WAVES`
    waves, else the candidate rows of least summed wave-quantised time,
    ``sum_g ceil(programs_g / slots) x (rows + halo_rows)``. Equal launches plan as one alone
    does; a smaller last group (five images as three and two) does not take the rows that would
    leave its last wave two-thirds empty."""
    if len(set(per_chunk)) == 1:
        return plan_rows(per_chunk[:1], (height,), slots, halo_rows, most, steps)
    if not steps or all(p * cdiv(height, most) >= FULL_WAVES * slots for p in per_chunk):
        return most

    def waved(r: int) -> tuple:
        waves = sum(cdiv(p * cdiv(height, r), slots) for p in per_chunk)
        return (waves * (min(r, height) + halo_rows), -r)

    return min(_row_tries(height, most, steps), key=waved)


#: Column strides up to which the backward kernels compile the images' shared column stride as a
#: constant (``SW``): 3 and 4 are channels-last RGB / RGBA images and (H, W, C) renders seen as
#: (1, C, H, W). With the stride a runtime value every tap's address is computed and the
#: one-gradient kernel spills 24 B at 128 registers (it then takes 255: 8 resident warps per SM); as
#: a constant it fits 128 without spilling (16 warps), as contiguous rows do.
COLUMN_STRIDES = 4


def shared_column_stride(img1: torch.Tensor, img2: torch.Tensor) -> int:
    """The column stride both images share when it is 2 to :data:`COLUMN_STRIDES` (the backward
    kernels' ``SW``), else 0 (contiguous rows, or a stride read at run time)."""
    sw = img1.stride(3)
    return sw if sw == img2.stride(3) and 1 < sw <= COLUMN_STRIDES else 0


def bwd_maxnreg(K: int, reflect: bool, both: bool = False, strided: bool = False) -> int:
    """Register ceiling of a backward launch: 128 (16 resident warps per SM) for the column
    kernels; under "reflect" (their mirrored vertical taps), with ``both`` gradients (two sets of
    pending adjoint sums beside the moments' rows and windows: 56 B of spills at 128) or on
    ``strided`` rows (columns not contiguous and their stride a runtime value: every tap's
    address computed, 8 to 24 B of spills at 128; the launcher compiles a stride shared by both
    images up to :data:`COLUMN_STRIDES` as a constant, which fits) they do not fit in 128
    registers, so those, like the ring kernels, get 255."""
    light = K <= COLUMN_TAPS.value and not (reflect or both or strided)
    return COLUMN_MAXNREG if light else MAXNREG


def lean_fwd_maxnreg(arch: int = MODEL_ARCH) -> int:
    """The lean forward launches' register ceiling on compute capability ``arch``."""
    return FWD_MAXNREG if arch >= 90 else FWD_MAXNREG_SM80


def fwd_maxnreg(
    K: int, reflect: bool = False, both_maps: bool = False, lean: bool = False, arch: int = MODEL_ARCH
) -> int:
    """Register ceiling of a forward launch: :func:`lean_fwd_maxnreg` (64 on sm_90: eight 4-warp
    programs, 32 warps, per SM; 72 on sm_8x) for the ``lean`` column launches, those that keep
    their last rows' sums in scratch (the SSIM statistics of contiguous rows, the fused loss's SSIM
    and L1 sums under "same" padding, and MS-SSIM's coarser scales; :func:`.forward.launch_fwd`;
    the masked forward without "reflect", :func:`.masked_kernels.launch_masked_fwd`); 128 for the
    other column kernels (a map written, strided rows or the fused loss under "valid" spill 8 to 40
    B at 64; the masked forward of images narrower than a program); 255 for the ring kernels and for
    the column kernel writing both maps (SSIM and cs) under "reflect" (8 B of spills at 128,
    sm_90). ``arch``: the device's compute capability (:func:`device_arch`)."""
    light = K <= COLUMN_TAPS.value and not (reflect and both_maps)
    if not light:
        return MAXNREG
    return lean_fwd_maxnreg(arch) if lean and not reflect else COLUMN_MAXNREG


#: Size arguments compiled as plain integers: Triton would otherwise specialise each that equals 1 or
#: is a multiple of 16, compiling a new variant for new image sizes / MS-SSIM scales for no gain.
SIZES = ("BC", "C", "H", "W", "Ho", "Wo", "n_chunks", "n_strips", "ROWS")


def padding_code(padding: str) -> int:
    if padding not in _PADDING_CODE:
        raise ValueError(f"padding must be one of {tuple(_PADDING_CODE)}, got {padding!r}")
    return _PADDING_CODE[padding]


def padding_shape(window_size: int, padding: str) -> tuple:
    """``(pad, reflect)`` of a padding: taps left of the centre (0 for "valid"), and whether the
    border mirrors (:class:`Problem`'s ``pad`` and ``reflect``)."""
    code = padding_code(padding)
    return (0 if code == 0 else window_size // 2), code == 2


def out_size(n: int, window_size: int, padding: str) -> int:
    """Side of the SSIM map: shrinks by ``window_size - 1`` with "valid", unchanged otherwise."""
    return n - window_size + 1 if padding == "valid" else n


class Problem(NamedTuple):
    """The sizes of one SSIM call: ``B, C, H, W``, window ``K``, padding ``pad`` (taps left of the
    centre, 0 for "valid"), ``reflect``, and the map's ``Ho x Wo``."""

    B: int
    C: int
    H: int
    W: int
    K: int
    pad: int
    reflect: bool
    Ho: int
    Wo: int


def problem(img1: torch.Tensor, window: torch.Tensor, padding: str) -> Problem:
    B, C, H, W = img1.shape
    K = window.shape[0]
    pad, reflect = padding_shape(K, padding)
    return Problem(B, C, H, W, K, pad, reflect, out_size(H, K, padding), out_size(W, K, padding))


# ------------------------------------------------------------------------------------------------
# Launches through the compiled kernel.
#
# ``kernel[grid](*args)`` (Triton's JITFunction.run) binds every argument, specialises it (dtype,
# 16-byte alignment, integers equal to 1 or multiples of 16), hashes the specialisation, looks the
# compiled kernel up and builds its launch metadata: 30-60 us of host time for the 30-60 arguments
# of these kernels, several launches per loss call. A training loop launches the same kernels on
# the same shapes step after step, so :func:`launch_kernel` keys the compiled kernel by what
# decides Triton's specialisation -- each tensor's dtype and alignment, every other argument's value
# -- and launches it through ``CompiledKernel.run``, the launcher that ``kernel[grid]`` ends in
# (4-7 us). The first launch of a key, and every launch under launch hooks (profilers), Triton's
# debug mode or instrumentation, inside a CUDA graph capture or a ``torch.compile`` trace, and in
# the interpreter, goes through ``kernel[grid]``: the same compiled kernel and arguments, so the
# results are bitwise the same either way.
# ------------------------------------------------------------------------------------------------

#: Compiled kernels by launch key, per kernel; a kernel past this many keys launches through
#: ``kernel[grid]`` for new keys (a loop over ever new shapes would otherwise grow the table).
MAX_KEYS = 256
#: False: every launch through ``kernel[grid]`` (``tools/host_time.py --verify`` launches each call
#: both ways and compares what reaches Triton's launcher).
CACHED = True
_TAILS: dict = {}


def _key(fn, args: tuple, kw: dict, device: int) -> tuple:
    """What decides Triton's specialisation of ``fn(*args, **kw)``: each tensor's dtype and 16-byte
    alignment, every other argument's value. A call site passes its tensors at the same places call
    after call; those places are found once per kernel and argument count."""
    places = fn.__dict__.get("_tensor_places")
    if places is None or places[0] != len(args):
        at = tuple(i for i, a in enumerate(args) if type(a) is torch.Tensor)
        rest = tuple(i for i in range(len(args)) if i not in at)
        places = fn._tensor_places = (len(args), at, operator.itemgetter(*rest) if rest else (lambda a: ()))
    _, at, others = places
    try:
        tensors = tuple((args[i].dtype, args[i].data_ptr() & 15) for i in at)
    except AttributeError:  # not a tensor where the first call had one: specialised by value
        tensors = tuple(args[i] for i in at)
    return (device, others(args), tensors, tuple(kw.values()))


def _plain_launch() -> bool:
    """Whether launches must go through ``kernel[grid]`` now (see above)."""
    rt = knobs.runtime
    # a hook is a chain of calls (Triton 3.7) or a callable / None (older Tritons)
    return (
        bool(getattr(rt.launch_enter_hook, "calls", rt.launch_enter_hook))
        or bool(getattr(rt.launch_exit_hook, "calls", rt.launch_exit_hook))
        or rt.debug
        or bool(knobs.compilation.instrumentation_mode)
        or torch.compiler.is_compiling()
    )


def launch_kernel(fn, grid: tuple, *args, **kw):
    """``fn[grid](*args, **kw)``, through the compiled kernel where the same launch key was seen
    before (see above). ``kw``: the kernel's constexpr arguments and launch options, given the same
    way at each call site."""
    table = fn.__dict__.get("_launch_keys")  # on the kernel object: a JITFunction hashes slowly
    if table is None:
        if not isinstance(fn, JITFunction):  # the interpreter
            return fn[grid](*args, **kw)
        table = fn._launch_keys = {}
    if not CACHED or _plain_launch() or (args[0].is_cuda and torch.cuda.is_current_stream_capturing()):
        return fn[grid](*args, **kw)
    active = driver.active
    device = active.get_current_device()
    key = _key(fn, args, kw, device)
    compiled = table.get(key)
    if compiled is None:
        compiled = fn[grid](*args, **kw)
        if len(table) < MAX_KEYS:
            table[key] = compiled
            # the constexpr arguments' values in signature order, after the positional ones
            names = fn.arg_names[len(args) :]
            defaults = {p.name: p.default for p in fn.params}
            _TAILS[compiled] = tuple(kw[n] if n in kw else defaults[n] for n in names)
        return compiled
    n = len(grid)
    compiled.run(
        grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, active.get_current_stream(device),
        compiled.function, compiled.packed_metadata, None, None, None, *args, *_TAILS[compiled],
    )  # fmt: skip
    return compiled
