"""PhotometricLoss as a training loop and a checkpoint see it: its weights in its state_dict, clear
errors, and logged terms that are the terms."""

from __future__ import annotations

import pytest
import torch

import splatloss
from splatloss.losses import TERMS


def test_state_dict_holds_the_scheduled_weights(tmp_path):
    loss = splatloss.PhotometricLoss.dssim_l1()
    loss.set_weight("l1", 0.4)
    loss.set_weight("dssim", 0.6)
    holder = torch.nn.Sequential(loss)
    path = tmp_path / "loss.pt"
    torch.save(holder.state_dict(), path)
    fresh = torch.nn.Sequential(splatloss.PhotometricLoss.dssim_l1())
    fresh.load_state_dict(torch.load(path, weights_only=True))
    assert fresh[0].weights == loss.weights
    assert fresh[0].weights["dssim"] == 0.6
    x, y = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    assert torch.equal(fresh[0](x, y), loss(x, y))


def test_state_dict_of_another_shape_is_refused_naming_the_key():
    loss = splatloss.PhotometricLoss.dssim_l1()
    with pytest.raises(ValueError, match=r"PhotometricLoss state '_extra_state' must hold the 6 term weights"):
        loss.load_state_dict({"_extra_state": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"weight of term 'l2' must be a finite number >= 0, got -1.0"):
        loss.load_state_dict({"_extra_state": torch.tensor([1.0, -1.0, 0, 0, 0, 0])})
    assert len(TERMS) == 6


def test_every_weight_set_to_zero_is_an_error_that_names_the_fix():
    loss = splatloss.PhotometricLoss.dssim_l1()
    loss.set_weight("l1", 0.0)  # a schedule may pass through all-zero between two set_weight calls
    loss.set_weight("dssim", 0.0)
    x, y = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    with pytest.raises(ValueError, match=r"PhotometricLoss has no term with a weight > 0 to compute, got weights "):
        loss(x, y)
    loss.set_weight("dssim", 1.0)
    assert loss(x, y).item() > 0


def _backends():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "backends"))
    from conftest import backend_params

    return backend_params(("reference", "torch", "cpu", "triton"), slow_triton=True)


@pytest.mark.parametrize("name", _backends())
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_3_logged_terms_are_the_terms_whatever_their_weights(name, masked):
    """A term with a small weight is logged as itself, not recovered from the total."""
    from conftest import device_for, photo_pair

    dev = device_for(name)
    x, y = photo_pair(21, 22, seed=6, dtype=torch.float32, device=dev)
    mask = (torch.rand(21, 22, generator=torch.Generator().manual_seed(2)) > 0.3).float().to(dev) if masked else None
    want_d = splatloss.dssim(x, y, padding="same", backend=name, mask=mask)
    want_l1 = splatloss.dssim_l1(x, y, 0.0, padding="same", backend=name, mask=mask)
    for l1_weight, dssim_weight in ((1.0, 1e-6), (1e-6, 1.0), (0.8, 0.2)):
        loss = splatloss.PhotometricLoss(l1=l1_weight, dssim=dssim_weight, padding="same", backend=name)
        total = loss(x, y, mask=mask)
        d, l1 = loss.terms["dssim"], loss.terms["l1"]
        assert abs(d.item() - want_d.item()) <= 1e-6 * want_d.item(), (l1_weight, dssim_weight)
        assert abs(l1.item() - want_l1.item()) <= 1e-6 * want_l1.item(), (l1_weight, dssim_weight)
        assert total.item() == pytest.approx(l1_weight * l1.item() + dssim_weight * d.item(), rel=1e-6)
