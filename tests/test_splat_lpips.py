"""LPIPS from weight files on disk: the files' tensors land in the net, identical images score 0,
and a missing, unreadable or mismatched file is named in the error."""

import pytest
import torch

from splatloss.splat.lpips import LPIPS, default_linear_file


def _backbone_file(tmp_path, net, extra=None):
    """A backbone state dict in torchvision's layout (``features.<i>.*`` plus its classifier)."""
    torch.manual_seed(0)
    model = LPIPS(net)
    for p in model.features.parameters():
        p.data.normal_(0, 0.05)
    sd = {f"features.{k}": v.clone() for k, v in model.features.state_dict().items()}
    sd["classifier.1.weight"] = torch.zeros(4, 4)  # torchvision's head: not part of LPIPS
    sd.update(extra or {})
    path = tmp_path / f"{net}_backbone.pth"
    torch.save(sd, path)
    return str(path), sd


@pytest.mark.parametrize("net", ["alex", pytest.param("vgg", marks=pytest.mark.slow)])
def test_weights_come_from_the_files(tmp_path, net):
    linear = default_linear_file(net)
    if linear is None:
        pytest.skip("torchmetrics (which ships LPIPS's linear layers) is not installed")
    backbone, sd = _backbone_file(tmp_path, net)
    model = LPIPS.from_files(net, backbone, linear)
    for k, v in model.features.state_dict().items():
        assert torch.equal(v, sd[f"features.{k}"]), k
    lin = torch.load(linear, map_location="cpu")
    for k in range(5):
        assert torch.equal(model.lins[k].weight, lin[f"lin{k}.model.1.weight"])
    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 3, 40, 36, generator=g)
    b = (a + 0.2 * torch.rand(2, 3, 40, 36, generator=g)).clamp(0, 1)
    d = model(a, b)
    assert d.shape == (2,) and (d > 0).all()
    assert torch.equal(model(a, a), torch.zeros(2))
    torch.testing.assert_close(model(b, a), d, rtol=1e-6, atol=0)


def test_missing_unreadable_or_mismatched_files(tmp_path):
    with pytest.raises(ValueError, match=r"metrics.lpips_net must be one of \['alex', 'vgg'\], got 'squeeze'"):
        LPIPS.from_files("squeeze", "x", "y")
    with pytest.raises(ValueError, match=r"metrics.lpips_backbone: the LPIPS weights file '.*nope.pth' does not exist"):
        LPIPS.from_files("alex", str(tmp_path / "nope.pth"), str(tmp_path / "nope.pth"))
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"the LPIPS weights file '.*junk.pth' cannot be read"):
        LPIPS.from_files("alex", str(tmp_path / "junk.pth"), str(tmp_path / "junk.pth"))
    vgg_backbone, _ = _backbone_file(tmp_path, "vgg")
    with pytest.raises(
        ValueError, match=r"LPIPS weights '.*vgg_backbone.pth' do not fit .*0.weight is \(64, 3, 3, 3\)"
    ):
        LPIPS.from_files("alex", vgg_backbone, str(tmp_path / "junk.pth"))
    alex_backbone, _ = _backbone_file(tmp_path, "alex")
    torch.save({"lin0.model.1.weight": torch.zeros(1, 64, 1, 1)}, tmp_path / "lin.pth")
    with pytest.raises(ValueError, match=r"LPIPS weights '.*lin.pth' do not fit .*: missing \['1.weight'"):
        LPIPS.from_files("alex", alex_backbone, str(tmp_path / "lin.pth"))


def test_images_too_small_for_the_net():
    with pytest.raises(ValueError, match=r"LPIPS \(alex\) cannot run on \(16, 16\) images: .* at least 32x32"):
        LPIPS("alex")(torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16))
