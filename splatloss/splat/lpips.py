"""LPIPS (Zhang et al. 2018, "The Unreasonable Effectiveness of Deep Features as a Perceptual
Metric", v0.1) from weight files on this machine: nothing is downloaded, torchvision is not needed.

The network is the reference one (``richzhang/PerceptualSimilarity``, ``lpips.LPIPS(net=...)``,
which torchmetrics copies): images in [0, 1] mapped to [-1, 1], shifted and scaled per channel
(``shift = (-0.030, -0.088, -0.188)``, ``scale = (0.458, 0.448, 0.450)``), the ReLU outputs of five
stages of torchvision's ImageNet AlexNet or VGG16 ``features``, each normalised to unit length over
channels, squared differences weighted by LPIPS's learned 1x1 convolutions, averaged over the
image, summed over the stages.

Two files: the backbone (torchvision's ImageNet weights, ``alexnet-owt-7be5be79.pth`` or
``vgg16-397923af.pth``; keys ``features.<i>.weight`` / ``.bias``) and the linear layers (LPIPS's
``v0.1/alex.pth`` or ``vgg.pth``, keys ``lin<k>.model.1.weight``; the same files ship inside the
``lpips`` package and inside torchmetrics, ``torchmetrics/functional/image/lpips_models/``).
docs/splat.md ("Evaluation") gives the recipe.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import torch
from torch import nn

__all__ = ["LPIPS", "NETS"]

# Per net: torchvision's ``features`` layers ("C", in, out, kernel, stride, padding) / "R" (ReLU) /
# "M" (max pool, kernel, stride), the index ranges of the five stages, their channel counts.
NETS = {
    "alex": {
        "layers": [("C", 3, 64, 11, 4, 2), "R", ("M", 3, 2), ("C", 64, 192, 5, 1, 2), "R", ("M", 3, 2),
                   ("C", 192, 384, 3, 1, 1), "R", ("C", 384, 256, 3, 1, 1), "R", ("C", 256, 256, 3, 1, 1), "R"],
        "stages": [(0, 2), (2, 5), (5, 8), (8, 10), (10, 12)],
        "channels": [64, 192, 384, 256, 256],
        "backbone_file": "alexnet-owt-7be5be79.pth",
        "backbone_url": "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
    },
    "vgg": {
        "layers": [("C", 3, 64, 3, 1, 1), "R", ("C", 64, 64, 3, 1, 1), "R", ("M", 2, 2),
                   ("C", 64, 128, 3, 1, 1), "R", ("C", 128, 128, 3, 1, 1), "R", ("M", 2, 2),
                   ("C", 128, 256, 3, 1, 1), "R", ("C", 256, 256, 3, 1, 1), "R", ("C", 256, 256, 3, 1, 1), "R",
                   ("M", 2, 2),
                   ("C", 256, 512, 3, 1, 1), "R", ("C", 512, 512, 3, 1, 1), "R", ("C", 512, 512, 3, 1, 1), "R",
                   ("M", 2, 2),
                   ("C", 512, 512, 3, 1, 1), "R", ("C", 512, 512, 3, 1, 1), "R", ("C", 512, 512, 3, 1, 1), "R"],
        "stages": [(0, 4), (4, 9), (9, 16), (16, 23), (23, 30)],
        "channels": [64, 128, 256, 512, 512],
        "backbone_file": "vgg16-397923af.pth",
        "backbone_url": "https://download.pytorch.org/models/vgg16-397923af.pth",
    },
}  # fmt: skip


def _layer(spec) -> nn.Module:
    if spec == "R":
        return nn.ReLU(inplace=False)
    if spec[0] == "M":
        return nn.MaxPool2d(kernel_size=spec[1], stride=spec[2])
    _, cin, cout, k, s, p = spec
    return nn.Conv2d(cin, cout, kernel_size=k, stride=s, padding=p)


def default_linear_file(net: str) -> Optional[str]:
    """LPIPS's linear weights for ``net`` as torchmetrics ships them, when torchmetrics is installed."""
    try:
        import torchmetrics.functional.image as tmi
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(tmi.__file__), "lpips_models", f"{net}.pth")
    return path if os.path.isfile(path) else None


class LPIPS(nn.Module):
    """LPIPS distance of ``(B, 3, H, W)`` images in [0, 1]; ``forward`` returns ``(B,)``.

    Build it with :meth:`from_files` (weights from disk); ``LPIPS(net)`` alone has random weights.
    """

    def __init__(self, net: str = "alex"):
        super().__init__()
        if net not in NETS:
            raise ValueError(f"LPIPS: net must be one of {sorted(NETS)}, got {net!r}")
        spec = NETS[net]
        self.net = net
        self.features = nn.Sequential(*[_layer(s) for s in spec["layers"]])
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, kernel_size=1, bias=False) for c in spec["channels"])
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188])[None, :, None, None], persistent=False)
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450])[None, :, None, None], persistent=False)
        self.requires_grad_(False)
        self.eval()

    @classmethod
    def from_files(cls, net: str, backbone: Optional[str], linear: Optional[str] = None) -> "LPIPS":
        """Load the backbone (torchvision's ImageNet ``features``) and LPIPS's linear layers.

        ``linear=None`` takes torchmetrics's copy when torchmetrics is installed. A missing or
        unreadable file, or one whose tensors do not fit the net, is a ``ValueError`` naming it.
        """
        if net not in NETS:
            raise ValueError(f"metrics.lpips_net must be one of {sorted(NETS)}, got {net!r}")
        spec = NETS[net]
        if not backbone:
            raise ValueError(
                f"LPIPS ({net}) needs the backbone's ImageNet weights {spec['backbone_file']} on this machine "
                f"(nothing is downloaded): fetch {spec['backbone_url']} once and pass metrics.lpips_backbone=<file>"
            )
        if not linear:
            linear = default_linear_file(net)
            if linear is None:
                raise ValueError(
                    f"LPIPS ({net}) needs its linear layers (v0.1/{net}.pth of the lpips package) on this machine: "
                    f"pass metrics.lpips_linear=<file>, or install torchmetrics, which ships them"
                )
        model = cls(net)
        model._load(
            model.features, _read(backbone, "metrics.lpips_backbone"), backbone, r"(?:features\.)?(\d+)\.(weight|bias)"
        )
        model._load(
            model.lins, _read(linear, "metrics.lpips_linear"), linear, r"(?:lins\.|lin)(\d+)\.model\.\d+\.(weight)"
        )
        return model

    @staticmethod
    def _load(module: nn.Module, sd: dict, path: str, pattern: str) -> None:
        """Copy ``sd``'s tensors matching ``pattern`` (index, kind) into ``module[index].kind``; every
        parameter of ``module`` must be found, with its shape."""
        found = {}
        for key, value in sd.items():
            m = re.fullmatch(pattern, key)
            if m:
                found[f"{m.group(1)}.{m.group(2)}"] = value
        own = dict(module.named_parameters())
        missing = sorted(k for k in own if k not in found)
        wrong = sorted(k for k in own if k in found and tuple(found[k].shape) != tuple(own[k].shape))
        if missing or wrong:
            detail = f"missing {missing[:4]}" if missing else ""
            if wrong:
                k = wrong[0]
                detail += ("; " if detail else "") + f"{k} is {tuple(found[k].shape)}, expected {tuple(own[k].shape)}"
            raise ValueError(
                f"LPIPS weights {path!r} do not fit the {type(module).__name__} of this net: {detail} (keys of the "
                f"file: {sorted(sd)[:6]}...); is it the file for this net?"
            )
        with torch.no_grad():
            for k, p in own.items():
                p.copy_(found[k].to(p.dtype))

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.shape != target.shape or pred.ndim != 4 or pred.shape[1] != 3:
            raise ValueError(
                f"LPIPS: expected two (B, 3, H, W) images of one shape, got {tuple(pred.shape)} and "
                f"{tuple(target.shape)}"
            )
        feats = []
        for img in (pred, target):
            x = ((img * 2 - 1) - self.shift) / self.scale
            out = []
            try:
                for lo, hi in NETS[self.net]["stages"]:
                    x = self.features[lo:hi](x)
                    out.append(x / (x.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10))
            except RuntimeError as e:
                raise ValueError(
                    f"LPIPS ({self.net}) cannot run on {tuple(img.shape[-2:])} images: {e}; it needs images of at "
                    "least 32x32"
                ) from None
            feats.append(out)
        total = 0
        for lin, a, b in zip(self.lins, *feats):
            total = total + lin((a - b) ** 2).mean(dim=(2, 3))
        return total.flatten()


def _read(path: str, key: str) -> dict:
    if not os.path.isfile(str(path)):
        raise ValueError(f"{key}: the LPIPS weights file {str(path)!r} does not exist (docs/splat.md, 'Evaluation')")
    try:
        sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(
            f"{key}: the LPIPS weights file {str(path)!r} cannot be read ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(sd, dict):
        raise ValueError(f"{key}: the LPIPS weights file {str(path)!r} holds a {type(sd).__name__}, not a state dict")
    return sd
