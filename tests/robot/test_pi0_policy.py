"""pi0-tiny (``Pi0Policy`` with random weights): shapes, determinism, prefix-KV reuse, real-time chunking, presets."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from models.policy import presets
from models.policy.interface import ObservationError
from models.policy.pi0 import flow_times
from models.policy.pi0_policy import Pi0Policy
from models.policy.rtc import RTCOptions, prefix_weights
from realtime.bench.examples import aloha, droid, libero
from realtime.protocols import openpi


@pytest.fixture(scope="module")
def policy() -> Pi0Policy:
    return Pi0Policy()


def pi0_obs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation.images.base_0_rgb": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation.images.left_wrist_0_rgb": rng.integers(0, 256, (240, 320, 3), dtype=np.uint8),
        "state": rng.standard_normal(32).astype(np.float32),
        "prompt": "pick up the red block",
        "session_id": "ep-1",
    }


def run(policy: Pi0Policy, *observations: dict) -> list[np.ndarray]:
    items = [policy.prepare(o) for o in observations]
    return policy.infer(items, [None] * len(items))


@pytest.mark.parametrize(("make", "dims"), [(libero, 7), (droid, 8), (aloha, 14), (pi0_obs, 32)])
def test_every_preset_gives_finite_chunks_of_its_robots_action_dims(policy, make, dims):
    """``auto`` returns what the metadata's ``observation_presets`` say for the detected robot
    (issue 29: LIBERO got 32 dims while the metadata said 7)."""
    (chunk,) = run(policy, make())
    assert chunk.shape == (50, dims) and chunk.dtype == np.float32 and np.isfinite(chunk).all()
    assert dims == policy.spec.metadata()["observation_presets"][presets.detect(make()).name]["action_dim"]
    assert chunk.std() > 0.01


def test_seeded_deterministic_and_batch_invariant(policy):
    obs = [libero(i) for i in range(4)]
    alone = [run(policy, o)[0] for o in obs]
    batched = run(policy, *obs)
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_array_equal(run(Pi0Policy(), obs[0])[0], alone[0])
    assert not np.allclose(alone[0], alone[1], atol=1e-3)  # observations matter


def test_reusing_prefix_kv_equals_recomputing_it_every_step(policy):
    model = policy.model
    items = [policy.prepare(o) for o in (libero(1), aloha(2))]
    inputs = policy.collate(items).as_args()
    with torch.no_grad():
        reused = model.sample(model.prefix_cache(*model.embed_prefix(*inputs[:4]), inputs[4]))
        x = model.noise.expand(2, -1, -1).clone()
        for t in flow_times(model.config.num_steps):
            fresh = model.prefix_cache(*model.embed_prefix(*inputs[:4]), inputs[4])
            x = x + np.float32(-0.1).item() * model.velocity(fresh, x, torch.full((2,), t))
    torch.testing.assert_close(reused, x, rtol=0, atol=1e-6)


@pytest.mark.parametrize("make", [aloha, pi0_obs])  # pi0_obs has a camera that needs resizing
def test_policy_never_writes_into_read_only_wire_arrays(policy, make):
    decoded = openpi.unpackb(openpi.packb(make(3)))
    arrays = decoded["images"] if "images" in decoded else decoded
    before = {k: v.copy() for k, v in arrays.items() if isinstance(v, np.ndarray)}
    assert not decoded["state"].flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when wrapping non-writable arrays
        run(policy, decoded)
    for key, value in before.items():
        np.testing.assert_array_equal(arrays[key], value)


# --------------------------------------------------------------------------- real-time chunking


def test_rtc_frozen_steps_match_the_previous_chunk_and_guidance_pulls_toward_it(policy):
    state = policy.new_state()
    (prev,) = run(policy, libero(0))
    state.commit(prev, latency_s=0.05, now=100.0)
    obs = libero(5, rtc={"executed_steps": 10, "inference_delay": 4})
    item = policy.prepare(obs)
    guide = state.snapshot(item, now=100.2)
    assert guide is not None and guide.frozen == 4
    (guided,) = policy.infer([item], [guide])
    np.testing.assert_array_equal(guided[:4], prev[10:14])
    (free,) = run(policy, libero(5))
    overlap = slice(4, 40)
    assert np.abs(guided[overlap] - prev[14:50]).mean() < 0.5 * np.abs(free[overlap] - prev[14:50]).mean()


def test_rtc_items_do_not_disturb_unguided_items_in_the_same_batch(policy):
    state = policy.new_state()
    (prev,) = run(policy, libero(0))
    state.commit(prev, latency_s=0.05, now=0.0)
    guided_item = policy.prepare(libero(1, rtc=True))
    plain_item = policy.prepare(libero(2))
    _, plain = policy.infer([guided_item, plain_item], [state.snapshot(guided_item, now=0.1), None])
    np.testing.assert_allclose(plain, run(policy, libero(2))[0], atol=1e-5)


def test_rtc_state_measures_executed_steps_and_delay_from_time():
    from models.policy.rtc import RTCState

    state = RTCState(horizon=50, action_dim=2)
    assert state.guide(RTCOptions(), now=0.0) is None  # nothing delivered yet
    state.commit(np.arange(100, dtype=np.float32).reshape(50, 2), latency_s=0.07, now=10.0)
    guide = state.guide(RTCOptions(control_hz=50.0), now=10.2)  # 10 steps executed, delay ceil(3.5) = 4
    assert guide.frozen == 4
    np.testing.assert_array_equal(guide.target[:40], np.arange(20, 100, dtype=np.float32).reshape(40, 2))
    assert (guide.target[40:] == 0).all() and guide.weights[40:].sum() == 0
    assert state.guide(RTCOptions(), now=12.0) is None  # the previous chunk is used up
    state.reset()
    assert state.guide(RTCOptions(), now=10.2) is None


def test_prefix_weights_match_kinetix_schedules():
    np.testing.assert_allclose(prefix_weights(2, 6, 8, "linear"), [1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0], atol=1e-6)
    np.testing.assert_array_equal(prefix_weights(2, 6, 8, "zeros"), [1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(prefix_weights(2, 6, 8, "ones"), [1, 1, 1, 1, 1, 1, 0, 0])
    exp = prefix_weights(2, 6, 8, "exp")
    assert exp[0] == exp[1] == pytest.approx(1.0) and 0 < exp[4] < 0.4 and exp[6] == 0


@pytest.mark.parametrize(
    "raw", ["yes", {"control_hz": -1}, {"executed_steps": 1.5}, {"bogus": 1}, {"schedule": "x"}]
)
def test_bad_rtc_options_are_observation_errors(raw):
    with pytest.raises(ObservationError):
        RTCOptions.parse(raw)


# --------------------------------------------------------------------------- presets


@pytest.mark.parametrize(
    ("make", "name"), [(libero, "libero"), (droid, "droid"), (aloha, "aloha"), (pi0_obs, "pi0")]
)
def test_presets_are_detected_from_keys(make, name):
    assert presets.detect(make()).name == name


def test_fixed_preset_advertises_and_returns_the_robot_action_dims():
    aloha_policy = Pi0Policy(preset="aloha")
    meta = aloha_policy.spec.metadata()
    assert meta["action_dim"] == 14 and meta["reset_pose"] == [0.0, -1.5, 1.5, 0.0, 0.0, 0.0]
    assert meta["camera_keys"] == ["cam_high", "cam_left_wrist", "cam_right_wrist"]
    assert run(aloha_policy, aloha())[0].shape == (50, 14)
    with pytest.raises(ObservationError, match="images"):
        aloha_policy.prepare(libero())


def test_auto_metadata_lists_every_preset(policy):
    meta = policy.spec.metadata()
    assert meta["observation_preset"] == "auto" and meta["action_dim"] == 32 and meta["action_horizon"] == 50
    assert set(meta["observation_presets"]) == {"libero", "droid", "aloha", "pi0"}
    assert meta["camera_keys"][0] == "observation.images.base_0_rgb" and meta["image_resolution"] == [
        224,
        224,
    ]


def _without(obs: dict, key: str) -> dict:
    return {k: v for k, v in obs.items() if k != key}


@pytest.mark.parametrize(
    ("obs", "match"),
    [
        (_without(libero(), "observation/wrist_image"), "missing camera 'observation/wrist_image'"),
        (_without(libero(), "observation/state"), "missing state key"),
        ({**libero(), "observation/image": np.zeros((224, 224, 3), np.int32)}, "uint8 or float"),
        ({**libero(), "observation/image": np.zeros((224, 224), np.uint8)}, "HxWx3"),
        ({**libero(), "observation/state": np.array(["a", "b"])}, "numeric"),
        ({**libero(), "observation/state": np.full(8, np.nan)}, "finite"),
        ({**libero(), "prompt": 5}, "prompt"),
        ({**aloha(), "images": {"cam_low": np.zeros((3, 8, 8), np.uint8)}}, "missing camera 'cam_high'"),
        ({**aloha(), "images": {"cam_high": np.zeros((3, 8, 8), np.uint8), "cam_x": 1}}, "unknown camera"),
        ({"state": np.zeros(3)}, "matches no preset"),
    ],
)
def test_bad_observations_raise_observation_error(policy, obs, match):
    with pytest.raises(ObservationError, match=match):
        policy.prepare(obs)


def test_missing_optional_cameras_are_masked_and_images_resized(policy):
    batch = policy.collate([policy.prepare(pi0_obs())])
    # a trailing camera no item of the batch has is left out (its tokens would all be masked)
    assert batch.image_mask.tolist() == [[True, True]]
    assert batch.images.shape == (1, 2, 224, 224, 3) and batch.images.dtype == torch.uint8
    third = np.full((224, 224, 3), 7, np.uint8)
    full = {**pi0_obs(), "observation.images.right_wrist_0_rgb": third}
    mixed = policy.collate([policy.prepare(pi0_obs()), policy.prepare(full)])
    assert mixed.image_mask.tolist() == [[True, True, False], [True, True, True]]
    assert (mixed.images[0, 2] == 0).all() and (mixed.images[1, 2] == 7).all()
    alone, together = (
        policy.infer([policy.prepare(pi0_obs())], [None])[0],
        policy.infer([policy.prepare(pi0_obs()), policy.prepare(full)], [None, None])[0],
    )
    np.testing.assert_allclose(alone, together, rtol=1e-4, atol=1e-5)  # the masked camera changes nothing
    assert (batch.images[0, 1, :28] == 0).all() and batch.images[0, 1, 28:196].float().std() > 10
    # 240x320 -> 168x224, padded black top and bottom
    assert batch.token_mask.sum() == len("pick up the red block")
    short_state = policy.collate([policy.prepare({**pi0_obs(), "state": np.ones(20, np.float32)})])
    assert short_state.state.shape == (1, 32) and short_state.state[0, :20].sum() == 20
    assert (short_state.state[0, 20:] == 0).all()  # zero-padded to the model's state_dim
