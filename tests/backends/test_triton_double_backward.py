"""Double backward through the Triton backend is refused, never returned without its graph.

The kernels' analytic gradient is not differentiable again: a gradient asked for with
``create_graph=True`` (a gradient penalty, a Hessian-vector product) would come back without a
graph and its own derivative would silently be zero. Every Triton op's backward refuses it with an
error that names the backend and the backends that support it.
"""

import pytest
import torch

import splatloss
from conftest import device_for, make_pair

pytestmark = pytest.mark.triton

T = "triton"


def _mask(x):
    return torch.linspace(0, 1, x.shape[-1], device=x.device).expand(x.shape[-2:])


CALLS = {
    "ssim": lambda x, y: splatloss.ssim(x, y, window_size=3, backend=T),
    "ssim_map": lambda x, y: splatloss.ssim_map(x, y, window_size=3, backend=T).mean(),
    "dssim_l1": lambda x, y: splatloss.dssim_l1(x, y, 0.2, window_size=3, backend=T).mean(),
    "ms_ssim": lambda x, y: splatloss.ms_ssim(x, y, weights=(0.5, 0.5), window_size=3, backend=T).mean(),
    "masked ssim": lambda x, y: splatloss.ssim(x, y, mask=_mask(x), window_size=3, backend=T),
    "masked ms_ssim": lambda x, y: splatloss.ms_ssim(x, y, mask=_mask(x), weights=(0.5, 0.5), window_size=3, backend=T),
}
REFUSAL = r"triton backend's .+ has no second derivative: .*create_graph=True.*use backend='torch' or 'reference'"


@pytest.mark.parametrize("name", [n if n == "ssim" else pytest.param(n, marks=pytest.mark.slow) for n in CALLS])
def test_create_graph_is_refused(name):
    x, y = make_pair((1, 2, 12, 13), seed=3, device=device_for(T))
    x.requires_grad_(True)
    with pytest.raises(ValueError, match=REFUSAL):
        torch.autograd.grad(CALLS[name](x, y), x, create_graph=True)
    # a first derivative alone is unaffected
    (g,) = torch.autograd.grad(CALLS[name](x, y), x)
    assert g.shape == x.shape and bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0


@pytest.mark.slow  # the fast tier's refusal: test_create_graph_is_refused[ssim]
def test_create_graph_on_the_target_image_is_refused_too():
    x, y = make_pair((1, 1, 10, 10), seed=4, device=device_for(T))
    y.requires_grad_(True)
    with pytest.raises(ValueError, match=REFUSAL):
        torch.autograd.grad(splatloss.ssim(x, y, window_size=3, backend=T), y, create_graph=True)
