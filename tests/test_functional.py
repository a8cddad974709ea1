"""The public functions: outside truth through the default backend, shapes, reductions, errors."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from _truth import distort, photo, skimage_ssim, tf_ms_ssim, to_torch

import splatloss
from splatloss import backends, functional

BACKENDS = ["torch", "reference"]


# ------------------------------------------------------------------------------------------------
# Outside truth through the public API (default backend = the fused torch path on CPU)
# ------------------------------------------------------------------------------------------------


def test_ssim_equals_skimage_random_batch():
    rng = np.random.default_rng(0)
    a = rng.random((3, 29, 34, 3))
    b = np.clip(a + 0.15 * rng.standard_normal(a.shape), 0, 1)
    x = torch.from_numpy(a).permute(0, 3, 1, 2).float()
    y = torch.from_numpy(b).permute(0, 3, 1, 2).float()
    got = splatloss.ssim(x, y, reduction="none")
    expected = [skimage_ssim(a[i], b[i]) for i in range(3)]
    assert np.abs(got.numpy() - np.array(expected)).max() < 2e-5


@pytest.mark.parametrize(
    "h,w", [(163, 171)] + [pytest.param(*hw, marks=pytest.mark.slow) for hw in ((161, 161), (170, 166), (201, 175))]
)
def test_ms_ssim_equals_tf_convention(h, w):
    a = photo("astronaut", 150, 150, h, w)
    b = distort(a, seed=w, noise=0.05, shift=2)
    got = splatloss.ms_ssim(to_torch(a, torch.float32), to_torch(b, torch.float32))
    assert abs(float(got) - tf_ms_ssim(a, b)) < 2e-5


def test_ms_ssim_equals_tf_convention_random_odd():
    rng = np.random.default_rng(5)
    a = rng.random((167, 169, 1))
    b = np.clip(0.5 * a + 0.5 * rng.random(a.shape), 0, 1)
    got = splatloss.ms_ssim(to_torch(a, torch.float32), to_torch(b, torch.float32))
    assert abs(float(got) - tf_ms_ssim(a, b)) < 2e-5


# ------------------------------------------------------------------------------------------------
# Shapes, reductions, dtypes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_reductions_and_unbatched(backend):
    torch.manual_seed(0)
    x, y = torch.rand(3, 2, 20, 21), torch.rand(3, 2, 20, 21)
    none = splatloss.ssim(x, y, reduction="none", backend=backend)
    assert none.shape == (3,)
    torch.testing.assert_close(splatloss.ssim(x, y, backend=backend), none.mean())
    torch.testing.assert_close(splatloss.ssim(x, y, reduction="sum", backend=backend), none.sum())
    torch.testing.assert_close(none, splatloss.ssim_map(x, y, backend=backend).mean(dim=(1, 2, 3)))
    # unbatched (C, H, W): the batch dimension is dropped again
    assert splatloss.ssim(x[0], y[0], reduction="none", backend=backend).shape == ()
    torch.testing.assert_close(splatloss.ssim(x[0], y[0], backend=backend), none[0])
    assert splatloss.ssim_map(x[0], y[0], backend=backend).shape == (2, 10, 11)
    s, c = splatloss.ssim_map(x[0], y[0], backend=backend, return_cs=True, padding="same")
    assert s.shape == c.shape == (2, 20, 21)
    torch.testing.assert_close(splatloss.dssim(x, y, reduction="none", backend=backend), 1 - none)
    assert splatloss.dssim(x[0], y[0], reduction="none", backend=backend).shape == ()


def test_float64_values_stay_float64_and_mixed_dtypes_promote():
    x = torch.rand(1, 1, 16, 16, dtype=torch.float64)
    assert splatloss.ssim(x, x.clone()).dtype == torch.float64
    xf = x.float().requires_grad_()
    yh = x.half()
    out = splatloss.ssim(xf, yh)  # fp32 and fp16 -> computed in fp32
    assert out.dtype == torch.float32
    out.backward()
    assert xf.grad.dtype == torch.float32


def test_dssim_l1_matches_its_definition():
    torch.manual_seed(1)
    x, y = torch.rand(2, 3, 24, 25), torch.rand(2, 3, 24, 25)
    for padding in ("valid", "same"):
        got = splatloss.dssim_l1(x, y, 0.3, padding=padding, reduction="none")
        l1 = (x - y).abs().mean(dim=(1, 2, 3))
        expected = 0.7 * l1 + 0.3 * (1 - splatloss.ssim(x, y, padding=padding, reduction="none"))
        torch.testing.assert_close(got, expected)


def test_ms_ssim_custom_weights_and_same_padding_on_small_images():
    torch.manual_seed(2)
    x, y = torch.rand(1, 1, 40, 44), torch.rand(1, 1, 40, 44)
    # 40 px with 5 scales works with "same" padding (the coarsest scale is 3x3)
    v = splatloss.ms_ssim(x, y, padding="same")
    assert torch.isfinite(v)
    got = splatloss.ms_ssim(x, y, padding="same", weights=[0.5, 0.5], backend="torch")
    ref = splatloss.ms_ssim(x, y, padding="same", weights=[0.5, 0.5], backend="reference")
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert splatloss.ms_ssim(x, y, padding="same", weights=torch.tensor([0.5, 0.5])).shape == ()


def test_ms_ssim_tau_equals_metric_when_all_terms_above_tau():
    a = photo("coffee", 100, 100, 165, 163)
    b = distort(a, seed=4, noise=0.03)
    x, y = to_torch(a, torch.float32), to_torch(b, torch.float32)
    torch.testing.assert_close(splatloss.ms_ssim(x, y, tau=0.01), splatloss.ms_ssim(x, y))


def test_smooth_positive_extension():
    tau = 0.01
    x = torch.linspace(-3, 1, 4001, dtype=torch.float64, requires_grad=True)
    f = functional.smooth_positive(x, tau)
    (g,) = torch.autograd.grad(f.sum(), x)
    assert bool((f > 0).all()) and bool((g > 0).all()) and bool(torch.isfinite(g).all())
    above = x.detach() >= tau
    torch.testing.assert_close(f[above], x[above].detach())
    # C1 at tau: value and slope continuous
    t = torch.tensor([tau - 1e-9, tau + 1e-9], dtype=torch.float64, requires_grad=True)
    ft = functional.smooth_positive(t, tau)
    (gt,) = torch.autograd.grad(ft.sum(), t)
    assert abs(float((ft[0] - ft[1]).detach())) < 1e-8 and abs(float(gt[0] - gt[1])) < 1e-6


# ------------------------------------------------------------------------------------------------
# Backends
# ------------------------------------------------------------------------------------------------


def test_auto_takes_triton_only_for_cuda_tensors_that_are_not_float64():
    # No CUDA tensor can exist here: the predicate reads only .device and .dtype, so describe one.
    from types import SimpleNamespace

    from splatloss.backends import _auto_wants_triton

    cuda = torch.device("cuda")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert _auto_wants_triton(SimpleNamespace(device=cuda, dtype=dtype))
    assert not _auto_wants_triton(SimpleNamespace(device=cuda, dtype=torch.float64))
    assert not _auto_wants_triton(torch.rand(1, 1, 12, 12))


def test_triton_on_cpu_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.rand(1, 1, 12, 12)
    with pytest.raises(
        ValueError, match="backend='triton' needs CUDA tensors, got a tensor on cpu; .*TRITON_INTERPRET=1"
    ):
        splatloss.ssim(x, x, backend="triton")


def test_triton_missing_is_an_error(monkeypatch):
    # Simulate an environment without the Triton backend: importing it fails.
    monkeypatch.setitem(sys.modules, "splatloss.backends.triton", None)
    monkeypatch.setattr(backends, "_triton_tried", False)
    monkeypatch.setattr(backends, "_triton_backend", None)
    monkeypatch.setattr(backends, "_triton_error", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = torch.rand(1, 1, 12, 12)
    with pytest.raises(
        ValueError,
        match=(
            r"backend='triton' is not available: importing splatloss.backends.triton failed "
            r"\((ModuleNotFoundError|ImportError)"
        ),
    ):
        splatloss.ssim(x, x, backend="triton")
    assert backends.available()["triton"] is False


@pytest.mark.slow
def test_import_splatloss_imports_no_heavy_dependency():
    code = (
        "import sys, splatloss, splatloss.losses, splatloss.compat, splatloss.backends;"
        "splatloss.ssim(__import__('torch').rand(1,1,12,12), __import__('torch').rand(1,1,12,12));"
        "bad=[m for m in ('triton','lightning','pytorch_lightning','hydra','gsplat','skimage') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------------------------------------
# Errors: every message says what was expected and what came
# ------------------------------------------------------------------------------------------------

X = torch.rand(1, 3, 16, 16)


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (lambda: splatloss.ssim([1.0], X), TypeError, "img1 must be a torch.Tensor, got list"),
        (lambda: splatloss.ssim(X, X.numpy()), TypeError, "img2 must be a torch.Tensor, got ndarray"),
        (
            lambda: splatloss.ssim((X * 255).to(torch.uint8), X),
            TypeError,
            r"img1 must have a floating dtype \(float16, bfloat16, float32 or float64\), got torch.uint8",
        ),
        (lambda: splatloss.ssim(X, X.long()), TypeError, "img2 must have a floating dtype .* got torch.int64"),
        (
            lambda: splatloss.ssim(X[0, 0], X[0, 0]),
            ValueError,
            r"img1 must be a \(B, C, H, W\) or \(C, H, W\) tensor, got shape \(16, 16\) \(2 dims\)",
        ),
        (lambda: splatloss.ssim(X[None], X[None]), ValueError, r"got shape \(1, 1, 3, 16, 16\) \(5 dims\)"),
        (
            lambda: splatloss.ssim(X, X[..., :15]),
            ValueError,
            r"img1 and img2 must have the same shape, got \(1, 3, 16, 16\) and \(1, 3, 16, 15\)",
        ),
        (
            lambda: splatloss.ssim(X, torch.empty(1, 3, 16, 16, device="meta")),
            ValueError,
            "img1 and img2 must be on the same device, got cpu and meta",
        ),
        (
            lambda: splatloss.ssim(X[..., :10, :], X[..., :10, :]),
            ValueError,
            r"images must be at least 11x11 because the window \(window_size=11\) must fit inside them with "
            r"padding='valid', got 10x16",
        ),
        (
            lambda: splatloss.ssim(X[..., :5], X[..., :5], padding="reflect"),
            ValueError,
            r"images must be at least 6x6 because padding='reflect' mirrors window_size // 2 = 5 pixels, got 16x5",
        ),
        (lambda: splatloss.ssim(X, X, window_size=8), ValueError, "window_size must be an odd integer >= 3, got 8"),
        (lambda: splatloss.ssim(X, X, window_size=1), ValueError, "window_size must be an odd integer >= 3, got 1"),
        (lambda: splatloss.ssim(X, X, sigma=0.0), ValueError, "sigma must be a finite number > 0, got 0.0"),
        (lambda: splatloss.ssim(X, X, data_range=0), ValueError, "data_range must be a finite number > 0, got 0.0"),
        (
            lambda: splatloss.ssim(X, X, data_range=-255),
            ValueError,
            "data_range must be a finite number > 0, got -255.0",
        ),
        (
            lambda: splatloss.ssim(X, X, padding="zero"),
            ValueError,
            r"padding must be one of \('valid', 'same', 'reflect'\), got 'zero'",
        ),
        (
            lambda: splatloss.ssim(X, X, reduction="avg"),
            ValueError,
            r"reduction must be one of \('mean', 'sum', 'none'\), got 'avg'",
        ),
        (
            lambda: splatloss.ssim(X, X, backend="cuda"),
            ValueError,
            r"backend must be one of \('auto', 'reference', 'torch', 'cpu', 'triton'\), got 'cuda'",
        ),
        (
            lambda: splatloss.ms_ssim(X, X),
            ValueError,
            r"ms_ssim with 5 scales, window_size=11 and padding='valid' needs images of at least 161x161 \(the "
            r"coarsest scale, "
            r"1/16 of the size, must be at least 11 pixels\), got 16x16; use fewer scales \(a shorter weights "
            r"sequence, e.g. "
            r"weights=\(0.0448, 0.2856, 0.3001\)\), a smaller window_size, or padding='same'",
        ),
        (lambda: splatloss.ms_ssim(X, X, padding="reflect"), ValueError, "needs images of at least 81x81"),
        (
            lambda: splatloss.ms_ssim(X, X, weights=[0.5, -0.5], padding="same"),
            ValueError,
            r"weights must be finite and >= 0, got weights\[1\] = -0.5",
        ),
        (
            lambda: splatloss.ms_ssim(X, X, weights=[], padding="same"),
            ValueError,
            "weights must have one entry per scale \\(at least 1\\), got an empty sequence",
        ),
        (
            lambda: splatloss.ms_ssim(X, X, weights=torch.ones(2, 2), padding="same"),
            ValueError,
            r"weights must be a 1-D sequence of scale weights, got a tensor of shape \(2, 2\)",
        ),
        (
            lambda: splatloss.ms_ssim(X, X, weights=0.5, padding="same"),
            TypeError,
            "weights must be a sequence of numbers \\(one per scale\\), got float",
        ),
        (
            lambda: splatloss.ms_ssim(X, X, weights=[0.0, 0.0], padding="same"),
            ValueError,
            r"weights must not all be zero, got \(0.0, 0.0\)",
        ),
        (
            lambda: splatloss.ms_ssim(X, X, weights=["a"], padding="same"),
            TypeError,
            r"weights\[0\] must be a real number, got 'a' \(str\)",
        ),
        (
            lambda: splatloss.ms_ssim(X, X, tau=0.0, padding="same"),
            ValueError,
            r"tau must be a number in \(0, 1\) or None, got 0.0",
        ),
        (lambda: splatloss.dssim_l1(X, X, lam=1.5), ValueError, r"lam must be a number in \[0, 1\], got 1.5"),
        (
            lambda: splatloss.dssim_with_gradient(X, X, reduction="none"),
            ValueError,
            "reduction must be 'mean' or 'sum' for dssim_with_gradient, got 'none'",
        ),
        (
            lambda: splatloss.dssim_with_gradient(X, X, grad=torch.empty(1, 3, 16, 15)),
            ValueError,
            r"grad must be a floating tensor shaped like img1 \(1, 3, 16, 16\) on cpu, got shape \(1, 3, 16, 15\), "
            r"dtype torch.float32 on cpu",
        ),
        (
            lambda: splatloss.dssim_with_gradient(X, X, grad=[0.0]),
            TypeError,
            "grad must be a torch.Tensor or None, got list",
        ),
        (
            lambda: splatloss.dssim_with_gradient(X, X, windowsize=7),
            TypeError,
            r"unexpected keyword argument 'windowsize'; the SSIM options are data_range, window_size",
        ),
    ],
)
def test_error_messages(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_dssim_with_gradient_unbatched_and_dtype():
    x = torch.rand(3, 16, 17, dtype=torch.float16)
    y = torch.rand(3, 16, 17, dtype=torch.float16)
    v, g = splatloss.dssim_with_gradient(x, y)
    assert g.shape == x.shape and g.dtype == torch.float16 and v.dtype == torch.float32
    buf = torch.zeros(3, 16, 17, dtype=torch.float32)
    _, g2 = splatloss.dssim_with_gradient(x, y, grad=buf)
    assert g2 is buf
    # |g| <= ~0.04 here, so the former atol=1e-3 / rtol=1e-2 passed almost anything. Both results
    # must be the float64 gradient (of the same fp16 values) rounded to fp16: within half an fp16
    # ulp (2**-11 relative) plus fp16's subnormal step and fp32 round-off; then within one ulp of
    # each other.
    xr = x.double().requires_grad_()
    (1 - splatloss.ssim(xr, y.double(), backend="reference")).backward()
    truth = xr.grad
    for got in (g, buf):
        err = (got.double() - truth).abs() - (2.0**-11 * truth.abs() + 2.0**-24 + 1e-5 * float(truth.abs().max()))
        assert float(err.max()) <= 0, (
            f"fp16 gradient off the float64 truth by {float(err.max()):.3g} beyond half an ulp"
        )
    torch.testing.assert_close(buf, g.float(), atol=2.0**-24, rtol=2.0**-10)
