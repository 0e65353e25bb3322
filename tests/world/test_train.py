"""``models.world.training.train`` end to end at a test-sized shape: shape flags, float16 weights, reports."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from models.world.configs import TINY, read_config
from models.world.model import WorldModel
from models.world.start_frames import load_start_frames
from models.world.training import train
from models.world.training.start_frames import main as add_start_frames

# the TEST config's shape through the flags: 32x32 frames, seconds on one CPU thread
SHAPE = ["--latent-channels", "4", "--dim", "32", "--heads", "2", "--depth", "2", "--ffn-dim", "64"]
SHAPE += ["--decoder-channels", "8", "8", "--decoder-res-levels", "1"]
STEPS = ["--clips", "8", "--ae-steps", "2", "--dit-steps", "2", "--dec-steps", "2"]
STEPS += ["--ae-batch", "2", "--dit-batch", "2", "--heldout", "2"]


def test_tiny_run_writes_float16_weights_of_the_flagged_shape_that_load_and_step(tmp_path, capsys):
    out = tmp_path / "w.safetensors"
    assert train.main(["--device", "cpu", "--out", str(out), *SHAPE, *STEPS]) == 0
    cfg = read_config(out)
    assert (cfg.latent_channels, cfg.dim, cfg.depth, cfg.decoder_res_levels) == (4, 32, 2, 1)
    assert cfg.decoder_channels == (8, 8) and cfg.frame_width == 32 and cfg.name == TINY.name
    with safe_open(str(out), "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys() if k != "start.tokens"}
    assert dtypes == {torch.float16}
    # start frames: 16 per theme by default, encoded at the model's latent shape
    assert load_start_frames(out).latents.shape == (64, 4, 8, 8)
    model = WorldModel.from_weights(out, slots=1)
    assert next(model.dit.parameters()).dtype == torch.float32
    assert any(k.startswith("res.0.") for k in model.decoder.state_dict())
    # the final report lines parse: held-out PSNR of the decoder and the generated frames' stats
    lines = capsys.readouterr().out.splitlines()
    held = json.loads(next(line for line in lines if line.startswith("held-out:")).split(":", 1)[1])
    assert held["recon_psnr"] > 0 and 0 < held["truth_mean_gradient"] < 1


def test_float32_is_kept_on_request_and_bad_shapes_fail_before_training(tmp_path):
    out = tmp_path / "w32.safetensors"
    train.main(["--device", "cpu", "--out", str(out), "--weights-dtype", "float32", *SHAPE, *STEPS])
    with safe_open(str(out), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys() if k != "start.tokens"} == {torch.float32}
    with pytest.raises(ValueError, match="decoder_res_levels"):
        train.main(["--device", "cpu", "--out", str(out), "--decoder-res-levels", "5", *STEPS])
    # 64 channels x 2x2 patches = 256 outputs per token from TINY's dim 128: the rank check
    with pytest.raises(ValueError, match="output rank"):
        train.main(["--device", "cpu", "--out", str(out), "--latent-channels", "64", *STEPS])


def test_autoencoder_saved_by_one_run_is_loaded_by_the_next_which_skips_stage_1(tmp_path, capsys):
    ae, out, png = tmp_path / "ae.safetensors", tmp_path / "w.safetensors", tmp_path / "sheet.png"
    base = ["--device", "cpu", "--out", str(out), *SHAPE, *STEPS]
    assert train.main([*base, "--autoencoder-only", "--save-autoencoder", str(ae), "--png", str(png)]) == 0
    assert not out.exists() and png.stat().st_size > 0  # stage 1 only: no model file
    first = capsys.readouterr().out
    held = json.loads(
        next(line for line in first.splitlines() if line.startswith("held-out:")).split(":", 1)[1]
    )
    assert "sampled_psnr" not in held and held["recon_psnr"] > 0
    # no stage 3 either, so the final report's decoder is the loaded one
    assert train.main([*base, "--autoencoder", str(ae), "--dec-steps", "0"]) == 0
    second = capsys.readouterr().out
    assert "ae done" not in second and "dit done" in second and out.exists()
    # the held-out data are seeded: the loaded autoencoder reconstructs exactly as the saved one
    held2 = json.loads(
        next(line for line in second.splitlines() if line.startswith("held-out:")).split(":", 1)[1]
    )
    assert held2["recon_psnr"] == held["recon_psnr"]
    # the start-frames CLI re-renders them from the saved autoencoder into the model file
    assert add_start_frames(["--weights", str(out), "--autoencoder", str(ae), "--per-theme", "2"]) == 0
    assert load_start_frames(out).latents.shape[0] == 8
    # a loaded autoencoder must have the shape the flags ask for
    with pytest.raises(SystemExit, match="latent_channels"):
        train.main([*base[:4], *SHAPE[2:], "--latent-channels", "8", *STEPS, "--autoencoder", str(ae)])
