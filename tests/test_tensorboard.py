"""``logger=tensorboard``: a short run writes TensorBoard events with the loss, its terms and
weights, the step time, the held-out metrics and the held-out renders, read back with TensorBoard's
own reader."""

import glob
import io
import math
import os

import matplotlib.image as mpimg
import pytest
from omegaconf import OmegaConf, open_dict
from test_train import make_cfg

from splatloss.train import CONFIG_DIR, train


def _events(out_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = os.path.join(out_dir, "tensorboard", "version_0")
    # Lightning closes the writer after each validate() and fit(), and the next one opens a new file
    # in the same folder: TensorBoard reads the folder's files as one run, and so does this reader.
    assert glob.glob(os.path.join(run, "events.out.tfevents.*")), os.listdir(out_dir)
    acc = EventAccumulator(run, size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


@pytest.mark.slow
def test_tensorboard_logger_records_loss_terms_weights_step_time_and_held_out_images(tmp_path):
    cfg = make_cfg(
        tmp_path,
        ["loss=dssim_l1", "trainer.max_steps=20", "trainer.log_every_n_steps=5", "eval_every_n_steps=10"],
    )
    with open_dict(cfg):  # the tiny test config drops the logger: put back the shipped tensorboard.yaml
        cfg.logger = OmegaConf.load(os.path.join(CONFIG_DIR, "logger", "tensorboard.yaml"))
        cfg.export_ply = False
    metrics = train(cfg)
    acc = _events(tmp_path)
    scalars = set(acc.Tags()["scalars"])
    expected = {"train/loss", "loss/l1", "loss/dssim", "weight/l1", "weight/dssim", "step_ms"}
    expected |= {"val/psnr", "val/ssim", "val/ssim_3dgs", "val/ssim_skimage", "val/ms_ssim"}
    assert expected <= scalars, sorted(expected - scalars)
    assert "hp_metric" not in scalars  # no placeholder scalar

    # Logged every 5 steps (Lightning's rows at steps 4, 9, ...), and each total is the weighted sum
    # of the terms logged at that step (float32 values: agree to ~1e-7 relative).
    loss = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert sorted(loss) == [4, 9, 14, 19], sorted(loss)
    for step, total in loss.items():
        terms = {t: {e.step: e.value for e in acc.Scalars(f"loss/{t}")}[step] for t in ("l1", "dssim")}
        weights = {t: {e.step: e.value for e in acc.Scalars(f"weight/{t}")}[step] for t in ("l1", "dssim")}
        assert math.isclose(total, sum(weights[t] * terms[t] for t in terms), rel_tol=1e-5), (step, terms, weights)
    assert all(e.value > 0 for e in acc.Scalars("step_ms"))
    # The last held-out PSNR in TensorBoard is the one metrics.json reports.
    assert math.isclose(acc.Scalars("val/psnr")[-1].value, metrics["psnr"], rel_tol=1e-6)

    # Held-out renders: prediction | ground truth, one per held-out view, at the untrained state
    # (step 0), mid-run (step 10) and the end (step 20).
    images = sorted(acc.Tags()["images"])
    assert images == ["held_out/test_000", "held_out/test_001"], images
    events = acc.Images("held_out/test_000")
    assert sorted({e.step for e in events}) == [0, 10, 20]
    assert (events[0].width, events[0].height) == (64, 32)
    decoded = mpimg.imread(io.BytesIO(events[-1].encoded_image_string), format="png")
    assert decoded.shape[:2] == (32, 64)
    # The right half is the ground truth: the same as the right half of the saved final render.
    saved = mpimg.imread(tmp_path / "renders" / "final" / "test_000.png")
    assert abs(decoded[:, 32:, :3] - saved[:, 32:, :3]).max() < 1.5 / 255
