"""Rows per program measured on the GPU, per launch shape: the launchers' short autotune list.

:func:`.launch.geometry` plans the rows per program from a model (whole waves of the SMs' resident
programs, :func:`.launch.plan_rows`); the model is an upper bound the GPU corrects
(docs/cost_model.md). On CUDA each launcher therefore hands its launch to :func:`run`, which, the
first time a launch shape is seen, runs every candidate of a short list once (to compile and
allocate), times them with CUDA events over :data:`REPEATS` alternated rounds (device time: the
GPU is held back while the host enqueues, so the host's per-launch cost is not counted), and keeps
the fastest for the rest of the process where it beats the planned rows by :data:`MARGIN`.
``ROWS`` is a run-time argument of every kernel, so the list costs launches, not compiles: tens of
milliseconds per shape, once.

The candidates (:func:`candidates`): the planned rows, ``2 x CUDA_ROWS``, ``CUDA_ROWS`` and
``ROW_STEPS``, each balanced over its row chunks, one per distinct chunk count. A launcher may add
other configurations of its own (``alternatives``: MS-SSIM's coarser scales add their programs at
half the lanes, four warps each, where the launch model cannot tell the two apart); those cost one
more compile.

What changes with the rows: the loss values' last bits (the per-program partial sums are added
in a fixed order, but how many there are follows the rows); the gradients do not (every gradient
pixel is formed by one program, its sums in row order whatever the chunk). The measurement is
skipped, and the planned rows launched, where that matters or cannot be done:

* ``torch.use_deterministic_algorithms(True)``: the same rows, so the same bits, on every run;
* ``SPLATLOSS_TRITON_TUNE=0`` in the environment (read at import) or :data:`ENABLED` set False;
* while a CUDA graph is being captured (a shape first seen there launches its planned rows; warm
  up before capturing to capture the measured ones);
* for new shapes once :data:`MAX_SHAPES` have been measured in the process;
* off CUDA (the interpreter; tests set :data:`FORCE` to run the list there, timed on the host).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, Hashable, List, Sequence, TypeVar

import torch

from . import launch

__all__ = [
    "ENABLED",
    "LAUNCHES",
    "MARGIN",
    "MAX_SHAPES",
    "REPEATS",
    "candidates",
    "chosen",
    "clear",
    "env_switch",
    "run",
]

T = TypeVar("T")

_SWITCH = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}


def env_switch(name: str, default: str) -> bool:
    """The on/off switch in environment variable ``name`` (``default`` when unset); any other value
    is refused, naming the variable and the value."""
    value = os.environ.get(name, default)
    if value.strip().lower() not in _SWITCH:
        raise ValueError(f"{name} must be one of 1/0, true/false, on/off, yes/no, got {value!r}")
    return _SWITCH[value.strip().lower()]


#: Measure the rows per launch shape on CUDA (``SPLATLOSS_TRITON_TUNE=0``: plan them only).
ENABLED = env_switch("SPLATLOSS_TRITON_TUNE", "1")
#: Timed rounds per candidate (each round alternates the candidates; the minimum counts), and the
#: launches timed back to back in each.
REPEATS = 3
LAUNCHES = 2
#: A candidate replaces the planned rows only if faster by this fraction (timing noise keeps the plan).
MARGIN = 0.02
#: Launch shapes measured per process at most; later new shapes launch their planned rows (a
#: training loop over images of ever new sizes would otherwise pay the list on every call).
MAX_SHAPES = 64
#: Run the list off CUDA too (the interpreter, timed on the host): for tests of the mechanism.
FORCE = False

_chosen: Dict[Hashable, Hashable] = {}


def candidates(planned: int, rows: int) -> List[int]:
    """Rows per program to measure for ``rows`` rows of work: the planned rows and the launch
    model's steps, each balanced over its chunks (``ceil(rows / ceil(rows / r))``: the same grid,
    no short last chunk), one per distinct number of chunks (the planned rows exactly as planned),
    at most twice the plan's chunks (the per-program scratch and partial sums grow with them: a
    16-row candidate for five 4K images would take 336 MB of scratch, the plan 42 MB)."""
    rows = max(rows, 1)
    most = 2 * launch.cdiv(rows, planned)
    by_chunks: Dict[int, int] = {launch.cdiv(rows, planned): planned}
    for r in (2 * launch.CUDA_ROWS, launch.CUDA_ROWS, *launch.ROW_STEPS):
        n = launch.cdiv(rows, r)
        if n <= most:
            by_chunks.setdefault(n, launch.cdiv(rows, n))
    return sorted(by_chunks.values())


def chosen() -> Dict[Hashable, Hashable]:
    """The rows kept so far, per launch key (a copy)."""
    return dict(_chosen)


def clear() -> None:
    """Forget every measured choice (the next call of each shape measures again)."""
    _chosen.clear()


def _active(device: torch.device) -> bool:
    if not ENABLED or torch.are_deterministic_algorithms_enabled():
        return False
    if device.type == "cuda":
        return not torch.cuda.is_current_stream_capturing()
    return FORCE


def _timed(fn: Callable[[Hashable], object], rows: Hashable, device: torch.device, host_s: float) -> float:
    """Seconds (host) or milliseconds (CUDA: device time) of :data:`LAUNCHES` back-to-back runs."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(LAUNCHES):
            fn(rows)
        return time.perf_counter() - t0
    with torch.cuda.device(device):  # the launch's device and its current stream
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # the GPU waits while the host enqueues the launches, so the events see device time only,
        # not the host's per-launch cost (which exceeds a coarse MS-SSIM scale's kernel): twice the
        # host's time at 2 GHz (longer on a slower clock)
        torch.cuda._sleep(int((2 * LAUNCHES * host_s + 20e-6) * 2e9))
        start.record()
        for _ in range(LAUNCHES):
            fn(rows)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def _measure(fn: Callable[[Hashable], object], cands: List[Hashable], planned: int, device: torch.device) -> Hashable:
    for r in cands:  # warm: the kernel compiles once (ROWS is a run-time argument), buffers allocate
        fn(r)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    host_s = 0.0
    for r in cands:  # the host's time to enqueue one launch (the longest: the GPU must outwait it)
        t0 = time.perf_counter()
        fn(r)
        host_s = max(host_s, time.perf_counter() - t0)
    best = {r: float("inf") for r in cands}
    for _ in range(REPEATS):
        for r in cands:
            best[r] = min(best[r], _timed(fn, r, device, host_s))
    fastest = min(cands, key=lambda r: best[r])
    return fastest if best[fastest] < (1.0 - MARGIN) * best[planned] else planned


def run(
    key: Hashable,
    planned: int,
    rows: int,
    fn: Callable[[Hashable], T],
    device: torch.device,
    alternatives: Sequence[Hashable] = (),
) -> T:
    """``fn(rows_per_program)`` with the rows kept for ``key`` (measured on its first call where
    measuring is on, see the module's docstring), else ``fn(planned)``. ``fn`` launches the kernel
    and returns its outputs; it may run several times on a first call, so it must only write
    (never accumulate into) what it returns. ``rows``: the rows of work (the map's or image's
    height). ``alternatives``: other arguments ``fn`` takes (another geometry of the launch),
    measured with the rows' list and kept the same way."""
    if not _active(device):
        return fn(planned)
    best = _chosen.get(key)
    if best is None:
        if len(_chosen) >= MAX_SHAPES:
            return fn(planned)
        cands = candidates(planned, rows) + [a for a in alternatives]
        best = cands[0] if len(cands) == 1 else _measure(fn, cands, planned, device)
        _chosen[key] = best
    return fn(best)
