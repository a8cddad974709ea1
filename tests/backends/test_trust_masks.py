"""Masks the library can be trusted with: checked once per mask and version (no host read when a mask
is used again), scale-free weights (each image's mask divided by its largest weight), and a mask that
requires grad gets its whole gradient."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import splatloss
from conftest import backend_params, device_for, photo_pair, rel

NAMES = ("reference",) + tuple(p.values[0] for p in backend_params())


class HostReads(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host: ``aten._local_scalar_dense`` (what ``.item()``
    and ``bool(tensor)`` dispatch to) and ``Tensor.tolist`` (which on CPU reads memory without an op,
    on a GPU copies to the host): each is a GPU -> CPU synchronisation on a GPU tensor."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self._functions = _ToList(self)

    def __enter__(self):
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._functions.__exit__(*exc)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _ToList(TorchFunctionMode):
    def __init__(self, counter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            self.counter.count += 1
        return func(*args, **(kwargs or {}))


def _calls(backend):
    loss = splatloss.PhotometricLoss.dssim_l1(backend=backend)
    return {
        "dssim_l1": lambda x, y, m: splatloss.dssim_l1(x, y, mask=m, padding="same", backend=backend),
        "ssim": lambda x, y, m: splatloss.ssim(x, y, mask=m, backend=backend),
        "PhotometricLoss": lambda x, y, m: loss(x, y, mask=m),
    }


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("entry", ["dssim_l1", "ssim", "PhotometricLoss"])
def test_a_mask_used_again_is_not_read_by_the_host(backend, entry):
    fn = _calls(backend)[entry]
    x = torch.rand(2, 3, 20, 23, requires_grad=True)
    y = torch.rand(2, 3, 20, 23)
    m = torch.rand(2, 1, 20, 23)
    fn(x, y, m).backward()  # the first use checks the mask
    with HostReads() as reads:
        fn(x, y, m).backward()
    assert reads.count == 0
    # the mask as a (H, W) tensor and as a view made afresh each call ((B, H, W) alpha -> (B, 1, H, W))
    alpha = torch.rand(2, 20, 23)
    fn(x, y, alpha[:, None]).backward()
    with HostReads() as reads:
        fn(x, y, alpha[:, None]).backward()
    assert reads.count == 0


def test_a_first_use_reads_the_mask_once():
    x, y, m = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16), torch.rand(16, 16)
    with HostReads() as reads:
        splatloss.ssim(x, y, mask=m, backend="torch")
    assert reads.count == 1


NAN_MESSAGE = (
    r"mask weights must be finite and >= 0 \(bool, or float weights in \[0, 1\]\), got 1 NaN weight; "
    r"replace them, e.g. mask.nan_to_num\(0.0\).clamp\(0, 1\)"
)


@pytest.mark.parametrize("entry", ["dssim_l1", "ssim", "PhotometricLoss"])
def test_a_mask_changed_in_place_is_checked_again(entry):
    fn = _calls("torch")[entry]
    x, y = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    base = torch.rand(1, 16, 16)
    m = base[:, None]
    fn(x, y, m)
    base[0, 3, 4] = float("nan")  # through the base: the view shares its version counter
    with pytest.raises(ValueError, match=NAN_MESSAGE):
        fn(x, y, m)
    with pytest.raises(ValueError, match=NAN_MESSAGE):  # a refused mask stays refused
        fn(x, y, m)
    base[0, 3, 4] = 0.5
    fn(x, y, m)
    m2 = torch.rand(16, 16)
    fn(x, y, m2)
    m2.mul_(-1)
    with pytest.raises(ValueError, match="got 256 negative weights"):
        fn(x, y, m2)


def test_a_checked_masks_are_not_kept_alive():
    x, y = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    m = torch.rand(1, 1, 16, 16) * 3
    splatloss.ssim(x, y, mask=m, backend="torch")
    dead = weakref.ref(m)
    del m
    gc.collect()
    assert dead() is None


# Masks in {0, 1/4, 1/2, 1} times a power of two: every scaled mask below is exact in its dtype
# (float32 subnormals down to 2^-147 hold these levels), so its weights divided by the largest are
# bit for bit the unscaled mask's, and so is every value and gradient.
SCALES32 = (2.0**-147, 2.0**-130, 2.0**-60, 2.0**60, 2.0**120, 2.0**127)
SCALES64 = (2.0**-170, 2.0**-140, 2.0**130, 2.0**300)  # float64 masks beyond float32's range


def _levels_mask(h, w, dtype, device):
    g = torch.Generator().manual_seed(5)
    levels = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    m = levels[torch.randint(0, 4, (h, w), generator=g)]
    m[0, 0] = 1.0
    return m.to(dtype=dtype, device=device)


def _value_and_grads(fn, x, y):
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    v = fn(xr, yr)
    gx, gy = torch.autograd.grad(v.sum(), (xr, yr))
    return v.detach(), gx, gy


@pytest.mark.parametrize("name", backend_params(NAMES, slow_triton=True))
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_2_extreme_mask_weights_mean_what_the_unscaled_mask_means(name, padding):
    dev = device_for(name)
    x, y = photo_pair(19, 21, seed=4, dtype=torch.float32, device=dev)
    for mask_dtype, scales in ((torch.float32, SCALES32), (torch.float64, SCALES64)):
        m = _levels_mask(19, 21, mask_dtype, dev)
        for fn in (
            lambda p, q, mm: splatloss.ssim(p, q, mask=mm, padding=padding, backend=name),
            lambda p, q, mm: splatloss.dssim_l1(p, q, mask=mm, padding=padding, backend=name),
        ):
            want = _value_and_grads(lambda p, q: fn(p, q, m), x, y)
            assert torch.isfinite(want[0]).all()
            for s in scales:
                got = _value_and_grads(lambda p, q: fn(p, q, m * s), x, y)
                for a, b in zip(got, want):
                    assert torch.equal(a, b), (mask_dtype, s)


def test_2_constant_mask_is_the_mask_of_ones():
    x, y = photo_pair(19, 21, seed=4, dtype=torch.float32)
    for padding in ("same", "valid", "reflect"):
        want = splatloss.ssim(x, y, mask=torch.ones(19, 21), padding=padding, backend="torch")
        for c in (0.5, 2.0, 1e-30, 1e30):
            got = splatloss.ssim(x, y, mask=torch.full((19, 21), c), padding=padding, backend="torch")
            assert torch.equal(got, want), (padding, c)


@pytest.mark.parametrize("name", ["torch", "cpu"])
def test_2_weights_relative_per_image(name):
    x, y = photo_pair(19, 21, seed=4, dtype=torch.float32)
    x, y = torch.cat([x, y]), torch.cat([y, x])
    m = _levels_mask(19, 21, torch.float32, "cpu")[None, None].repeat(2, 1, 1, 1)
    scaled = m * torch.tensor([2.0**-140, 2.0**100]).view(2, 1, 1, 1)
    a = splatloss.ssim(x, y, mask=m, reduction="none", backend=name)
    b = splatloss.ssim(x, y, mask=scaled, reduction="none", backend=name)
    assert torch.equal(a, b)


def test_2_float64_mask_is_scaled_before_its_cast():
    """A float64 mask of 1e-50 with float32 images is a mask, not an empty one (SSIM 1)."""
    x, y = photo_pair(19, 21, seed=4, dtype=torch.float32)
    m = _levels_mask(19, 21, torch.float64, "cpu")
    want = splatloss.ssim(x, y, mask=m, backend="torch")
    assert want.item() < 0.99
    assert torch.equal(splatloss.ssim(x, y, mask=m * 1e-50, backend="torch"), want)
    assert rel(splatloss.ssim(x, y, mask=m * 1e39, backend="torch"), want) <= 1e-7


def _mask_entries(backend, padding):
    opts = dict(padding=padding, backend=backend, window_size=3)
    y = torch.rand(1, 2, 7, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return {
        "ssim": lambda p, mm: splatloss.ssim(p, y, mask=mm, **opts),
        "dssim": lambda p, mm: splatloss.dssim(p, y, mask=mm, **opts),
        "ms_ssim": lambda p, mm: splatloss.ms_ssim(p, y, mask=mm, weights=(0.3, 0.7), **opts),
        "dssim_l1": lambda p, mm: splatloss.dssim_l1(p, y, mask=mm, **opts),
        "PhotometricLoss.dssim_l1": lambda p, mm: splatloss.PhotometricLoss.dssim_l1(**opts)(p, y, mask=mm),
        "PhotometricLoss.msssim": lambda p, mm: splatloss.PhotometricLoss(
            msssim=0.5, dssim=0.3, l2=0.2, ms_weights=(0.3, 0.7), **opts
        )(p, y, mask=mm),
    }


@pytest.mark.parametrize("backend", ["reference", "torch", "cpu"])
@pytest.mark.parametrize("padding", ["same", "valid", "reflect"])
def test_1_mask_that_requires_grad_gets_its_whole_gradient(backend, padding):
    """float64 gradcheck of the gradients to the image and to the mask, every entry point."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    m = (0.1 + 0.9 * torch.rand(1, 1, 7, 8, generator=g, dtype=torch.float64)).requires_grad_(True)
    for name, fn in _mask_entries(backend, padding).items():
        assert torch.autograd.gradcheck(fn, (x, m), fast_mode=True), name


@pytest.mark.parametrize("name", backend_params(("cpu", "triton")))
def test_1_fused_mask_backends_give_the_mask_gradient_of_the_composition(name):
    """The backends whose kernels differentiate the images only give a mask that requires grad the
    torch-ops composition's gradient, equal to the float64 oracle's."""
    dev = device_for(name)
    x, y = photo_pair(13, 14, seed=2, dtype=torch.float32, device=dev)
    m = (0.2 + 0.8 * torch.rand(1, 1, 13, 14, generator=torch.Generator().manual_seed(3))).to(dev)
    for fn in (
        lambda p, mm, b: splatloss.dssim_l1(p, y.to(p.dtype), mask=mm, padding="same", backend=b),
        lambda p, mm, b: splatloss.ssim(p, y.to(p.dtype), mask=mm, backend=b),
    ):
        mr = m.clone().requires_grad_(True)
        (got,) = torch.autograd.grad(fn(x, mr, name), mr)
        mt = m.double().clone().requires_grad_(True)
        (want,) = torch.autograd.grad(fn(x.double(), mt, "reference"), mt)
        assert rel(got, want) <= 1e-5  # measured <= 3e-7


@pytest.mark.parametrize("backend", ["reference", "torch", "cpu"])
def test_8_torch_func_grad_with_a_mask(backend):
    x, y = photo_pair(12, 13, seed=2, dtype=torch.float64)
    m = 0.2 + 0.8 * torch.rand(12, 13, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for fn in (
        lambda p, mm: splatloss.ssim(p, y, mask=mm, backend=backend),
        lambda p, mm: splatloss.dssim_l1(p, y, mask=mm, padding="same", backend=backend),
    ):
        xr, mr = x.clone().requires_grad_(True), m.clone().requires_grad_(True)
        gx, gm = torch.autograd.grad(fn(xr, mr), (xr, mr))
        assert rel(torch.func.grad(fn, argnums=0)(x, m), gx) <= 1e-12
        assert rel(torch.func.grad(fn, argnums=1)(x, m), gm) <= 1e-12


@pytest.mark.parametrize("name", backend_params(NAMES, slow_triton=True))
@pytest.mark.parametrize("padding", ["same", "valid", "reflect"])
def test_5_a_mask_of_one_weight_is_the_unmasked_value_bit_for_bit(name, padding):
    dev = device_for(name)
    x, y = photo_pair(17, 19, seed=5, dtype=torch.float32, device=dev)
    masks = (
        torch.ones(17, 19, device=dev),
        torch.ones(1, 1, 17, 19, dtype=torch.bool, device=dev),
        torch.full((1, 3, 17, 19), 0.25, device=dev),
    )
    for fn in (
        lambda p, q, mm: splatloss.ssim(p, q, mask=mm, padding=padding, backend=name),
        lambda p, q, mm: splatloss.dssim_l1(p, q, mask=mm, padding=padding, backend=name),
        lambda p, q, mm: splatloss.PhotometricLoss(l1=0.7, l2=0.1, dssim=0.2, padding=padding, backend=name)(
            p, q, mask=mm
        ),
    ):
        want = _value_and_grads(lambda p, q: fn(p, q, None), x, y)
        for m in masks:
            got = _value_and_grads(lambda p, q: fn(p, q, m), x, y)
            for a, b in zip(got, want):
                assert torch.equal(a, b), (m.dtype, tuple(m.shape))


def test_5_a_mask_of_ones_still_refuses_the_s3im_term():
    loss = splatloss.PhotometricLoss(l1=1.0, s3im=0.5, s3im_patch_height=16)
    x, y = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    with pytest.raises(ValueError, match="the s3im term takes no mask"):
        loss(x, y, mask=torch.ones(16, 16))


@pytest.mark.parametrize("name", ["torch", "cpu"])
@pytest.mark.parametrize("padding", ["same", "valid", "reflect"])
def test_5_an_image_against_itself_is_exactly_one(name, padding):
    """Every pixel of the SSIM and cs maps, the mean and the loss: exactly 1, 1 and 0 for identical images."""
    x = torch.rand(2, 3, 37, 41, generator=torch.Generator().manual_seed(8))
    smap, cmap = splatloss.ssim_map(x, x, padding=padding, backend=name, return_cs=True)
    assert bool((smap == 1).all()) and bool((cmap == 1).all())
    assert splatloss.ssim(x, x, padding=padding, backend=name).item() == 1.0
    assert splatloss.dssim_l1(x, x, padding=padding, backend=name).item() == 0.0
