"""What the Triton launchers must get right on real hardware, each checked where it can fail
without a GPU: the device guard, the ROCm launch options, the fake (meta) gradient strides under
torch.compile, and empty batches."""

import contextlib
import os

import pytest
import torch

import splatloss
from conftest import device_for
from splatloss.backends.triton import launch, masked_kernels

pytestmark = pytest.mark.triton
#: where the kernels run: the GPU when there is one, else the interpreter on the CPU
DEV = device_for("triton")


def test_launch_options_pass_maxnreg_only_on_nvidia():
    # Triton's HIP backend rejects maxnreg: every launch on ROCm would fail with it
    assert launch.launch_options(8, hip=True) == {"num_warps": 8}
    assert launch.launch_options(8, hip=False) == {"num_warps": 8, "maxnreg": launch.MAXNREG}
    # this torch is not a ROCm build: the default is the NVIDIA set
    assert launch.launch_options(4) == {"num_warps": 4, "maxnreg": launch.MAXNREG}


def test_host_launch_arithmetic_equals_tritons():
    # the launchers size their grids with these instead of Triton's constexpr functions
    import triton

    assert [launch.next_power_of_2(n) for n in range(5000)] == [triton.next_power_of_2(n) for n in range(5000)]
    pairs = [(a, b) for a in range(300) for b in range(1, 40)]
    assert [launch.cdiv(a, b) for a, b in pairs] == [triton.cdiv(a, b) for a, b in pairs]


def test_device_guard_selects_the_tensors_cuda_device():
    # Triton launches on the current device: the guard must switch to the tensor's own index
    cpu = torch.zeros(1)
    assert isinstance(launch.device_guard(cpu), contextlib.nullcontext)
    # the guard object for a cuda:1 tensor is built without touching CUDA (entering it would)
    guard = torch.cuda.device(torch.device("cuda", 1))
    assert guard.idx == 1
    with launch.device_guard(cpu):  # the interpreter path runs through the same helper
        pass


@pytest.mark.slow  # (the interpreter runs every launcher's kernels)
def test_launchers_enter_the_device_guard(monkeypatch):
    # every launcher goes through device_guard with the tensor it launches on (real kernels run)
    from splatloss.backends.triton import backward, forward, ms_ssim, split

    seen = []
    real = launch.device_guard

    def recording(t):
        seen.append(t.device)
        return real(t)

    monkeypatch.setattr(forward, "device_guard", recording)
    monkeypatch.setattr(backward, "device_guard", recording)
    monkeypatch.setattr(ms_ssim, "device_guard", recording)
    monkeypatch.setattr(split, "device_guard", recording)
    x = torch.rand(1, 1, 12, 12, device=DEV, requires_grad=True)
    y = torch.rand(1, 1, 12, 12, device=DEV)
    splatloss.ssim(x, y, window_size=3, backend="triton").backward()
    assert len(seen) == 1  # the loss's forward launches (one guard) compute its gradient too
    splatloss.ssim_map(x, y, window_size=3, backend="triton").sum().backward()
    assert len(seen) == 3 and all(d == x.device for d in seen)  # the map: forward and backward


@pytest.mark.parametrize("shape", [(0, 3, 12, 12), (2, 0, 12, 12)])
def test_empty_batch_or_channels_is_a_clear_error(shape):
    # The Triton backend's own check (the public functions refuse zero channels before dispatch,
    # tests/test_numerics.py; an empty batch reaches the backend).
    from splatloss.backends import get
    from splatloss.config import SSIMConfig

    triton_backend, cfg = get("triton"), SSIMConfig(window_size=3)
    x = torch.rand(shape, device=DEV)
    with pytest.raises(ValueError, match="at least one image and one channel, got shape"):
        triton_backend.ssim_stats(x, x.clone(), cfg)
    with pytest.raises(ValueError, match="at least one image and one channel, got shape"):
        triton_backend.dssim_l1(x, x.clone(), cfg, 0.2)
    if shape[0] == 0:
        with pytest.raises(ValueError, match="at least one image and one channel, got shape"):
            splatloss.ssim(x, x.clone(), window_size=3, backend="triton")


# each runs the real kernels in the interpreter first: the slow tier
@pytest.mark.slow
@pytest.mark.parametrize("op", ["triton_ssim_stats_bwd", "triton_dssim_l1_bwd"])
def test_fake_gradient_strides_match_the_real_ones(op):
    # contiguous img1, channels-last img2, both gradients: the real op gives img2's gradient
    # img1's strides; the fake one must say the same or torch.compile's stride check fails
    from torch._subclasses.fake_tensor import FakeTensorMode

    from splatloss.backends.triton import dssim_l1 as _dl1_mod  # noqa: F401
    from splatloss.backends.triton import ssim as _ssim_mod  # noqa: F401  (registers the ops)

    x = torch.rand(1, 3, 12, 12, device=DEV)
    y = torch.rand(1, 3, 12, 12, device=DEV).to(memory_format=torch.channels_last)
    w = torch.tensor([0.25, 0.5, 0.25], device=DEV)
    g = torch.ones(1, 3, device=DEV) if op == "triton_ssim_stats_bwd" else torch.ones(1, device=DEV)
    args = (
        (g, g, x, y, w, "same", 1e-4, 9e-4, True, True)
        if op == "triton_ssim_stats_bwd"
        else (g, x, y, w, "same", 1e-4, 9e-4, 0.2, True, True)
    )
    fn = getattr(torch.ops.splatloss, op)
    real = fn(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = fn(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert [t.stride() for t in fake] == [t.stride() for t in real]
    assert real[1].stride() == x.stride()


@pytest.mark.slow
def test_size_arguments_are_not_specialised():
    # compiled (not interpreted) kernels: sizes equal to 1 or multiples of 16 must not select new
    # variants; checked in a fresh interpreter-free process, where triton.jit keeps the flags
    import subprocess
    import sys

    code = (
        "from splatloss.backends.triton import backward, forward\n"
        "for k in (forward.ssim_fwd_kernel, backward.ssim_bwd_kernel):\n"
        "    print(','.join(p.name for p in k.params if p.do_not_specialize))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    sizes = "BC,C,H,W,Ho,Wo,n_chunks,n_strips,ROWS"
    assert out.split() == [sizes, sizes]


def _footprint_cases():
    """(window_size, geometry, bad values of the middle-row and the top-row image), in the slow tier
    (the interpreter). Every window size and geometry, each with both rows (two images of one batch)
    and both NaN and Inf, which alternate over the rows and cases (they take the same kernel code, a
    finite check and a skipped weight-0 slot, at every window size)."""
    out = []
    for window_size in (7, 11):
        for i, geom in enumerate(("interpreter-geometry", "cuda-geometry-8-rows")):
            bad = ("nan", "inf") if (i + (window_size == 11)) % 2 == 0 else ("inf", "nan")
            case = (window_size, geom, bad)
            out.append(pytest.param(*case, marks=(pytest.mark.slow,), id=f"{window_size}-{geom}-{bad[0]}-{bad[1]}"))
    return out


@pytest.mark.parametrize("window_size,geometry,bad", _footprint_cases())
def test_nan_or_inf_pixel_reaches_only_its_footprint(monkeypatch, window_size, geometry, bad):
    # A bad pixel reaches the gradients within window_size - 1 of it: (2K - 1)^2 entries away from
    # the border (the reference's autograd count). Ring slots of weight 0 must be skipped,
    # not multiplied (0 * NaN = NaN would reach 195 / 462 entries at K = 7 / 11). The middle-row pixel
    # (image 0) sits on a row the moment shift samples (the middle row of the image, and of an 8-row
    # chunk), so the shift must skip it; the top-row pixel (image 1) is the row that zero-padded rows
    # above the image are read from. Each image is its own plane: one batch holds both.
    if geometry == "cuda-geometry-8-rows":
        monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
        monkeypatch.setattr(launch, "CUDA_ROWS", 8)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(2, 2, 1, 24, 24, generator=g)
    x[0, 0, 11, 12] = float(bad[0])  # middle row
    x[1, 0, 0, 12] = float(bad[1])  # top row
    counts = {}
    for backend in ("reference", "triton"):
        dev = DEV if backend == "triton" else "cpu"
        xr, yr = x.clone().to(dev).requires_grad_(True), y.clone().to(dev).requires_grad_(True)
        gx, gy = torch.autograd.grad(
            splatloss.ssim(xr, yr, window_size=window_size, padding="same", backend=backend), (xr, yr)
        )
        counts[backend] = [(int((~torch.isfinite(gx[i])).sum()), int((~torch.isfinite(gy[i])).sum())) for i in (0, 1)]
    middle, top = (2 * window_size - 1) ** 2, (2 * window_size - 1) * window_size  # top: rows 0..K - 1 below it
    assert counts["reference"] == [(middle, middle), (top, top)]
    assert counts["triton"] == counts["reference"]


def _photo_pair_in(name: str, lo: float, hi: float):
    """A 48x56 crop of a scikit-image photograph and a distorted copy, scaled into [lo, hi],
    rounded to float32 (the float64 truth is computed from the rounded values: images in
    [0.99, 1] lose ~1e-5 of their contrast to the rounding itself, on every backend)."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from _truth import distort, photo, to_torch

    a = photo(name, 100, 150, 48, 56)
    b = distort(a, 0)
    return to_torch(lo + (hi - lo) * a).float(), to_torch(lo + (hi - lo) * b).float()


@pytest.mark.slow
def test_gradients_on_dark_and_bright_photographs_match_float64():
    # The moments are taken about local shifts. With the old fixed shift of data_range / 2 the dark
    # images' gradients were ~1.7e-5 from float64; measured: 1.2e-7 .. 3.3e-7 (the torch backend:
    # 1.1e-7 .. 2.9e-7). A photograph's dark and bright pairs are one batch (each image its own
    # plane; in the interpreter one program holds both, at the cost of one).
    ranges = ((0.0, 0.01), (0.99, 1.0))
    for name in ("astronaut", "camera"):  # (3 channels, 1 channel)
        x, y = (torch.cat(t) for t in zip(*(_photo_pair_in(name, lo, hi) for lo, hi in ranges)))
        x64, y64 = x.double().requires_grad_(True), y.double().requires_grad_(True)
        truth = torch.autograd.grad(splatloss.ssim(x64, y64, padding="same", backend="reference"), (x64, y64))
        xr, yr = x.clone().to(DEV).requires_grad_(True), y.clone().to(DEV).requires_grad_(True)
        got = torch.autograd.grad(splatloss.ssim(xr, yr, padding="same", backend="triton"), (xr, yr))
        for i, (lo, hi) in enumerate(ranges):
            for g, t in zip(got, truth):
                err = float((g[i].cpu().double() - t[i]).norm() / t[i].norm())
                assert err < 3e-6, f"{name} in [{lo}, {hi}]: gradient {err:.2e} from float64 (normwise)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("loss_name", ["dssim_l1", "dssim_l1_masked", "ms_ssim"])
def test_loss_forward_and_backward_replay_from_a_cuda_graph(loss_name):
    # Captured once, replayed on new inputs: no host synchronisation inside the loss (the mask check
    # runs as a device assertion while capturing; MS-SSIM's scale weights are made once, not copied
    # from the host per call), and the replay equals eager on the same inputs.
    g = torch.Generator().manual_seed(0)
    x, y = (torch.rand(1, 3, 64, 80, generator=g).cuda() for _ in range(2))
    mask = (torch.rand(1, 1, 64, 80, generator=g) > 0.2).float().cuda() if loss_name.endswith("masked") else None

    def loss(a, b):
        if loss_name == "ms_ssim":
            return 1 - splatloss.ms_ssim(a, b, weights=(0.3, 0.3, 0.4), padding="same", backend="triton").mean()
        return splatloss.dssim_l1(a, b, 0.2, padding="same", backend="triton", mask=mask)

    graphed = torch.cuda.make_graphed_callables(loss, (x.clone().requires_grad_(True), y.clone()))
    for _ in range(2):
        x, y = x.roll(7, dims=-1), y.roll(3, dims=-2)
        xg, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        (got,) = torch.autograd.grad(value := graphed(xg, y), xg)
        (want,) = torch.autograd.grad(eager := loss(xe, y), xe)
        assert torch.equal(value, eager) and torch.equal(got, want)


@pytest.mark.slow  # (the interpreter: about 30 s)
def test_eager_calls_skip_the_custom_op_dispatch_and_equal_it_bitwise():
    # Eager calls run the ops' own forward / setup_context / backward as a plain autograd.Function
    # (the custom-op dispatch is a fifth of a call's Python time); torch.compile and torch.func get
    # the custom op. Same kernels: bitwise the same values and gradients.
    from splatloss.backends.triton import dssim_l1, ms_ssim, ssim
    from splatloss.backends.triton.glue import window_taps
    from splatloss.config import SSIMConfig

    g = torch.Generator().manual_seed(3)
    x, y = (torch.rand(1, 2, 20, 22, generator=g).to(DEV) for _ in range(2))
    w = window_taps(SSIMConfig(), x.device)
    cases = {
        "ssim_term": (ssim._term_op, ssim._term_call, (w, "same", 1e-4, 9e-4, False, True, True, -0.25)),
        "dssim_l1": (dssim_l1._dssim_l1_op, dssim_l1._dssim_l1_call, (w, "same", 1e-4, 9e-4, 0.2, True, True, 0.5)),
        "downsample2x": (ms_ssim._down_op, ms_ssim._down_call, ()),
    }
    for name, (op, call, rest) in cases.items():
        results = []
        for fn in (op, call):
            xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
            out = fn(xr, yr, *rest) if rest else (fn(xr),)
            loss = (out[0] * torch.linspace(0.5, 1.5, out[0].numel(), device=DEV).view(out[0].shape)).sum()
            grads = torch.autograd.grad(loss, (xr, yr) if rest else (xr,))
            results.append((out[0].detach(), *grads, type(out[0].grad_fn).__name__))
        (*want, op_node), (*got, eager_node) = results
        assert "eager" in eager_node and "eager" not in op_node, (name, op_node, eager_node)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), name


def test_rows_per_program_step_down_until_the_grid_makes_full_waves(monkeypatch):
    # Host-side geometry on the model GPU (132 SMs): a grid of FULL_WAVES or more waves of the
    # resident slots keeps CUDA_ROWS; a smaller one gets the rows of least wave-quantised time: one
    # 1080p image 99 (backward: 264 programs, 2 per SM), one 4K image's backward 99 (1056 programs,
    # 4 full waves, against 816 in 3.09 waves), MS-SSIM's second scale 25, the coarsest scales 16;
    # the masked backward's 4-warp programs at 128 registers (4 per SM) at 1080p 108 (rows that
    # split the image into 10 equal chunks: 510 programs in 0.97 of a wave of 528 slots); at 168
    # registers (3 per SM, images with strides apart) 72 (765 programs in 2 waves of 396).
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    cpu = torch.device("cpu")

    def rows(b, h, w, halo, k=11):
        frame = w + k - 1 if halo else w
        maxnreg = launch.bwd_maxnreg(k, False) if halo else launch.fwd_maxnreg(k, lean=True)
        return launch.geometry(frame, h, k, 3 * b, cpu, halo=halo, maxnreg=maxnreg).rows

    # the lean forward's 4-warp programs at 64 registers, 8 per SM: 47 rows at 1080p (1035 programs
    # on 1056 slots), 94 at 4K; at 128 (4 per SM) 99 and 128
    assert (rows(1, 1080, 1920, True), rows(1, 1080, 1920, False)) == (99, 47)
    assert (rows(1, 540, 960, True), rows(1, 270, 480, True), rows(1, 68, 120, False)) == (25, 16, 16)
    assert rows(5, 1080, 1920, True) == 128 and rows(1, 2160, 3840, False) == 94
    heavy = launch.fwd_maxnreg(11)  # a map written, "valid", strided rows: 128
    assert heavy == 128 and launch.geometry(1920, 1080, 11, 3, cpu, maxnreg=heavy).rows == 99
    assert launch.geometry(3840, 2160, 11, 3, cpu, maxnreg=heavy).rows == 128
    assert rows(1, 2160, 3840, True) == 99
    wide, maxnreg = masked_kernels.BWD_LAUNCH["light"]
    masked = launch.geometry(1930, 1080, 11, 3, cpu, halo=True, maxnreg=maxnreg, wide_halo=wide)
    assert (masked.bw, masked.rows, maxnreg) == (128, 72, 168)  # 8 B of spills at 128 on sm_90
    wide, maxnreg = masked_kernels.BWD_LAUNCH["light_other"]
    masked = launch.geometry(1930, 1080, 11, 3, cpu, halo=True, maxnreg=maxnreg, wide_halo=wide)
    assert (masked.bw, masked.rows) == (128, 72)
    assert launch.programs_per_sm(8, 128) == 2 and launch.programs_per_sm(4, 128) == 4
    assert launch.programs_per_sm(8, 255) == 1 and launch.programs_per_sm(1, 32) == 32
    monkeypatch.setattr(launch, "ROW_STEPS", ())  # the steps off: CUDA_ROWS everywhere
    assert rows(1, 540, 960, True) == launch.CUDA_ROWS


def test_the_coarser_scales_launch_takes_the_rows_of_least_wave_time(monkeypatch):
    # MS-SSIM's coarser scales as one launch at one 1080p image (540x960 .. 68x120, 3 channels):
    # the backward's 256-lane programs (4, 2, 1, 1 column strips a channel; 2 per SM) and the
    # forward's 128-lane ones at 128 registers (8, 4, 2, 1 strips; 4 per SM) both take 34 rows,
    # the second scale in 16 chunks: one wave nearly full (258 and 510 programs on 264 and 528
    # slots, where the steps' 50 rows made 183 and 360); the forward as launched, at 64 registers
    # (8 per SM), 17 rows: 1020 programs on 1056 slots. In the interpreter, one chunk per scale.
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    cpu = torch.device("cpu")
    heights = [540, 270, 135, 68]
    bwd = launch.batched_rows([12, 6, 3, 3], heights, 11, 8, 128, cpu)
    fwd = launch.batched_rows([24, 12, 6, 3], heights, 11, 4, 128, cpu, halo=False)
    assert (bwd, fwd) == (34, 34)
    assert sum(p * launch.cdiv(h, bwd) for p, h in zip([12, 6, 3, 3], heights)) == 258
    assert sum(p * launch.cdiv(h, fwd) for p, h in zip([24, 12, 6, 3], heights)) == 510
    fwd = launch.batched_rows([24, 12, 6, 3], heights, 11, 4, launch.fwd_maxnreg(11, lean=True), cpu, halo=False)
    assert fwd == 17 and sum(p * launch.cdiv(h, fwd) for p, h in zip([24, 12, 6, 3], heights)) == 1020
    # five frames: 128-row programs would make under four waves, so the rows step down again
    assert launch.batched_rows([60, 30, 15, 15], heights, 11, 8, 128, cpu) < launch.CUDA_ROWS
    # a launch of four or more full waves keeps CUDA_ROWS
    assert launch.batched_rows([600, 300], [2160, 1080], 11, 8, 128, cpu) == launch.CUDA_ROWS
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", False)
    assert launch.batched_rows([12, 6, 3, 3], heights, 11, 8, 128, cpu) == 540


def test_uneven_groups_of_images_take_rows_planned_over_every_group(monkeypatch):
    # the masked backward at five 1080p images under a moments bound of four images' runs as three
    # and two: with the first group's own rows (72 and 84 at 64 registers) each group's launches
    # fill part of one wave (the moments' 64 % and 43 %); rows planned over both groups (47 and 54:
    # 98 % and 65 %) take less summed wave-quantised time. Equal groups plan as one group alone does.
    from splatloss.backends.triton import masked_split, split

    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(split, "MAX_MOMENTS_BYTES", 4 * 3 * 1080 * 1920 * 16)  # four images' moments
    cpu = torch.device("cpu")
    window = torch.ones(11)

    def waved(per, height, rows, slots, halo_rows):  # summed over the launches, one per group
        return sum(launch.cdiv(p * launch.cdiv(height, rows), slots) for p in per) * (rows + halo_rows)

    x = torch.empty(5, 3, 1080, 1920)
    three = masked_split.masked_split_geometry(x[:3], window, "same")  # a group of three on its own
    geo_a, geo_b, reg_a, reg_b = masked_split.masked_split_geometry(x, window, "same")
    assert (three[0].rows, three[1].rows) == (72, 84)
    for geo, reg, height, strips, halo_rows, own in (
        (geo_a, reg_a, 1080, launch.cdiv(1920, geo_a.f), 10, three[0].rows),
        (geo_b, reg_b, 1080, launch.cdiv(1920, geo_b.f - 10), 20, three[1].rows),
    ):
        per = [3 * strips, 2 * strips]  # programs per row chunk: one channel a program
        slots = launch.sm_count(cpu) * launch.programs_per_sm(geo.warps, reg)
        assert waved(per, height, geo.rows, slots, halo_rows) < 0.9 * waved(per, height, own, slots, halo_rows)
        assert launch.group_rows(per, height, 11, geo.warps, reg, cpu, halo=halo_rows == 20) == geo.rows
    # equal groups (eight images: four and four) plan as one group alone
    per_chunk, slots = 48, 1056
    assert launch.plan_group_rows((per_chunk, per_chunk), 1080, slots, 10, 128, launch.ROW_STEPS) == launch.plan_rows(
        (per_chunk,), (1080,), slots, 10, 128, launch.ROW_STEPS
    )
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", False)
    assert launch.group_rows([45, 30], 1080, 11, 4, 80, cpu) == 1080  # the interpreter: one chunk


@pytest.mark.parametrize(
    "op, padding, lean",
    [
        ("dssim_l1", "same", True),
        ("dssim_l1", "valid", False),
        ("ssim", "valid", True),
        pytest.param("ms_ssim", "valid", True, marks=pytest.mark.slow),  # an 80x96 image: its five scales
    ],
)
def test_forwards_without_a_gradient_launch_lean(monkeypatch, op, padding, lean):
    # Without a gradient (evaluation) the losses run the forward kernel. Its statistics of contiguous
    # rows keep their last rows' sums in scratch and fit the lean ceiling (64 registers on sm_90: 32
    # warps per SM): under "valid" padding too (no row outside the image to clamp), and the 3DGS
    # loss's SSIM and L1 sums under "same" (it sums no cs); under "valid" that one keeps 128 (its
    # last map column's L1 of K pixels spills 40 B at 64). Either way the value is the float64 one.
    from splatloss.backends.triton import forward

    ceilings = []
    real = forward.launch_options

    def options(num_warps, **kw):
        ceilings.append(kw.get("maxnreg"))
        return real(num_warps, **kw)

    monkeypatch.setattr(forward, "launch_options", options)
    gen = torch.Generator().manual_seed(3)
    size = (1, 3, 80, 96) if op == "ms_ssim" else (2, 3, 24, 40)
    x = torch.rand(*size, generator=gen)
    y = (x + 0.1 * torch.rand(*size, generator=gen)).clamp(0, 1)
    kw = {"window_size": 5} if op == "ms_ssim" else {}
    args = (0.2,) if op == "dssim_l1" else ()
    fn = getattr(splatloss, op)
    with torch.no_grad():
        got = fn(x.to(DEV), y.to(DEV), *args, padding=padding, backend="triton", **kw)
    truth = fn(x.double(), y.double(), *args, padding=padding, backend="reference", **kw)
    arch = launch.device_arch(torch.device(DEV))
    want = launch.lean_fwd_maxnreg(arch) if lean else launch.COLUMN_MAXNREG
    assert ceilings and all(c == want for c in ceilings), ceilings
    assert (got.double().cpu() - truth).abs().max() < 2e-6
