"""pi0 / pi0.5 checkpoint folders (openpi and LeRobot layouts) through the serving code path:
``robot.policy`` + ``robot.checkpoint`` in a deploy config -> ``build_policy`` -> chunks; the
pre/post-processing against hand-computed values; malformed files as one-line config errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open

from models.policy.checkpoint import inspect
from models.policy.checkpoint_writer import openpi_state_dict
from models.policy.processing import discretize_state, resize_with_pad
from realtime.bench.examples import aloha, droid, libero
from realtime.config import ConfigError, config_from_mapping
from realtime.kinds.robot import build_policy
from tests.robot.checkpoints import (
    LEROBOT_ACTION_STATS,
    LEROBOT_CAMERAS,
    LEROBOT_STATE_STATS,
    lerobot_checkpoint,
    openpi_checkpoint,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "pi0_libero": openpi_checkpoint(root / "pi0_libero"),
        "pi05_libero": openpi_checkpoint(root / "pi05_libero", pi05=True, horizon=10),
        "pi05_droid": openpi_checkpoint(root / "pi05_droid", pi05=True, preset="droid", horizon=15),
        "pi0_aloha": openpi_checkpoint(root / "pi0_aloha", preset="aloha"),
        "lerobot_pi0": lerobot_checkpoint(root / "lerobot_pi0"),
        "lerobot_pi05": lerobot_checkpoint(root / "lerobot_pi05", pi05=True),
    }


def serve(folder: Path, policy: str, **robot) -> object:
    config = config_from_mapping(
        {"robot": {"policy": policy, "checkpoint": str(folder), "device": "cpu", **robot}}
    )
    return build_policy(config.robot)


def run(policy, *observations: dict) -> list[np.ndarray]:
    items = [policy.prepare(o) for o in observations]
    return policy.infer(items, [None] * len(items))


@pytest.mark.parametrize(
    ("name", "policy", "make", "shape"),
    [
        ("pi0_libero", "pi0", libero, (50, 7)),
        ("pi05_libero", "pi0.5", libero, (10, 7)),
        ("pi05_droid", "pi0.5", droid, (15, 8)),
        ("pi0_aloha", "pi0", aloha, (50, 14)),
    ],
)
def test_openpi_checkpoints_serve_the_robots_chunks_deterministically(folders, name, policy, make, shape):
    served = serve(folders[name], policy)
    meta = served.spec.metadata()
    assert meta["action_dim"] == shape[1] and meta["action_horizon"] == shape[0] and meta["policy"] == policy
    first, second = run(served, make(1), make(2))
    assert first.shape == shape and first.dtype == np.float32 and np.isfinite(first).all()
    assert not np.allclose(first, second)  # the observation matters
    np.testing.assert_array_equal(run(served, make(1))[0], run(serve(folders[name], policy), make(1))[0])
    np.testing.assert_allclose(run(served, make(1))[0], first, rtol=1e-5, atol=1e-5)  # batch-invariant


def test_weights_load_exactly_as_written(folders):
    served = serve(folders["pi05_droid"], "pi0.5")
    written = openpi_state_dict(served.model)
    with safe_open(str(folders["pi05_droid"] / "model.safetensors"), framework="pt") as f:
        for name, tensor in written.items():
            if "lm_head" not in name and "language_model.norm" not in name:
                torch.testing.assert_close(tensor, f.get_tensor(name).float(), rtol=0, atol=0, msg=name)


def test_pi0_libero_processing_matches_openpis_transforms_by_hand(folders):
    """z-score with openpi's 1e-6, prompt + "\\n" token, delta actions on the 6 joints (pi0_libero's
    ``extra_delta_transform``), the 7-dim slice."""
    served = serve(folders["pi0_libero"], "pi0")
    obs = libero(3)
    item = served.prepare(obs)
    batch = served.collate([item])
    state = obs["observation/state"].astype(np.float64)
    np.testing.assert_allclose(batch.state[0, :8].numpy(), (state - 0.1) / (2.0 + 1e-6), rtol=1e-6)
    assert (batch.state[0, 8:] == 0).all()
    sp = served.processing.tokenizer.sp
    ids = batch.tokens[0, : int(batch.token_mask[0].sum())].tolist()
    assert ids == [sp.bos_id(), *sp.encode("put the bowl on the plate"), *sp.encode("\n")]
    # openpi pads to 48 tokens; a batch carries the narrowest prompt width that holds its
    # longest prompt (the padding past it takes no position and is never attended to)
    assert batch.token_mask.shape == (1, 16) and (batch.tokens[0, len(ids) :] == 0).all()
    long = served.collate([item, served.prepare({**obs, "prompt": "pick up " * 12})])
    assert long.token_mask.shape == (2, 48) and long.token_mask[1].all()
    model_actions = np.linspace(-1, 1, 50 * 32, dtype=np.float32).reshape(50, 32)
    out = batch.outputs[0].apply(model_actions)
    want = model_actions[:, :7] * (2.0 + 1e-6) + 0.1
    want[:, :6] += state[:6]
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(batch.outputs[0].to_model(out), model_actions[:, :7], atol=1e-5)


def test_pi05_droid_state_tokens_and_quantiles_by_hand(folders):
    served = serve(folders["pi05_droid"], "pi0.5")
    obs = {**droid(4), "prompt": "open_the drawer\n"}
    batch = served.collate([served.prepare(obs)])
    raw = np.concatenate([obs["observation/joint_position"], [0.5]])
    normalized = (raw - -2.0) / (4.0 + 1e-6) * 2.0 - 1.0
    bins = [int(np.digitize(x, np.linspace(-1, 1, 257)[:-1]) - 1) for x in normalized]
    assert bins == discretize_state(normalized).tolist()
    text = f"Task: open the drawer, State: {' '.join(map(str, bins))};\nAction: "
    sp = served.processing.tokenizer.sp
    ids = batch.tokens[0, : int(batch.token_mask[0].sum())].tolist()
    assert ids == [sp.bos_id(), *sp.encode(text)]
    out = batch.outputs[0].apply(np.ones((15, 32), np.float32))
    np.testing.assert_allclose(
        out, np.full((15, 8), (1 + 1) / 2 * (4.0 + 1e-6) - 2.0), rtol=1e-6
    )  # no deltas


def test_pi05_libero_has_no_state_in_its_prompt(folders):
    """openpi's ``pi05_libero`` sets ``discrete_state_input=False``."""
    served = serve(folders["pi05_libero"], "pi0.5")
    batch = served.collate([served.prepare(libero(0))])
    sp = served.processing.tokenizer.sp
    ids = batch.tokens[0, : int(batch.token_mask[0].sum())].tolist()
    assert ids == [sp.bos_id(), *sp.encode("put the bowl on the plate"), *sp.encode("\n")]


def test_aloha_adapt_to_pi_by_hand(folders):
    """Input: joint flips and the gripper to angular; output: deltas on 12 joints, flips, the
    gripper from angular (openpi ``aloha_policy.py``)."""
    served = serve(folders["pi0_aloha"], "pi0")
    obs = {**aloha(5), "state": np.full(14, 0.5, np.float32)}
    decoded = served.processing.state(obs["state"])
    flips = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1])
    linear = 0.5 * (0.05800 - 0.01844) + 0.01844
    angle = np.arcsin((0.022**2 + linear**2 - 0.036**2) / (2 * 0.022 * linear))
    want = flips * 0.5
    want[[6, 13]] = (angle - 0.5476) / (1.6296 - 0.5476)
    np.testing.assert_allclose(decoded, want, rtol=1e-12)
    out = served.collate([served.prepare(obs)]).outputs[0].apply(np.zeros((50, 32), np.float32))
    absolute = 0.1 + np.where(np.arange(14) % 7 == 6, 0.0, decoded)  # unnormalized 0 is the mean
    expected = flips * absolute
    expected[[6, 13]] = (absolute[[6, 13]] + 0.5476 + 0.6213) / (1.4910 + 0.6213)
    np.testing.assert_allclose(out[0], expected, rtol=1e-5)


def test_rtc_guides_toward_the_delivered_chunk_through_the_output_transforms(folders):
    """Real-time chunking with a checkpoint: the previous chunk is in the robot's units (after
    un-normalization, deltas and ALOHA's flips) and is mapped back into model space to guide."""
    served = serve(folders["pi0_aloha"], "pi0")
    state = served.new_state()
    (prev,) = run(served, aloha(0))
    state.commit(prev, latency_s=0.05, now=100.0)
    item = served.prepare(aloha(5, rtc={"executed_steps": 10, "inference_delay": 4}))
    (guided,) = served.infer([item], [state.snapshot(item, now=100.2)])
    np.testing.assert_array_equal(guided[:4], prev[10:14])
    (free,) = run(served, aloha(5))
    overlap = slice(4, 40)
    assert np.abs(guided[overlap] - prev[14:50]).mean() < 0.5 * np.abs(free[overlap] - prev[14:50]).mean()


def test_resize_with_pad_matches_openpi_client(folders):
    from openpi_client.image_tools import resize_with_pad as reference

    rng = np.random.default_rng(0)
    for shape in [(100, 50, 3), (240, 320, 3), (224, 224, 3), (480, 640, 3), (7, 300, 3)]:
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        np.testing.assert_array_equal(resize_with_pad(image, 224), reference(image, 224, 224))
    flat = resize_with_pad(np.full((100, 50, 3), 77, np.uint8), 224)
    assert (flat[:, :56] == 0).all() and (flat[:, 56:168] == 77).all() and (flat[:, 168:] == 0).all()


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi0.5"])
def test_lerobot_checkpoints_serve_their_cameras_and_stats(folders, pi05):
    served = serve(folders["lerobot_pi05" if pi05 else "lerobot_pi0"], "pi0.5" if pi05 else "pi0")
    assert served.spec.metadata()["camera_keys"] == list(LEROBOT_CAMERAS)
    rng = np.random.default_rng(1)
    obs = {LEROBOT_CAMERAS[0]: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)}
    obs |= {"observation.state": np.linspace(-1, 1, 6).astype(np.float32), "prompt": "stack the cups"}
    batch = served.collate([served.prepare(obs)])
    assert batch.image_mask.tolist() == [[True]]  # the missing wrist camera is left out
    state = np.linspace(-1, 1, 6)
    sp = served.processing.tokenizer.sp
    ids = batch.tokens[0, : int(batch.token_mask[0].sum())].tolist()
    if pi05:  # LeRobot: quantiles without openpi's epsilon, inverted without one
        q01, q99 = LEROBOT_STATE_STATS["q01"][0], LEROBOT_STATE_STATS["q99"][0]
        normalized = 2 * (state - q01) / (q99 - q01) - 1.0
        states = " ".join(map(str, discretize_state(normalized)))
        assert ids == [sp.bos_id(), *sp.encode(f"Task: stack the cups, State: {states};\nAction: ")]
        q01, q99 = LEROBOT_ACTION_STATS["q01"][0], LEROBOT_ACTION_STATS["q99"][0]
        want = (np.ones(6) + 1.0) * (q99 - q01) / 2.0 + q01
    else:
        mean, std = LEROBOT_STATE_STATS["mean"][0], LEROBOT_STATE_STATS["std"][0]
        np.testing.assert_allclose(batch.state[0, :6].numpy(), (state - mean) / (std + 1e-8), rtol=1e-6)
        assert ids == [sp.bos_id(), *sp.encode("stack the cups\n")]
        want = np.ones(6) * LEROBOT_ACTION_STATS["std"][0] + LEROBOT_ACTION_STATS["mean"][0]
    np.testing.assert_allclose(batch.outputs[0].apply(np.ones((10, 32), np.float32))[0], want, rtol=1e-6)
    (chunk,) = served.infer([served.prepare(obs)], [None])
    assert chunk.shape == (10, 6) and np.isfinite(chunk).all()


# --------------------------------------------------------------------------- malformed files


def _broken(folders: dict[str, Path], tmp_path: Path, name: str, edit) -> Path:
    import shutil

    folder = tmp_path / name
    shutil.copytree(folders[name], folder)
    edit(folder)
    return folder


def _truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _short_state_stats(folder: Path) -> None:
    path = next((folder / "assets").rglob("norm_stats.json"))
    data = json.loads(path.read_text())
    data["norm_stats"]["state"] = {k: v[:3] for k, v in data["norm_stats"]["state"].items()}
    path.write_text(json.dumps(data))


def _drop_q01(folder: Path) -> None:
    path = next((folder / "assets").rglob("norm_stats.json"))
    data = json.loads(path.read_text())
    del data["norm_stats"]["actions"]["q01"]
    path.write_text(json.dumps(data))


CASES = [
    ("pi0_libero", "pi0", lambda f: (f / "model.safetensors").unlink(), "model.safetensors: file not found"),
    ("pi0_libero", "pi0", _truncate, "model.safetensors: truncated"),
    (
        "pi0_libero",
        "pi0",
        lambda f: (f / "model.safetensors").write_bytes(b"\x05\x00"),
        "not a safetensors file",
    ),
    ("pi0_libero", "pi0.5", lambda f: None, "holds a pi0 model, not pi0.5"),
    ("pi05_droid", "pi0.5", _drop_q01, "norm_stats.json: norm_stats.actions.q01 is missing"),
    (
        "pi0_libero",
        "pi0",
        _short_state_stats,
        "norm_stats.json: the state statistics have 3 values, the libero robot sends 8",
    ),
    (
        "pi0_libero",
        "pi0",
        lambda f: next((f / "assets").rglob("norm_stats.json")).write_text("{nope"),
        "norm_stats.json: not valid JSON",
    ),
    (
        "pi0_libero",
        "pi0",
        lambda f: (f / "paligemma_tokenizer.model").unlink(),
        "paligemma_tokenizer.model: file not found",
    ),
    (
        "pi0_libero",
        "pi0",
        lambda f: (f / "paligemma_tokenizer.model").write_bytes(b"junk"),
        "paligemma_tokenizer.model: not a sentencepiece model",
    ),
    (
        "pi0_libero",
        "pi0",
        lambda f: (f / "config.json").write_text('{"action_horizon": 0}'),
        "config.json: action_horizon",
    ),
    (
        "lerobot_pi0",
        "pi0",
        lambda f: (f / "policy_preprocessor.json").unlink(),
        "policy_preprocessor.json: file not found",
    ),
]


@pytest.mark.parametrize(
    ("name", "policy", "edit", "message"), CASES, ids=[c[3].split(":")[-1][:30] for c in CASES]
)
def test_malformed_files_are_one_line_config_errors_naming_the_file(
    folders, tmp_path, name, policy, edit, message
):
    folder = _broken(folders, tmp_path, name, edit)
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"robot": {"policy": policy, "checkpoint": str(folder)}}, source="deploy.yaml")
    text = str(caught.value)
    assert "\n" not in text and text.startswith("config error in deploy.yaml: field 'robot.checkpoint':")
    assert message in text and str(folder) in text, text


def test_a_checkpoint_policy_needs_its_folder_and_other_policies_refuse_one():
    with pytest.raises(ConfigError, match="needs a checkpoint folder"):
        config_from_mapping({"robot": {"policy": "pi0"}})
    with pytest.raises(ConfigError, match="robot.checkpoint.*applies to policy pi0 or pi0.5 only"):
        config_from_mapping({"robot": {"checkpoint": "/x"}})
    with pytest.raises(ConfigError, match="openpi_config"):
        config_from_mapping({"robot": {"policy": "pi0", "checkpoint": "/x", "openpi_config": "pi0_mars"}})


def test_serve_exits_2_with_one_line_before_loading_anything(folders, tmp_path):
    folder = _broken(folders, tmp_path, "pi05_droid", _drop_q01)
    config = tmp_path / "deploy.yaml"
    config.write_text(yaml.safe_dump({"robot": {"policy": "pi0.5", "checkpoint": str(folder)}}))
    done = subprocess.run(
        [sys.executable, "-m", "realtime.cli", "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "norm_stats.json" in lines[0] and "q01 is missing" in lines[0], done.stderr


def test_inspect_guesses_the_robot_from_the_asset_folder_and_obeys_a_named_config(folders):
    assert inspect(folders["pi0_aloha"], pi05=False, preset="auto").preset == "aloha"
    named = inspect(folders["pi0_aloha"], pi05=False, openpi_config="pi0_aloha_towel")
    assert named.default_prompt == "fold the towel" and named.processing.delta_mask
    assert (
        inspect(folders["pi0_aloha"], pi05=False, openpi_config="pi0_aloha_sim").processing.delta_mask == ()
    )
    with pytest.raises(ValueError, match="serves aloha"):
        inspect(folders["pi0_aloha"], pi05=False, preset="libero", openpi_config="pi0_aloha")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("name", "policy"), [("pi0_libero", "pi0"), ("pi05_libero", "pi0.5")])
def test_checkpoints_on_cuda_in_bf16_with_graphs_match_the_cpu(folders, name, policy):
    cpu = serve(folders[name], policy)
    gpu = serve(folders[name], policy, device="cuda")  # dtype auto: bf16; CUDA graphs
    gpu.warmup(4)
    assert gpu.graphs is not None and gpu.model.dtype == torch.bfloat16
    observations = [libero(i) for i in range(3)]  # padded to the bucket of 4
    for want, got in zip(run(cpu, *observations), run(gpu, *observations), strict=True):
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()  # bf16 rounding
