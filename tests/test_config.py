"""SSIMConfig: constants, windows, validation messages."""

import dataclasses
import math

import pytest
import torch

from splatloss.config import MS_SSIM_WEIGHTS, SSIMConfig, min_size


def test_defaults_and_constants():
    cfg = SSIMConfig()
    assert (cfg.window_size, cfg.sigma, cfg.window, cfg.padding, cfg.data_range) == (11, 1.5, "gaussian", "valid", 1.0)
    assert cfg.C1 == pytest.approx(1e-4, rel=1e-12) and cfg.C2 == pytest.approx(9e-4, rel=1e-12)
    cfg255 = SSIMConfig(data_range=255)
    assert cfg255.C1 == pytest.approx((0.01 * 255) ** 2) and cfg255.C2 == pytest.approx((0.03 * 255) ** 2)
    direct = SSIMConfig(c1=0.5, c2=0.25, k1=0.9)
    assert (direct.C1, direct.C2) == (0.5, 0.25)
    assert MS_SSIM_WEIGHTS == (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


def test_config_is_frozen_and_hashable():
    cfg = SSIMConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.sigma = 2.0
    assert hash(cfg) == hash(SSIMConfig())


def test_gaussian_window():
    cfg = SSIMConfig(window_size=7, sigma=1.2)
    w = cfg.window_1d(torch.float64)
    assert w.shape == (7,) and float(w.sum()) == pytest.approx(1.0, abs=1e-15)
    torch.testing.assert_close(w, w.flip(0))
    expected = torch.tensor([math.exp(-((i - 3) ** 2) / (2 * 1.2**2)) for i in range(7)], dtype=torch.float64)
    torch.testing.assert_close(w, expected / expected.sum())
    assert cfg.window_1d(torch.float16).dtype == torch.float16


def test_uniform_window():
    w = SSIMConfig(window="uniform", window_size=5).window_1d(torch.float64)
    torch.testing.assert_close(w, torch.full((5,), 0.2, dtype=torch.float64))


def test_min_size():
    assert min_size(11, "valid") == 11 and min_size(11, "reflect") == 6 and min_size(11, "same") == 1
    assert SSIMConfig(window_size=7, padding="reflect").min_size() == 4


@pytest.mark.parametrize(
    "kwargs,exc,message",
    [
        (dict(window_size=10), ValueError, "window_size must be an odd integer >= 3, got 10"),
        (dict(window_size=1), ValueError, "window_size must be an odd integer >= 3, got 1"),
        (dict(window_size=11.0), TypeError, r"window_size must be an odd integer >= 3, got 11.0 \(float\)"),
        (dict(window_size=True), TypeError, "window_size must be an odd integer >= 3, got True"),
        (dict(sigma=0), ValueError, "sigma must be a finite number > 0, got 0.0"),
        (dict(sigma=-1.5), ValueError, "sigma must be a finite number > 0, got -1.5"),
        (dict(sigma=float("nan")), ValueError, "sigma must be a finite number > 0, got nan"),
        (dict(sigma="1.5"), TypeError, r"sigma must be a positive real number, got '1.5' \(str\)"),
        (dict(window="box"), ValueError, r"window must be one of \('gaussian', 'uniform'\), got 'box'"),
        (dict(k1=0), ValueError, "k1 must be a finite number > 0, got 0.0"),
        (dict(k2=-0.03), ValueError, "k2 must be a finite number > 0, got -0.03"),
        (dict(c1=-1.0), ValueError, "c1 must be a finite number > 0, got -1.0"),
        (dict(c2=0.0), ValueError, "c2 must be a finite number > 0, got 0.0"),
        (dict(data_range=0), ValueError, "data_range must be a finite number > 0, got 0.0"),
        (dict(data_range=-1), ValueError, "data_range must be a finite number > 0, got -1.0"),
        (dict(padding="zeros"), ValueError, r"padding must be one of \('valid', 'same', 'reflect'\), got 'zeros'"),
    ],
)
def test_validation_messages(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        SSIMConfig(**kwargs)


def _literal_k_defaults(path):
    """(line, name) of every k1 / k2 (or pytorch_msssim's K) default given as a number literal in ``path``."""
    import ast

    tree = ast.parse(path.read_text())
    found = []

    def literal(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            return True
        return isinstance(node, ast.Tuple) and any(literal(e) for e in node.elts)

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            found += [(d.lineno, a.arg) for a, d in pairs if a.arg in ("k1", "k2", "K") and literal(d)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id in ("k1", "k2") and node.value is not None and literal(node.value):
                found.append((node.lineno, node.target.id))
    return found


def test_k1_k2_defaults_are_declared_once_in_config():
    """``splatloss.config.K1`` / ``K2`` are the one declaration: no other module writes the numbers."""
    import inspect
    import pathlib

    import splatloss
    from splatloss.config import K1, K2

    root = pathlib.Path(splatloss.__file__).parent
    offenders = {
        str(p.relative_to(root)): _literal_k_defaults(p)
        for p in root.rglob("*.py")
        if p.name != "config.py" and _literal_k_defaults(p)
    }
    assert offenders == {}
    assert (K1, K2) == (0.01, 0.03)
    for fn in (splatloss.s3im, splatloss.S3IMLoss, splatloss.ssim, splatloss.PhotometricLoss, splatloss.SSIMConfig):
        params = inspect.signature(fn).parameters
        assert (params["k1"].default, params["k2"].default) == (K1, K2), fn
    for fn in (splatloss.compat.ssim, splatloss.compat.ms_ssim, splatloss.compat.SSIM, splatloss.compat.MS_SSIM):
        assert tuple(inspect.signature(fn).parameters["K"].default) == (K1, K2), fn
