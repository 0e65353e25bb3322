"""Self-Forcing / CausVid checkpoints (``models.world.checkpoints``): a random-weight checkpoint in
the peers' own layout, written by a fixture, loaded through the production path; the key mapping
(every key used, none missing, wrapper segments dropped), determinism, the peers' few-step schedules
against hand-computed timesteps, and malformed or missing files as one line naming the file, which
the config load turns into exit 2 before any model memory is taken."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models.world.checkpoints import dit_state_dict, inspect_files, our_name, peer_layout, read_checkpoint
from models.world.configs import (
    CAUSVID,
    CHECKPOINT_MODELS,
    CONFIGS,
    SELF_FORCING,
    CheckpointError,
    flow_schedule,
)
from models.world.dit import CausalDiT
from models.world.model import WorldModel, WorldTick
from models.world.text_encoder import PrecomputedEmbeddings, PromptEmbedder
from realtime.config import ConfigError, config_from_mapping
from tests.world.helpers import serve_exits_2_naming, world_session

# Self-Forcing's architecture and sampler at a CPU test size (the small causal decoder)
SMALL = dataclasses.replace(
    SELF_FORCING, name="self-forcing", latent_channels=16, latent_height=4, latent_width=6, dim=64,
    heads=2, depth=2, ffn_dim=128, text_len=8, text_dim=24, vae="causal", decoder_channels=(8,),
)  # fmt: skip
ACTION = torch.zeros(6)


def random_dit_state(cfg=SMALL, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every DiT tensor random (Wan's init zeroes the head and the biases)."""
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in CausalDiT(cfg).state_dict().items()}
    return {k: torch.randn(shape, generator=g) * 0.1 for k, shape in shapes.items()}


def write_self_forcing(path: Path, cfg=SMALL, seed: int = 0, ema_seed: int | None = 1) -> Path:
    """``self_forcing_dmd.pt``'s layout: ``{"generator": {"model." + key}, "generator_ema": ...}``
    (``ema_seed`` None: CausVid's ``model.pt``, the generator alone)."""
    raw = peer_layout(random_dit_state(cfg, seed), ema=False)
    if ema_seed is not None:
        raw["generator_ema"] = peer_layout(random_dit_state(cfg, ema_seed), ema=False)["generator"]
        raw["critic"] = {"model.anything": torch.zeros(2)}  # Self-Forcing also saves its critic
    torch.save(raw, path)
    return path


def write_embeddings(path: Path, cfg=SMALL, prompts=("", "a red car in the rain")) -> Path:
    g = torch.Generator().manual_seed(3)
    save_file({p: torch.randn(3 + i, cfg.text_dim, generator=g) for i, p in enumerate(prompts)}, str(path))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    return write_self_forcing(d / "self_forcing_dmd.pt"), write_embeddings(d / "prompts.safetensors")


def build(checkpoint: Path, embeddings: Path, cfg=SMALL, dtype=torch.float32) -> WorldModel:
    prompts = PromptEmbedder(
        PrecomputedEmbeddings.load(embeddings, dim=cfg.text_dim, dtype=dtype, text_len=cfg.text_len),
        cfg.text_len,
    )
    return WorldModel.build(cfg, slots=2, dtype=dtype, checkpoint=checkpoint, prompts=prompts)


def rollout(model: WorldModel, sid: str, blocks: int, prompt="a red car in the rain") -> torch.Tensor:
    model.open(sid, seed=4)
    return torch.cat([model.generate([WorldTick(sid, b, prompt, ACTION)]) for b in range(blocks)], 1)


def test_the_ema_weights_load_under_every_key_and_generate_blocks_of_the_native_shape(files):
    model = build(*files)
    want = random_dit_state(SMALL, seed=1)  # generator_ema: what Self-Forcing serves
    got = model.dit.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    x0 = rollout(model, "s", 3)
    assert x0.shape == (1, 9, 16, 4, 6) and torch.isfinite(x0).all()
    frames = model.decode(["s"], x0[:, -3:])[0]
    assert frames.shape == (1 + 4 * 2, SMALL.frame_height, SMALL.frame_width, 3)


def test_the_same_checkpoint_seed_and_prompt_give_the_same_blocks(files):
    a, b = build(*files), build(*files)
    assert torch.equal(rollout(a, "s", 3), rollout(b, "t", 3))
    assert not torch.equal(rollout(a, "u", 1, prompt=None), rollout(b, "v", 1))  # the prompt conditions


def test_causvids_generator_alone_loads_and_wrapper_segments_are_dropped(tmp_path):
    state = random_dit_state(seed=2)
    path = write_self_forcing(tmp_path / "model.pt", seed=2, ema_seed=None)
    assert all(torch.equal(dit_state_dict(path, SMALL)[k], v) for k, v in state.items())
    wrapped = {f"model._fsdp_wrapped_module.{k}".replace("blocks.", "blocks._checkpoint_wrapped_module.", 1): v
               for k, v in state.items()}  # fmt: skip
    torch.save({"generator": wrapped}, tmp_path / "fsdp.pt")
    assert set(dit_state_dict(tmp_path / "fsdp.pt", SMALL)) == set(state)
    assert our_name("model._orig_mod.head.head.weight") == "head.head.weight"
    save_file({f"model.{k}": v for k, v in state.items()}, str(tmp_path / "dit.safetensors"))
    assert torch.equal(
        dit_state_dict(tmp_path / "dit.safetensors", SMALL)["head.modulation"], state["head.modulation"]
    )


def test_the_peers_schedules_are_the_hand_computed_timesteps():
    """Self-Forcing: steps [1000, 750, 500, 250] warped on the shift-5 grid: sigma = 5s / (1 + 4s) at
    s = 1, 0.75, 0.5, 0.25, timestep = 1000 sigma. CausVid: the DiT sees 757 and 522 themselves; the
    sigma is the shift-8 grid's nearest (grid point i: s = 1 - i / 1000, sigma = 8s / (1 + 7s))."""
    assert SELF_FORCING.timesteps == pytest.approx((1000, 937.5, 2500 / 3, 625), abs=1e-4)
    assert SELF_FORCING.sigmas == pytest.approx((1, 0.9375, 5 / 6, 0.625), abs=1e-7)

    def nearest(t: float) -> float:
        grid = [8 * (1 - i / 1000) / (1 + 7 * (1 - i / 1000)) for i in range(1000)]
        return min(grid, key=lambda s: abs(1000 * s - t))

    assert CAUSVID.timesteps == (1000.0, 757.0, 522.0)
    assert CAUSVID.sigmas == pytest.approx((1.0, nearest(757), nearest(522)), abs=1e-6)
    assert abs(CAUSVID.sigmas[1] - 0.757) < 1e-3 and CAUSVID.sigmas[1] != 0.757
    assert flow_schedule((1000, 500), shift=1.0, warp=True)["timesteps"] == (1000.0, 500.0)
    for cfg in (SELF_FORCING, CAUSVID):  # the sampler settings the peers generate with
        assert (cfg.frames_per_block, cfg.sink_frames, cfg.window_frames) == (3, 3, 15)
        assert (cfg.frame_width, cfg.frame_height, cfg.fps) == (832, 480, 16)


def _corrupt(tmp_path: Path, edit) -> Path:
    raw = peer_layout(random_dit_state(), ema=False)
    edit(raw["generator"])
    path = tmp_path / "bad.pt"
    torch.save(raw, path)
    return path


class _Code:  # a pickled object whose loading would run code: weights_only refuses it
    def __reduce__(self):
        return (print, ("pickled code ran",))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent.pt", "no such file"),
        (lambda d: (d / "junk.pt").write_bytes(b"not a pickle") and d / "junk.pt", "cannot read"),
        (lambda d: (d / "code.pt").write_bytes(pickle.dumps({"generator": _Code()}, protocol=2)) and d / "code.pt", "cannot read"),
        (lambda d: torch.save([1, 2], d / "list.pt") or d / "list.pt", "not a checkpoint"),
        (lambda d: torch.save({"generator": {"model.x": 3}}, d / "n.pt") or d / "n.pt", "not a named tensor"),
        (lambda d: _corrupt(d, lambda g: g.pop("model.blocks.1.ffn.2.bias")), "missing tensor 'model.blocks.1.ffn.2.bias'"),
        (lambda d: _corrupt(d, lambda g: g.update({"model.extra.weight": torch.zeros(1)})), "unexpected tensor 'model.extra.weight'"),
        (lambda d: _corrupt(d, lambda g: g.update({"model.head.modulation": torch.zeros(1, 2, 8)})), r"has shape \(1, 2, 8\), expected \(1, 2, 64\)"),
        (lambda d: _corrupt(d, lambda g: g.update({"model.head.modulation": torch.zeros(1, 2, 64, dtype=torch.long)})), "not a float type"),
    ],
)  # fmt: skip
def test_malformed_checkpoints_raise_one_line_naming_the_file(tmp_path, make, message, capsys):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as err:
        dit_state_dict(path, SMALL)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
    assert "pickled code ran" not in capsys.readouterr().out


def test_a_checkpoint_of_another_size_is_refused_by_the_full_size_config(files):
    with pytest.raises(
        CheckpointError, match=r"patch_embedding.weight' has shape \(64, 16, 1, 2, 2\), expected \(1536"
    ):
        inspect_files(SELF_FORCING, checkpoint=str(files[0]), vae="")
    assert isinstance(read_checkpoint(files[0]), dict)


def test_the_config_layer_names_the_checkpoint_models_without_importing_them():
    from realtime.config import WORLD_CHECKPOINT_MODELS

    assert WORLD_CHECKPOINT_MODELS == tuple(CHECKPOINT_MODELS)


def _world(**kw):
    return {"world": {"enabled": True, "model": "self-forcing", **kw}, "robot": {"enabled": False}}


def test_the_config_load_checks_every_file_and_names_it(tmp_path, files, monkeypatch):
    ckpt, emb = (str(p) for p in files)
    missing = str(tmp_path / "absent.pth")
    with pytest.raises(ConfigError, match=r"world\.checkpoint.*needs a path"):
        config_from_mapping(_world(vae=missing, prompt_embeddings=emb))
    with pytest.raises(ConfigError, match=r"world\.text_encoder.*one of text_encoder or prompt_embeddings"):
        config_from_mapping(_world(checkpoint=ckpt, vae=missing))
    with pytest.raises(
        ConfigError, match=r"world\.checkpoint': .*self_forcing_dmd.pt: tensor .* has shape"
    ) as err:
        config_from_mapping(_world(checkpoint=ckpt, vae=missing, prompt_embeddings=emb))  # a test-size DiT
    assert "\n" not in str(err.value)
    with pytest.raises(
        ConfigError, match=r"world\.checkpoint.*applies to world.model self-forcing or causvid"
    ):
        config_from_mapping({"world": {"enabled": True, "checkpoint": ckpt}})
    # at the test size (the config layer's own check, the size monkeypatched): every file passes
    monkeypatch.setitem(CHECKPOINT_MODELS, "self-forcing", SMALL)
    config = config_from_mapping(_world(checkpoint=ckpt, prompt_embeddings=emb))
    assert config.world.checkpoint == ckpt
    with pytest.raises(ConfigError, match=r"world\.vae': .*absent.pth: no such file"):
        config_from_mapping(_world(checkpoint=ckpt, vae=missing, prompt_embeddings=emb))
    with pytest.raises(ConfigError, match=r"world\.prompt_embeddings': .*absent.*no such file"):
        config_from_mapping(_world(checkpoint=ckpt, prompt_embeddings=str(tmp_path / "absent.safetensors")))
    with pytest.raises(ConfigError, match=r"world\.text_encoder': .*absent.*no such file"):
        config_from_mapping(_world(checkpoint=ckpt, text_encoder=str(tmp_path / "absent")))


def test_serve_with_a_missing_checkpoint_exits_2_with_one_line(tmp_path, files, capsys):
    missing = tmp_path / "nowhere" / "self_forcing_dmd.pt"
    world = f"model: self-forcing, checkpoint: {missing}, vae: {files[0]}, prompt_embeddings: {files[1]}"
    serve_exits_2_naming(tmp_path, capsys, world, missing)


@pytest.mark.timeout(120)
async def test_a_self_forcing_checkpoint_serves_over_the_world_protocol(tmp_path, files, monkeypatch):
    """The whole path at the test size: config -> embeddings file -> checkpoint -> the world
    pipeline -> JPEG chunks of the config's frame size, the prompt's and a later one's."""

    from realtime.media.video import decode_jpeg_batch
    from tests.serving import serve_in_process

    monkeypatch.setitem(CHECKPOINT_MODELS, "self-forcing", SMALL)
    monkeypatch.setitem(CONFIGS, "self-forcing", SMALL)
    ckpt, emb = (str(p) for p in files)
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"memory_available_bytes": 2**30},
            "world": {
                **_world(checkpoint=ckpt, prompt_embeddings=emb)["world"],
                "torch_threads": 1,
                "compute_admission": False,
            },
        }
    )
    async with serve_in_process(config) as (url, _running):
        async with world_session(url) as (ws, created):
            caps = created["session"]["capabilities"] if "session" in created else created["capabilities"]
            assert (caps["width"], caps["height"]) == (SMALL.frame_width, SMALL.frame_height)
            counts = []
            while len(counts) < 2:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    frames = decode_jpeg_batch(msg)
                    assert frames[0].shape == (SMALL.frame_height, SMALL.frame_width, 3)
                    counts.append(len(frames))
            assert counts == [SMALL.frames_for_block(True), SMALL.frames_for_block(False)]


def test_the_bench_writes_random_files_the_loaders_accept(tmp_path, monkeypatch):
    """``realtime bench world --write-random-checkpoint`` at the test size (its VAE at Wan's test size)."""
    from models.world import wan_vae
    from realtime.bench import world_checkpoint

    monkeypatch.setitem(world_checkpoint.CHECKPOINT_MODELS, "self-forcing", SMALL)
    monkeypatch.setattr(world_checkpoint, "WAN_VAE", wan_vae.WAN_VAE_TEST)
    paths = world_checkpoint.write_random_checkpoint(tmp_path, "self-forcing")
    inspect_files(
        SMALL, checkpoint=str(paths["checkpoint"]), vae="", prompt_embeddings=str(paths["prompt_embeddings"])
    )
    assert set(torch.load(paths["checkpoint"], weights_only=True)) == {"generator", "generator_ema"}
    wan_vae.load_wan_vae_decoder(
        paths["vae"], SMALL.latent_height, SMALL.latent_width, cfg=wan_vae.WAN_VAE_TEST
    )
    model = build(paths["checkpoint"], paths["prompt_embeddings"])
    assert rollout(model, "s", 1, prompt="stone").shape == (1, 3, 16, 4, 6)


async def _next_text(ws, kind: str) -> dict:
    """The next JSON message of ``kind`` (chunks and other messages skipped)."""
    import json

    while True:
        msg = await ws.recv()
        if isinstance(msg, str) and json.loads(msg)["type"] == kind:
            return json.loads(msg)


@pytest.mark.timeout(120)
async def test_a_prompt_outside_the_embeddings_file_is_refused_before_any_tick(files, monkeypatch):
    import json

    import websockets

    from tests.serving import serve_in_process

    monkeypatch.setitem(CHECKPOINT_MODELS, "self-forcing", SMALL)
    monkeypatch.setitem(CONFIGS, "self-forcing", SMALL)
    ckpt, emb = (str(p) for p in files)
    world = {
        **_world(checkpoint=ckpt, prompt_embeddings=emb)["world"],
        "torch_threads": 1,
        "compute_admission": False,
    }
    config = config_from_mapping(
        {"robot": {"enabled": False}, "runtime": {"memory_available_bytes": 2**30}, "world": world}
    )
    async with serve_in_process(config) as (url, _running):
        ws_url = url.replace("http://", "ws://") + "/v1/realtime/world?protocol_version=1"
        async with websockets.connect(ws_url, max_size=2**24) as ws:
            await ws.send(json.dumps({"type": "session.start", "prompt": "a dog", "pacing": "fast"}))
            err = json.loads(await ws.recv())
            assert err["type"] == "error" and err["error"]["code"] == "invalid_message"
            assert "serves 2 fixed prompts" in err["error"]["message"] and emb not in err["error"]["message"]
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd.code == 1008
        async with websockets.connect(ws_url, max_size=2**24) as ws:
            await ws.send(
                json.dumps({"type": "session.start", "prompt": "a red car in the rain", "pacing": "fast"})
            )
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.event", "event_id": 1, "prompt": "a cat"}))
            err = await asyncio.wait_for(_next_text(ws, "error"), 30)
            assert err["error"]["event_id"] == 1 and err["error"]["code"] == "invalid_message"
            await ws.send(
                json.dumps({"type": "session.event", "event_id": 2, "prompt": None})
            )  # the empty prompt
            assert (await asyncio.wait_for(_next_text(ws, "session.event.ack"), 30))["event_id"] == 2
