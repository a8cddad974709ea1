"""The rows-per-program list measured per launch shape (:mod:`splatloss.backends.triton.tune`).

On CUDA the launchers time a short list of rows per program on a shape's first call and keep the
fastest. In the interpreter the same mechanism runs with ``tune.FORCE`` (timed on the host) in the
CUDA geometry: every candidate launched, the choice kept and reused, the gradients bit for bit
those of any other rows, the values those of float64.
"""

import importlib
import time

import pytest
import torch

import splatloss
from conftest import TOL, assert_rel, device_for, make_pair

pytestmark = [pytest.mark.triton]

tune = importlib.import_module("splatloss.backends.triton.tune")
tri_launch = importlib.import_module("splatloss.backends.triton.launch")


def test_candidates_are_balanced_one_per_chunk_count():
    # 1080 rows: the plan (99 rows, 11 chunks) as planned, and 2 x 128, 128, 64, 50 balanced over
    # their chunks (5, 9, 17, 22); 32, 25 and 16 rows would make more than twice the plan's chunks
    assert tune.candidates(99, 1080) == [50, 64, 99, 120, 216]
    assert tune.candidates(16, 1080) == [16, 25, 32, 50, 64, 99, 120, 216]  # the plan's 68 chunks: up to 136
    # a short map: 40 rows in 1, 2 or 3 chunks (the plan's 16 rows make 3 chunks: kept as planned)
    assert tune.candidates(16, 40) == [16, 20, 40]
    assert tune.candidates(128, 1) == [128]  # one row: one chunk whatever the rows


def test_a_launchers_alternatives_are_measured_with_the_rows_and_kept(monkeypatch):
    # another geometry of the same launch (MS-SSIM's coarser scales at half the lanes) joins the
    # rows' list: launched, timed, kept where fastest, then reused without measuring again
    monkeypatch.setattr(tune, "FORCE", True)
    monkeypatch.setattr(tune, "ENABLED", True)
    monkeypatch.setattr(tune, "REPEATS", 1)
    monkeypatch.setattr(tune, "LAUNCHES", 1)
    tune.clear()
    seen = []
    narrow = (False, 20)

    def fn(cand):
        seen.append(cand)
        time.sleep(0.0 if cand == narrow else 0.02)
        return cand

    try:
        assert tune.run("scales", 16, 40, fn, torch.device("cpu"), alternatives=[narrow]) == narrow
        assert set(seen) == {16, 20, 40, narrow} and tune.chosen() == {"scales": narrow}
        seen.clear()
        assert tune.run("scales", 16, 40, fn, torch.device("cpu"), alternatives=[narrow]) == narrow
        assert seen == [narrow]
    finally:
        tune.clear()


@pytest.fixture
def forced(monkeypatch):
    """The CUDA geometry in the interpreter, the list run there, one timed round, nothing kept."""
    monkeypatch.setattr(tri_launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(tune, "FORCE", True)
    monkeypatch.setattr(tune, "ENABLED", True)
    monkeypatch.setattr(tune, "REPEATS", 1)
    monkeypatch.setattr(tune, "LAUNCHES", 1)
    measured = []
    real = tune._measure

    def spy(fn, cands, planned, device):
        measured.append(list(cands))
        return real(fn, cands, planned, device)

    monkeypatch.setattr(tune, "_measure", spy)
    tune.clear()
    yield measured
    tune.clear()


#: a 5-tap window: the interpreter's time grows with the taps a row unrolls
SMALL = dict(window_size=5, sigma=1.0)


def _loss_and_grads(x, y, mask=None, backend="triton"):
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    loss = splatloss.dssim_l1(xr, yr, 0.2, padding="same", mask=mask, backend=backend, **SMALL)
    return (loss.detach().reshape(1), *torch.autograd.grad(loss, [xr, yr]))


@pytest.mark.slow
def test_the_fastest_rows_are_kept_and_change_no_gradient_bit(forced, monkeypatch):
    """The fused D-SSIM + L1 (the backward kernel with its sums, in the forward) on a 24-row image:
    its first call measures 2 candidates (16 and 24 rows), the second reuses the choice;
    gradients equal bit for bit those of each candidate launched alone; the loss within the
    Triton tolerance of float64."""
    dev = device_for("triton")
    x, y = make_pair((1, 1, 24, 40), seed=11, device=dev)
    first = _loss_and_grads(x, y)
    assert forced == [[16, 24]], forced
    ((key, rows),) = tune.chosen().items()
    assert key[0] == "bwd" and rows in (16, 24)
    second = _loss_and_grads(x, y)
    assert len(forced) == 1  # kept: not measured again
    for a, b in zip(first[1:], second[1:]):
        assert torch.equal(a, b)
    # each candidate alone (the plan forced to it, the list off): the same gradient bits
    monkeypatch.setattr(tune, "ENABLED", False)
    monkeypatch.setattr(tri_launch, "ROW_STEPS", ())
    for r in (16, 24):
        monkeypatch.setattr(tri_launch, "CUDA_ROWS", r)
        alone = _loss_and_grads(x, y)
        assert torch.equal(alone[1], first[1]) and torch.equal(alone[2], first[2]), f"{r} rows"
        assert_rel(alone[0], first[0], 1e-6, f"loss at {r} rows")
    truth = _loss_and_grads(x.double().cpu(), y.double().cpu(), backend="reference")
    tol = TOL["triton"]
    assert_rel(first[0], truth[0], tol["values"], "loss")
    assert_rel(first[1], truth[1], tol["grads"], "grad img1")


@pytest.mark.slow
def test_forward_and_masked_launches_measure_once_per_shape(forced):
    """The forward kernel (SSIM without gradients) and the masked backward each measure on their
    first call of a shape, and a new shape measures again, up to ``MAX_SHAPES``; under
    deterministic algorithms nothing is measured (the planned rows)."""
    dev = device_for("triton")
    x, y = make_pair((1, 1, 24, 40), seed=12, device=dev)
    m = (torch.rand((1, 1, 24, 40), generator=torch.Generator().manual_seed(3)) * 0.5 + 0.5).to(dev)
    s = splatloss.ssim(x, y, padding="valid", backend="triton", **SMALL)
    splatloss.ssim(x, y, padding="valid", backend="triton", **SMALL)
    got = _loss_and_grads(x, y, mask=m)
    kinds = sorted(k[0] for k in tune.chosen())
    assert kinds == ["fwd", "masked_bwd"], tune.chosen()
    assert len(forced) == 2
    splatloss.ssim(x[..., :22, :], y[..., :22, :], padding="valid", backend="triton", **SMALL)  # a new shape
    assert len(forced) == 3
    tune.MAX_SHAPES, cap = len(tune.chosen()), tune.MAX_SHAPES
    try:  # no more shapes measured past the cap: a new one launches its planned rows
        splatloss.ssim(x[..., :21, :], y[..., :21, :], padding="valid", backend="triton", **SMALL)
    finally:
        tune.MAX_SHAPES = cap
    assert len(forced) == 3 and len(tune.chosen()) == 3
    truth = _loss_and_grads(x.double().cpu(), y.double().cpu(), mask=m.double().cpu(), backend="reference")
    tol = TOL["triton"]
    assert_rel(got[0], truth[0], tol["values"], "masked loss")
    assert_rel(got[1], truth[1], tol["grads"], "masked grad img1")
    s6 = splatloss.ssim(x.double().cpu(), y.double().cpu(), padding="valid", backend="reference", **SMALL)
    assert_rel(s.reshape(1), s6.reshape(1), tol["values"], "ssim")
    tune.clear()
    torch.use_deterministic_algorithms(True)
    try:
        splatloss.ssim(x, y, padding="valid", backend="triton", **SMALL)
    finally:
        torch.use_deterministic_algorithms(False)
    assert tune.chosen() == {} and len(forced) == 3


@pytest.mark.slow
def test_the_coarser_scales_measure_both_widths_and_keep_the_gradients(forced, monkeypatch):
    """MS-SSIM's coarser scales in one launch: the list holds the wide programs' rows and the
    narrow programs' (width, rows); whichever is kept, the gradients are the wide plan's bits."""
    from splatloss.backends.triton import backward as BW
    from splatloss.backends.triton.glue import window_taps
    from splatloss.config import SSIMConfig

    monkeypatch.setattr(tri_launch, "CUDA_ROWS", 8)
    monkeypatch.setattr(tri_launch, "ROW_STEPS", ())
    dev = device_for("triton")
    cfg = SSIMConfig(window_size=3, padding="same")
    dims = [(12, 40), (6, 20)]
    pairs = [make_pair((1, 1, h, w), seed=40 + j, device=dev) for j, (h, w) in enumerate(dims)]
    flat = [torch.cat([p[i].reshape(-1) for p in pairs]) for i in (0, 1)]
    args = (*flat, 1, 1, dims, window_taps(cfg, dev), cfg.padding, float(cfg.C1), float(cfg.C2), True, True)
    gx, gy, terms = BW.launch_bwd_scales(*args)
    assert forced == [[8, 12, (False, 8), (False, 12)]], forced
    ((key, kept),) = tune.chosen().items()
    assert key[0] == "bwd_scales" and kept in forced[0]
    monkeypatch.setattr(tune, "ENABLED", False)
    wx, wy, w_terms = BW.launch_bwd_scales(*args, wide=True)
    assert torch.equal(gx, wx) and torch.equal(gy, wy)
    for t, w_t in zip(terms, w_terms):
        assert_rel(t, w_t, 1e-6, "term")


def test_the_switch_takes_on_off_values_and_refuses_others(monkeypatch):
    monkeypatch.setenv("SPLATLOSS_TRITON_TUNE", " Off ")
    assert tune.env_switch("SPLATLOSS_TRITON_TUNE", "1") is False
    monkeypatch.setenv("SPLATLOSS_TRITON_TUNE", "yes")
    assert tune.env_switch("SPLATLOSS_TRITON_TUNE", "1") is True
    monkeypatch.setenv("SPLATLOSS_TRITON_TUNE", "fast")
    with pytest.raises(ValueError, match=r"SPLATLOSS_TRITON_TUNE must be one of .* got 'fast'"):
        tune.env_switch("SPLATLOSS_TRITON_TUNE", "1")
