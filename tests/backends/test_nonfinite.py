"""A NaN or Inf pixel reaches only the gradients within its window footprint, on every backend,
masked or not: the moment shifts cannot carry the bad value to the whole plane (the torch backend's
shifts, one per row and column tile, are pixels inside every window that uses them; one number per
plane, or per Triton program, is taken over the finite pixels)."""

from __future__ import annotations

import pytest
import torch

import splatloss
from conftest import backend_params, device_for


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("backend", backend_params(slow_triton=True))
def test_bad_pixel_reaches_only_its_footprint(backend, masked):
    k = 7
    dev = device_for(backend)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(2, 2, 1, 24, 24, generator=g)
    x[0, 0, 12, 11] = float("nan")  # on the middle row: the row the cpu kernel's shift reads
    x[1, 0, 12, 11] = float("inf")  # (each image its own plane: one batch holds both)
    kw = {"mask": torch.ones(1, 1, 24, 24, device=dev)} if masked else {}
    counts = {}
    for name in ("reference", backend):
        xr = x.clone().to(dev if name == backend else "cpu").requires_grad_(True)
        yr = y.clone().to(xr.device).requires_grad_(True)
        m = {k_: v.to(xr.device) for k_, v in kw.items()}
        value = splatloss.ssim(xr, yr, window_size=k, padding="same", backend=name, **m)
        gx, gy = torch.autograd.grad(value, (xr, yr))
        counts[name] = [(int((~torch.isfinite(gx[i])).sum()), int((~torch.isfinite(gy[i])).sum())) for i in (0, 1)]
    footprint = (2 * k - 1) ** 2
    assert counts["reference"] == [(footprint, footprint)] * 2
    assert counts[backend] == counts["reference"], counts
