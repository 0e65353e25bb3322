"""Start frames (``models/world/start_frames.py``): choice by prompt and seed, the first block held
at its start latent, the weights-file round trip and the committed model's own start frames."""

from __future__ import annotations

import torch

from models.world.configs import TEST, WEIGHTS_DIR, save_model_weights
from models.world.model import WorldModel
from models.world.prompts import tokenize
from models.world.start_frames import StartFrames, load_start_frames
from models.world.training.sharpness import frame_stats, generated_frames
from models.world.training.start_frames import add_to_weights
from tests.world.helpers import make_model, model_tensors, tick

THEMES = ("stone", "forest", "desert")


def _starts(cfg=TEST, per_theme: int = 2) -> StartFrames:
    g = torch.Generator().manual_seed(0)
    k = per_theme * len(THEMES)
    latents = torch.randn(k, cfg.latent_channels, cfg.latent_height, cfg.latent_width, generator=g)
    tokens = torch.stack([tokenize(t, cfg) for t in THEMES for _ in range(per_theme)])
    return StartFrames(latents.double(), tokens)


def test_a_start_is_chosen_among_its_prompt_word_by_seed_and_among_all_for_other_prompts():
    starts = _starts()
    forest = [starts.latents[2], starts.latents[3]]
    assert torch.equal(starts.choose(tokenize("a forest maze", TEST), 0), forest[0])
    assert torch.equal(starts.choose(tokenize("a forest maze", TEST), 5), forest[1])
    assert torch.equal(starts.choose(tokenize("lava", TEST), 4), starts.latents[4])  # no match: all 6
    assert torch.equal(starts.choose(tokenize(None, TEST), -1), starts.latents[5])


def test_the_first_block_holds_its_start_latent_and_later_blocks_are_generated():
    model = make_model()
    model.starts = _starts()
    model.open("a", seed=1)
    model.open("b", seed=1)
    first = model.generate([tick(model, "a", 0, prompt="desert")])[0]
    assert torch.equal(first[0], model.starts.latents[5])  # frame 0 of block 0: desert, seed 1
    assert not torch.equal(first[1], first[0])  # the block's other frame is denoised around it
    # batched with a session at its first block, a later block is not pinned to anything
    later, b_first = model.generate(
        [tick(model, "a", 1, prompt="desert"), tick(model, "b", 0, prompt="stone")]
    )
    assert torch.equal(b_first[0], model.starts.latents[1])
    assert not any(torch.equal(later[0], s) for s in model.starts.latents)
    # reset starts the session over from its start frame
    model.reset("a")
    assert torch.equal(model.generate([tick(model, "a", 0, prompt="desert")])[0][0], model.starts.latents[5])


def test_start_frames_round_trip_through_a_float16_model_file_and_replace_earlier_ones(tmp_path):
    path = tmp_path / "w.safetensors"
    model = make_model(dtype=torch.float32)
    tensors = model_tensors(model)
    save_model_weights(path, TEST, tensors, torch.float16)
    assert load_start_frames(path) is None and WorldModel.from_weights(path, slots=1).starts is None
    add_to_weights(path, _starts(per_theme=3))
    add_to_weights(path, _starts())  # replaces, never appends
    loaded = load_start_frames(path)
    assert loaded.latents.shape[0] == 6 and torch.equal(loaded.tokens, _starts().tokens)
    assert torch.allclose(loaded.latents, _starts().latents.float(), atol=2e-3)  # stored as float16
    built = WorldModel.from_weights(path, slots=1)
    assert built.starts.latents.dtype == torch.float32 and built.starts.latents.shape[0] == 6


def test_the_committed_model_starts_from_real_maze_frames_sharper_than_from_noise():
    """The committed weights ship start frames; without them (noise) the same model's frames are
    the blurred mean the start frames exist to avoid (the README's sharpness table)."""
    model = WorldModel.from_weights(WEIGHTS_DIR / "world-tiny.safetensors", slots=8)
    assert model.starts is not None and model.starts.latents.shape[0] == 64
    with_starts = frame_stats(torch.cat(generated_frames(model, seeds=(0,))), 128)["mean_gradient"]
    model.starts = None
    from_noise = frame_stats(torch.cat(generated_frames(model, seeds=(0,))), 128)["mean_gradient"]
    assert with_starts > 1.3 * from_noise
