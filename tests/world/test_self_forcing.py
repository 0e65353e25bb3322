"""``models.world.training.self_forcing`` at a test-sized shape: the rollout, DMD's loss, the CLI end to end."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from models.world.configs import read_config
from models.world.dit import CausalDiT
from models.world.model import WorldModel
from models.world.prompts import WordEmbedding
from models.world.start_frames import load_start_frames
from models.world.training import self_forcing, train

SHAPE = ["--latent-channels", "4", "--dim", "32", "--heads", "2", "--depth", "2", "--ffn-dim", "64"]
SHAPE += ["--decoder-channels", "8", "8", "--decoder-res-levels", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A test-sized model file and its autoencoder, from train.py (seconds)."""
    d = tmp_path_factory.mktemp("sf")
    ae, out = d / "ae.safetensors", d / "w.safetensors"
    steps = ["--clips", "8", "--ae-steps", "2", "--dit-steps", "2", "--dec-steps", "0", "--ae-batch", "2"]
    steps += ["--dit-batch", "2", "--heldout", "2", "--start-frames-per-theme", "2"]
    torch.set_num_threads(1)
    train.main(["--device", "cpu", "--out", str(out), "--save-autoencoder", str(ae), *SHAPE, *steps])
    return out, ae


def _tf(cfg, n: int, seed: int = 0) -> train.TeacherForced:
    torch.manual_seed(seed)
    return train.TeacherForced(cfg, CausalDiT(cfg).eval(), WordEmbedding(cfg), n, "cpu")


def test_the_final_pass_recomputed_with_a_gradient_is_the_rollouts_and_the_start_is_pinned(trained):
    cfg = read_config(trained[0])
    tf, n = _tf(cfg, 4), 4
    start = torch.randn(2, cfg.latent_channels, cfg.latent_height, cfg.latent_width)
    acts, themes = torch.zeros(2, n, 6), torch.tensor([0, 3])
    clean, last_input = self_forcing.self_rollout(tf, start, acts, themes)
    assert torch.equal(clean[:, 0], start) and clean.shape == (2, n, *start.shape[1:])
    x0 = self_forcing.generator_x0(tf, clean, last_input, acts, themes)
    assert torch.allclose(x0, clean, atol=1e-5)
    # later in a session (frames after the sink moved by an offset) the same holds, with other x0
    offset = torch.tensor([0, 100])
    late, late_input = self_forcing.self_rollout(tf, start, acts, themes, offset)
    assert torch.allclose(
        self_forcing.generator_x0(tf, late, late_input, acts, themes, offset), late, atol=1e-5
    )
    # each block continues its own past: another start changes every later block
    other, _ = self_forcing.self_rollout(tf, start.flip(0), acts, themes)
    assert not torch.allclose(other[:, 1:], clean[:, 1:])


def test_dmd_gradient_vanishes_while_the_fake_score_is_the_real_one(trained):
    cfg = read_config(trained[0])
    real = _tf(cfg, 4)
    same = train.TeacherForced(cfg, copy.deepcopy(real.dit), real.words, 4, "cpu")
    x0 = torch.randn(2, 4, cfg.latent_channels, cfg.latent_height, cfg.latent_width, requires_grad=True)
    acts, themes = torch.zeros(2, 4, 6), torch.tensor([1, 2])
    assert self_forcing.dmd_loss(real, same, x0, acts, themes).item() == 0.0
    with torch.no_grad():
        next(same.dit.parameters()).add_(0.1)
    loss = self_forcing.dmd_loss(real, same, x0, acts, themes)
    loss.backward()
    assert loss.item() > 0 and x0.grad[:, 0].abs().sum() == 0 and x0.grad[:, 1:].abs().sum() > 0


def test_cli_fine_tunes_and_writes_a_loadable_model_file_with_its_report(trained, tmp_path, capsys):
    init, ae = trained
    out, rep = tmp_path / "sf.safetensors", tmp_path / "sf.json"
    args = ["--device", "cpu", "--init", str(init), "--autoencoder", str(ae), "--out", str(out)]
    args += "--clips 4 --latents 4 --steps 1 --batch 2 --critic-steps 1 --anchor-weight 0.1".split()
    args += (
        "--gan-weight 0.1 --gan-batch 1 --start-frames-per-theme 2 --drift-seconds 1 --max-offset 8".split()
    )
    args += "--ema 0.5 --weights-dtype float32".split()  # one warm-up step: a tiny move, kept visible
    assert self_forcing.main([*args, "--report", str(rep)]) == 0
    assert read_config(out) == read_config(init) and load_start_frames(out).latents.shape[0] == 8
    before = WorldModel.from_weights(init, slots=1).dit.state_dict()
    after = WorldModel.from_weights(out, slots=1).dit.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the generator moved
    printed = capsys.readouterr().out
    assert "sf done: 1 generator steps" in printed and all(
        k in printed for k in ("critic", "dmd", "anchor", "adv")
    )
    figures = json.loads(rep.read_text())
    assert set(figures) == {"weights", "control_response", "generated", "drift"}
    assert figures["drift"]["start_psnr"] is not None
    with pytest.raises(SystemExit):
        self_forcing.main([*args, "--latents", "1"])
