"""The Triton combine (MS-SSIM's ``[B, C, M]`` terms -> ``[B]``, one launch each way) against
:func:`splatloss.multiscale.combine` in float64 under torch autograd: values, gradients through
every branch of relu / smooth_positive / pow, special values, autograd plumbing and compile."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import conftest
from conftest import assert_rel, device_for, has_cuda
from splatloss import multiscale
from splatloss.backends.triton.combine import combine

pytestmark = [
    pytest.mark.triton,
    # the interpreter evaluates log2(0) = -inf and 0 * inf = nan in numpy, which warns; the kernel
    # selects those lanes away (or keeps torch's nan) on purpose
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
]

STANDARD = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
TAU = 0.01

# float32 against float64 on the same float32 terms: measured up to 2.5e-7 (values) and 5.6e-7
# (gradients, largest where a term in (0, tau) meets a small weight: w t^(w - 1) is steep there)
# normwise, over five seeds of the cases below, with the interpreter's (numpy float32) exp2 / log2.
# On CUDA the power is ex2.approx / lg2.approx (a few ulp per factor, five factors): the Triton
# kernels' bar of the conformance suite (not yet measured on a GPU for this kernel).
TOL = conftest.TOL["triton"]["ms_values"] if has_cuda() else 1e-6


def _terms(shape, tau, seed=0, contiguous=True):
    """Terms in (tau, 1), in (0, tau), exactly 0, negative, exactly tau (the 0.01 for the metric
    too): every branch of relu, smooth_positive and the power, scattered over images and scales."""
    g = torch.Generator().manual_seed(seed)
    B, C, M = shape
    if not contiguous:  # scales first in memory, and every other channel of twice as many
        base = torch.rand(M, B, 2 * C, generator=g)
        t = base.permute(1, 2, 0)[:, ::2, :]
    else:
        t = torch.rand(B, C, M, generator=g)
    t.mul_(0.9).add_(0.05)
    special = torch.tensor([0.3 * TAU, 0.0, -0.2, TAU, 0.7 * TAU, -1e-3])
    pick = torch.rand(t.shape, generator=g) < 0.35
    which = torch.randint(len(special), t.shape, generator=g)
    t[pick] = special[which[pick]]
    assert t.is_contiguous() == contiguous
    return t.to(device_for("triton"))


def _both(terms, weights, tau, upstream):
    """(value, gradient) of the Triton combine in float32 and of multiscale.combine in float64."""
    x = terms.detach().clone().requires_grad_()  # clone keeps the strides
    out = combine(x, weights, tau)
    (g,) = torch.autograd.grad((out * upstream).sum(), x)
    x6 = terms.detach().cpu().double().requires_grad_()
    ref = multiscale.combine(x6, weights, tau)
    (g6,) = torch.autograd.grad((ref * upstream.cpu().double()).sum(), x6)
    return out, g, ref, g6


CASES = {
    "1x1x1": ((1, 1, 1), (0.7,), True),
    "7x3x5 standard": ((7, 3, 5), STANDARD, True),
    "7x3x5 zero and unit weights": ((7, 3, 5), (0.2, 0.0, 1.0, 0.3, 0.5), True),
    "7x3x5 non-contiguous": ((7, 3, 5), STANDARD, False),
}


@pytest.mark.parametrize("tau", [None, TAU], ids=["metric", "loss"])
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_gradients_match_float64_torch(case, tau):
    shape, weights, contiguous = CASES[case]
    terms = _terms(shape, tau, contiguous=contiguous)
    upstream = torch.randn(shape[0], generator=torch.Generator().manual_seed(1)).to(terms.device)
    out, g, ref, g6 = _both(terms, weights, tau, upstream)
    assert out.dtype == torch.float32 and out.shape == (shape[0],)
    assert g.shape == terms.shape and g.dtype == torch.float32
    assert_rel(out, ref, TOL, f"{case} value")
    assert_rel(g, g6, TOL, f"{case} gradient")
    if tau is not None:  # the loss's gradient is never dead where its weight is not 0
        w = torch.tensor(weights, device=g.device)
        assert (g[..., w != 0] != 0).all()


def test_branches_agree_one_at_a_time():
    # one image per special term beside plain ones, so that no zero factor hides another branch
    x = torch.tensor([0.5, 0.3 * TAU, 0.0, -0.2, TAU, 1.0, 2 * TAU]).view(-1, 1, 1)
    x = torch.cat([x, torch.full_like(x, 0.8)], dim=-1).to(device_for("triton"))
    upstream = torch.linspace(-1.0, 2.0, x.shape[0], device=x.device)
    for weights in ((0.3, 0.7), (0.0, 1.0), (1.0, 0.5)):
        for tau in (None, TAU):
            out, g, ref, g6 = _both(x, weights, tau, upstream)
            assert_rel(out, ref, TOL, f"{weights} {tau} value")
            assert_rel(g, g6, TOL, f"{weights} {tau} gradient")


def test_special_values_follow_torch():
    # torch's x ** 0 = 1 (0 ** 0 and nan ** 0 too), 0 ** w = 0, relu and clamp keep nan, and autograd's
    # selects: the same values and the same nan / inf in the gradients
    nan, inf = float("nan"), float("inf")
    rows = [[0.0, 0.5], [-0.1, 0.5], [nan, 0.5], [inf, 0.5], [-inf, 0.5], [0.0, 0.0], [0.5, nan], [TAU, 0.3]]
    x = torch.tensor(rows).view(-1, 1, 2).to(device_for("triton"))
    upstream = torch.linspace(0.5, 1.5, x.shape[0], device=x.device)
    for weights in ((0.5, 0.5), (0.0, 1.0), (1.0, 0.0)):
        for tau in (None, TAU):
            out, g, ref, g6 = _both(x, weights, tau, upstream)
            what = f"weights={weights} tau={tau}"
            torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-6, atol=0, equal_nan=True, msg=what)
            torch.testing.assert_close(g.double().cpu(), g6, rtol=1e-6, atol=0, equal_nan=True, msg=what)


def test_upstream_from_a_sum_and_from_some_images_only():
    terms = _terms((7, 3, 5), TAU, seed=2)
    x = terms.clone().requires_grad_()
    x6 = terms.cpu().double().requires_grad_()
    # a sum's backward hands the kernel an expanded upstream gradient (stride 0)
    (g,) = torch.autograd.grad(combine(x, STANDARD, TAU).sum() * 0.3, x)
    (g6,) = torch.autograd.grad(multiscale.combine(x6, STANDARD, TAU).sum() * 0.3, x6)
    assert_rel(g, g6, TOL, "sum")
    # images outside the loss get an exact zero
    (g,) = torch.autograd.grad(combine(x, STANDARD, TAU)[:2].sum(), x)
    assert (g[2:] == 0).all() and (g[:2] != 0).any()


def test_no_graph_without_a_gradient_to_compute():
    terms = _terms((3, 2, 5), None, seed=3)
    out = combine(terms, STANDARD)
    assert not out.requires_grad and out.grad_fn is None
    with torch.no_grad():
        x = terms.clone().requires_grad_()
        assert combine(x, STANDARD).grad_fn is None
    # only the terms have a gradient: weights and tau are not inputs autograd sees
    x = terms.clone().requires_grad_()
    combine(x, STANDARD, TAU).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_double_backward_is_refused():
    x = _terms((2, 3, 5), TAU, seed=4).requires_grad_()
    with pytest.raises(ValueError, match="ms_ssim combine has no second derivative"):
        torch.autograd.grad(combine(x, STANDARD, TAU).sum(), x, create_graph=True)


def test_terms_that_do_not_match_the_weights_are_refused():
    x = torch.rand(2, 3, 4, device=device_for("triton"))
    with pytest.raises(ValueError, match=r"M = len\(weights\) = 5 scales, got shape \(2, 3, 4\)"):
        combine(x, STANDARD)
    with pytest.raises(ValueError, match="got shape"):
        combine(x[0], STANDARD[:4])


@pytest.mark.slow  # torch.compile: the whole suite, beside tests/test_compile.py's Triton losses
def test_compiles_fullgraph_as_the_two_ops_and_equals_eager():
    # aot_eager (as tests/test_compile.py): dynamo and AOTAutograd through the ops' fake and
    # autograd registrations, the kernels run as in eager
    terms = _terms((4, 3, 5), TAU, seed=5)

    def fn(x):
        return 1.0 - combine(x, STANDARD, TAU).mean()

    counter = CompileCounterWithBackend("aot_eager")
    xc = terms.clone().requires_grad_()
    value = torch.compile(fn, fullgraph=True, backend=counter)(xc)
    (grad,) = torch.autograd.grad(value, xc)
    xe = terms.clone().requires_grad_()
    ref = fn(xe)
    (ref_grad,) = torch.autograd.grad(ref, xe)
    assert counter.frame_count == 1
    ops = {str(n.target) for gm in counter.graphs for n in gm.graph.nodes}
    assert any("triton_ms_combine" in op for op in ops), ops
    # the same kernels: bitwise the same (measured 0)
    assert torch.equal(value, ref) and torch.equal(grad, ref_grad)
