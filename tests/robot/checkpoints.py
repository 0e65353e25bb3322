"""Small random-weight checkpoint folders in openpi's and LeRobot's layouts, for the tests.

openpi's layout is written by the production writer (``models.policy.checkpoint.write_random_openpi``:
the bench's ``--write-checkpoint``), with a tiny sentencepiece tokenizer trained on the spot.
LeRobot's (``config.json`` + ``model.safetensors`` under ``model.`` + ``policy_preprocessor.json``
and its normalizer's safetensors, as ``PI0Policy.save_pretrained`` and its processor pipeline
write them) only the tests need. Sizes: ``SMALL`` (one 72-wide SigLIP head, 2 Gemma layers).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from models.policy.checkpoint import TOKENIZER_FILE
from models.policy.checkpoint_writer import openpi_state_dict, write_random_openpi, write_tokenizer
from models.policy.pi0 import PI0_TINY, Pi0Config, build

SMALL = replace(PI0_TINY, vision_width=72, vision_heads=1, vision_mlp_width=96, vocab_size=512)
SMALL_PI05 = replace(SMALL, pi05=True, prompt_len=200)


def openpi_checkpoint(folder: Path, pi05: bool = False, preset: str = "libero", horizon: int = 50) -> Path:
    return write_random_openpi(folder, replace(SMALL_PI05 if pi05 else SMALL, action_horizon=horizon), preset)


LEROBOT_STATE_STATS = {"mean": [0.5] * 6, "std": [4.0] * 6, "q01": [-1.0] * 6, "q99": [3.0] * 6}
LEROBOT_ACTION_STATS = {"mean": [-0.5] * 6, "std": [0.5] * 6, "q01": [-3.0] * 6, "q99": [1.0] * 6}
LEROBOT_CAMERAS = ("observation.images.top", "observation.images.wrist")


def lerobot_checkpoint(folder: Path, pi05: bool = False) -> Path:
    """A LeRobot pi0 / pi0.5 policy folder: two cameras, a 6-dim state and 6-dim actions."""
    import torch
    from safetensors.torch import save_file

    config: Pi0Config = replace(SMALL_PI05 if pi05 else SMALL, action_horizon=10, max_cameras=2)
    folder.mkdir(parents=True, exist_ok=True)
    model = build(config, "cpu")
    save_file(
        {f"model.{k}": v for k, v in openpi_state_dict(model).items()}, str(folder / "model.safetensors")
    )
    mode = "QUANTILES" if pi05 else "MEAN_STD"
    features = {key: {"type": "VISUAL", "shape": [3, 224, 224]} for key in LEROBOT_CAMERAS}
    features["observation.state"] = {"type": "STATE", "shape": [6]}
    (folder / "config.json").write_text(
        json.dumps(
            {
                "type": "pi05" if pi05 else "pi0",
                "chunk_size": 10,
                "n_action_steps": 10,
                "max_state_dim": 32,
                "max_action_dim": 32,
                "tokenizer_max_length": config.prompt_len,
                "input_features": features,
                "output_features": {"action": {"type": "ACTION", "shape": [6]}},
                "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode},
            }
        )
    )
    stats = {f"observation.state.{k}": np.asarray(v, np.float32) for k, v in LEROBOT_STATE_STATS.items()}
    stats |= {f"action.{k}": np.asarray(v, np.float32) for k, v in LEROBOT_ACTION_STATS.items()}
    state_file = "policy_preprocessor_step_2_normalizer_processor.safetensors"
    save_file({k: torch.from_numpy(v) for k, v in stats.items()}, str(folder / state_file))
    steps = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8}, "state_file": state_file},
    ]
    (folder / "policy_preprocessor.json").write_text(
        json.dumps({"name": "policy_preprocessor", "steps": steps})
    )
    write_tokenizer(folder / TOKENIZER_FILE)
    return folder
