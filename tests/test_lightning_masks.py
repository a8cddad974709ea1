"""A view's mask reaches the loss as the same device tensor step after step: the loss checks a mask
once per tensor and version, so a mask moved anew every step would be read back to the host (a
device synchronisation on a GPU) on every step."""

import torch

import splatloss
from splatloss.lightning.module import SplatModule
from splatloss.splat.gaussians import Gaussians

LR = {"means": 1e-3, "quats": 1e-3, "log_scales": 1e-3, "opacity_logits": 1e-3, "colors": 1e-2}


def _batch(index, mask):
    # what the data loader hands over each step: new CPU tensors, the view known by its index
    return {"image": torch.rand(8, 8, 3), "index": torch.tensor(index), "mask": mask.clone()}


def test_a_views_mask_is_moved_once_and_handed_on_as_the_same_tensor():
    module = SplatModule(Gaussians.random(10), splatloss.PhotometricLoss(l1=0.8, dssim=0.2), LR)
    dev = torch.device("cpu")
    alpha = (torch.rand(8, 8) > 0.5).float()
    first = module.transfer_batch_to_device(_batch(3, alpha), dev, 0)
    again = module.transfer_batch_to_device(_batch(3, alpha), dev, 0)
    other = module.transfer_batch_to_device(_batch(4, 1 - alpha), dev, 0)
    assert again["mask"] is first["mask"] and torch.equal(first["mask"], alpha)
    assert other["mask"] is not first["mask"] and torch.equal(other["mask"], 1 - alpha)
    assert again["image"] is not first["image"]  # the rest moves as Lightning moves it
    # a batch without a mask, or without the view's index, is Lightning's own transfer
    plain = module.transfer_batch_to_device({"image": torch.rand(8, 8, 3), "index": torch.tensor(3)}, dev, 0)
    assert "mask" not in plain
