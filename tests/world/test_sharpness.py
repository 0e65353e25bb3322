"""``models.world.training.sharpness``: the measures behind "sharper frames" order images the right way."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.world.training.env import MazeEnv
from models.world.training.sharpness import SCRIPT, frame_stats, psnr, script_actions, side_by_side


def _blur(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(F.pad(x, (2, 2, 2, 2), mode="replicate"), 5, stride=1)


def test_sharp_frames_score_above_their_blurred_copy_and_psnr_orders_them():
    sharp = MazeEnv(4, size=64, seed=1).render()
    blurred = _blur(sharp)
    s, b = frame_stats(sharp, 64), frame_stats(blurred, 64)
    assert s["mean_gradient"] > 1.5 * b["mean_gradient"] and s["high_freq_energy"] > 2 * b["high_freq_energy"]
    # a lower-resolution copy is measured after bilinear upscaling: the detail it lost stays lost
    small = F.interpolate(sharp, size=(32, 32), mode="area")
    assert frame_stats(small, 64)["mean_gradient"] < s["mean_gradient"]
    assert psnr(sharp, sharp) > 100 and psnr(sharp, blurred) > psnr(sharp, _blur(blurred))


def test_script_splits_into_whole_blocks_and_the_sheet_is_a_png(tmp_path):
    acts = script_actions()
    assert acts.shape == (sum(n for _, n in SCRIPT), 6) and all(n % 2 == 0 for _, n in SCRIPT)
    clip = MazeEnv(1, size=32, seed=0).render().expand(7, -1, -1, -1)
    side_by_side([[clip], [clip / 2]], tmp_path / "sheet.png", size=32, every=3)
    from PIL import Image

    with Image.open(tmp_path / "sheet.png") as img:
        assert img.size == (3 * 32, 2 * 32)
