"""The committed default responds to controls: turning slides the view, forward does not."""

from __future__ import annotations

from models.world.configs import WEIGHTS_DIR
from models.world.model import WorldModel
from models.world.training.train import control_response


def test_trained_default_turns_left_and_right_consistently():
    model = WorldModel.from_weights(WEIGHTS_DIR / "world-tiny.safetensors", slots=9)
    # 4 latent frames (16 pixel frames) of each probe, whatever the block length
    shift = control_response(model, seeds=(0, 1, 2), warmup=1, blocks=4 // model.cfg.frames_per_block)
    # shifts are in pixels per frame: the bound is 1.5 px at 64 px wide, scaled with the width
    bound = 1.5 * model.cfg.frame_width / 64
    # turning left slides the content right (+), turning right slides it left (-)
    assert shift["turn_left"] > bound, shift
    assert shift["turn_right"] < -bound, shift
    assert shift["turn_left"] - shift["forward"] > bound, shift
    assert shift["forward"] - shift["turn_right"] > bound, shift
