"""dssim_with_gradient: the D-SSIM value and its gradient without a graph, against autograd and float64."""

import pytest
import torch

import splatloss
from conftest import TOL, assert_rel, backend_params, device_for, make_pair, side


@pytest.mark.parametrize("backend", backend_params(slow_triton=True) + ["reference"])
def test_dssim_with_gradient_uses_no_graph_and_matches_autograd(backend):
    """Value and gradient without a graph, against autograd through dssim on the same backend, and
    against the float64 reference; a given buffer is filled in place."""
    dev = device_for(backend)
    x, y = make_pair((2, 3, side(backend, 29, 16), side(backend, 33, 17)), seed=101, device=dev)
    for reduction in ("mean", "sum"):
        value, g = splatloss.dssim_with_gradient(x, y, reduction=reduction, padding="same", backend=backend)
        assert value.grad_fn is None and g.grad_fn is None and g.dtype == x.dtype
        xr = x.clone().requires_grad_()
        expected = splatloss.dssim(xr, y, reduction=reduction, padding="same", backend=backend)
        (eg,) = torch.autograd.grad(expected, xr)
        torch.testing.assert_close(value, expected.detach())
        torch.testing.assert_close(g, eg, atol=1e-8, rtol=1e-5)
        x6 = x.double().cpu().requires_grad_()
        v6 = splatloss.dssim(x6, y.double().cpu(), reduction=reduction, padding="same", backend="reference")
        (g6,) = torch.autograd.grad(v6, x6)
        if backend != "reference":
            assert_rel(value, v6, TOL[backend]["values"], f"dssim {reduction}")
            assert_rel(g, g6, TOL[backend]["grads"], f"dssim gradient {reduction}")
    buf = torch.full_like(x, float("nan"))
    value, g = splatloss.dssim_with_gradient(x, y, grad=buf, backend=backend)
    assert g is buf and bool(torch.isfinite(buf).all())
    xr = x.clone().requires_grad_()
    (eg,) = torch.autograd.grad(splatloss.dssim(xr, y, backend=backend), xr)
    torch.testing.assert_close(buf, eg, atol=1e-8, rtol=1e-5)
