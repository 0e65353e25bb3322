"""TAEHV's decoder (models/world/taehv.py) on random weights in ``taew2_1.pth``'s layout.

``official_decoder_shapes`` spells out the ``decoder.*`` names and shapes TAEHV's ``TAEHV``
constructor creates for Wan 2.1 (written from its source, independently of our module);
``write_taehv_checkpoint`` saves random tensors under them plus encoder tensors the loader must
skip, and every test loads through ``load_taehv_decoder`` or the serving path, as the real file
does. Equivalence with TAEHV's own code: docs/models-world-vae-t5.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models.world.configs import CHECKPOINT_MODELS, CONFIGS, CheckpointError, with_decoder
from models.world.memory import decoder_activation_bytes, decoder_state_bytes
from models.world.taehv import TAEHV, TAEHV_TEST, TAEHVConfig, TAEHVDecoder, load_taehv_decoder
from models.world.taehv import decoder_state_bytes as taehv_state_bytes
from models.world.vae import split_state, stack_states
from realtime.config import ConfigError, config_from_mapping
from tests.world.helpers import serve_exits_2_naming, world_session
from tests.world.test_checkpoints import ACTION, SMALL, write_embeddings, write_self_forcing

H, W = 2, 3  # latent size of the tests (non-square: a swapped axis fails)
SMALL_WAN = dataclasses.replace(SMALL, vae="wan2.1")  # the test-size Self-Forcing with Wan's decoder
SMALL_TAEHV = with_decoder(SMALL_WAN, "taehv")


def official_decoder_shapes(cfg: TAEHVConfig = TAEHV) -> dict[str, tuple[int, ...]]:
    """``TAEHV(...).decoder``'s tensors: name -> shape (its ``nn.Sequential`` indices: Clamp, conv,
    ReLU, then per level 3 MemBlocks, Upsample, TGrow, conv; then ReLU and the RGB conv)."""
    n, c = cfg.widths, cfg.latent_channels
    out = {"decoder.1.weight": (n[0], c, 3, 3), "decoder.1.bias": (n[0],)}
    i = 3
    for level in range(3):
        f = n[level]
        for _ in range(3):  # MemBlock(f, f): conv = Sequential(conv(2f, f), ReLU, conv, ReLU, conv)
            for j, c_in in ((0, 2 * f), (2, f), (4, f)):
                out[f"decoder.{i}.conv.{j}.weight"], out[f"decoder.{i}.conv.{j}.bias"] = (f, c_in, 3, 3), (f,)
            i += 1
        stride = 2 if cfg.time_upscale[level] else 1
        out[f"decoder.{i + 1}.conv.weight"] = (f * stride, f, 1, 1)  # TGrow after the Upsample
        out[f"decoder.{i + 2}.weight"] = (n[level + 1], f, 3, 3)  # conv(f, next, bias=False)
        i += 3
    assert i == 21  # then ReLU (21) and the RGB conv (22)
    out["decoder.22.weight"], out["decoder.22.bias"] = (3, n[3], 3, 3), (3,)
    return out


def taehv_tensors(cfg: TAEHVConfig = TAEHV, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random decoder tensors (scaled so activations stay O(1) and the output mostly inside
    ``[0, 1]``), plus two encoder tensors the loader must skip."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in official_decoder_shapes(cfg).items():
        if name.endswith("bias"):
            out[name] = (torch.rand(shape, generator=g) - 0.5) * 0.2
        else:
            out[name] = torch.randn(shape, generator=g) * 1.2 / (torch.Size(shape[1:]).numel() ** 0.5)
    out["decoder.22.weight"] *= 0.03
    out["decoder.22.bias"] += 0.5
    out["encoder.0.weight"] = torch.randn(64, 3, 3, 3, generator=g)
    out["encoder.0.bias"] = torch.zeros(64)
    return out


def write_taehv_checkpoint(path: Path, cfg: TAEHVConfig = TAEHV, seed: int = 0) -> Path:
    torch.save(taehv_tensors(cfg, seed), path)
    return path


@pytest.fixture(scope="module")
def taehv_file(tmp_path_factory) -> Path:
    return write_taehv_checkpoint(tmp_path_factory.mktemp("taehv") / "taew2_1.pth")


@pytest.fixture(scope="module")
def decoder(taehv_file) -> TAEHVDecoder:
    return load_taehv_decoder(taehv_file, H, W)


def latents(n: int, batch: int = 1, seed: int = 1, channels: int = 16) -> torch.Tensor:
    return torch.randn(batch, n, channels, H, W, generator=torch.Generator().manual_seed(seed)) * 1.5


def decode_chunks(decoder: TAEHVDecoder, z: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    state, out, i = decoder.init_state(z.shape[0]), [], 0
    for c in chunks:
        frames, state = decoder(z[:, i : i + c], state)
        out.append(frames)
        i += c
    return torch.cat(out, 1)


def test_the_decoder_has_the_official_names_and_shapes():
    for cfg in (TAEHV, TAEHV_TEST):
        ours = {k: tuple(v.shape) for k, v in TAEHVDecoder(cfg, H, W).state_dict().items()}
        assert ours == official_decoder_shapes(cfg)
    assert (
        sum(v.numel() for v in TAEHVDecoder(TAEHV, H, W).parameters()) == 9_844_611
    )  # TAEHV(...).decoder, counted on its own code


def test_loader_takes_every_decoder_tensor_and_skips_the_encoder(taehv_file, decoder):
    want = taehv_tensors()
    got = decoder.state_dict()
    assert set(got) == {k for k in want if k.startswith("decoder.")}
    assert all(torch.equal(got[k], want[k]) for k in got)
    assert not decoder.training and not any(p.requires_grad for p in decoder.parameters())


def test_safetensors_with_the_same_keys_loads_the_same(tmp_path, decoder):
    path = tmp_path / "taew2_1.safetensors"
    save_file(taehv_tensors(), str(path))
    z = latents(2)
    assert torch.equal(
        load_taehv_decoder(path, H, W)(z, decoder.init_state())[0], decoder(z, decoder.init_state())[0]
    )


def test_a_tgrow_stored_wider_keeps_its_last_time_steps(tmp_path, decoder):
    """TAEHV's ``patch_tgrow_layers``: a file whose x1 TGrow (index 7) was trained x2 loads its last half."""
    tensors = taehv_tensors()
    wide = torch.cat([torch.randn_like(tensors["decoder.7.conv.weight"]), tensors["decoder.7.conv.weight"]])
    tensors["decoder.7.conv.weight"] = wide
    torch.save(tensors, tmp_path / "wide.pth")
    loaded = load_taehv_decoder(tmp_path / "wide.pth", H, W)
    assert torch.equal(loaded.decoder[7].conv.weight, decoder.decoder[7].conv.weight)


def test_first_latent_gives_one_frame_then_four_each(decoder):
    z = latents(3)
    frames, state = decoder(z[:, :1], decoder.init_state())
    assert frames.shape == (1, 1, 3, 8 * H, 8 * W) and not state.first
    frames, _ = decoder(z[:, 1:], state)
    assert frames.shape == (1, 8, 3, 8 * H, 8 * W)
    first, _ = decoder(z, decoder.init_state())
    assert first.shape[1] == 1 + 4 * 2
    assert 0.0 <= float(first.min()) and float(first.max()) <= 1.0 and first.std() > 0.01


@pytest.mark.parametrize("chunks", [[1, 1, 1, 1, 1], [2, 3], [1, 4], [3, 1, 1]])
def test_chunked_decode_equals_whole_clip(decoder, chunks):
    z = latents(5, batch=2)
    torch.testing.assert_close(
        decode_chunks(decoder, z, chunks), decode_chunks(decoder, z, [5]), rtol=0, atol=1e-6
    )


def test_the_memory_carries_time(decoder):
    """A chunk decoded from a fresh state differs from the same chunk after its past."""
    z = latents(3)
    _, state = decoder(z[:, :2], decoder.init_state())
    after, _ = decoder(z[:, 2:], state)
    fresh, _ = decoder(z[:, 2:], dataclasses.replace(decoder.init_state(), first=False))
    assert (after - fresh).abs().max() > 1e-3


def test_interleaved_and_batched_sessions_equal_single_ones(decoder):
    a, b = latents(4, seed=2), latents(4, seed=3)
    sa, sb, outs = decoder.init_state(), decoder.init_state(), {"a": [], "b": []}
    for i in range(4):  # interleaved: a, b, a, b, ...
        fa, sa = decoder(a[:, i : i + 1], sa)
        fb, sb = decoder(b[:, i : i + 1], sb)
        outs["a"].append(fa)
        outs["b"].append(fb)
    # one frame at a time against four in one call: float32 convolutions of other shapes round
    # differently (a fresh clone's run differed by 1.2e-6); a lost or shared state differs by > 1e-3
    torch.testing.assert_close(torch.cat(outs["a"], 1), decode_chunks(decoder, a, [4]), rtol=1e-5, atol=1e-5)
    # batched: two sessions in the same phase through one forward, split back
    _, s1 = decoder(a[:, :1], decoder.init_state())
    _, s2 = decoder(b[:, :1], decoder.init_state())
    frames, state = decoder(torch.cat([a[:, 1:], b[:, 1:]]), stack_states([s1, s2]))
    torch.testing.assert_close(frames[1:], decoder(b[:, 1:], s2)[0], rtol=0, atol=1e-6)
    after = split_state(state, 2)
    torch.testing.assert_close(after[0].caches[-1], decoder(a[:, 1:], s1)[1].caches[-1], rtol=0, atol=1e-6)


def test_the_same_file_decodes_the_same_frames(taehv_file, decoder):
    z = latents(3, seed=5)
    again = load_taehv_decoder(taehv_file, H, W)
    assert torch.equal(decode_chunks(again, z, [1, 2]), decode_chunks(decoder, z, [1, 2]))


def test_state_is_explicit_and_sized_as_planned(decoder):
    state = decoder.init_state()
    assert state.first and len(state.caches) == 9
    assert state.nbytes == taehv_state_bytes(TAEHV, H, W, torch.float32)
    _, after = decoder(latents(2), state)
    assert all(c.abs().sum() == 0 for c in state.caches)  # the input state is not modified
    assert after.nbytes == state.nbytes
    # Self-Forcing's 480x832 in bf16: 5,376 values per latent cell (3 x 256 + 3 x 128 x 4 + 3 x 64 x 16)
    assert taehv_state_bytes(TAEHV, 60, 104, torch.bfloat16) == 60 * 104 * 5376 * 2 == 67_092_480


def test_the_memory_plan_counts_taehv_not_wan():
    sf, taehv = CHECKPOINT_MODELS["self-forcing"], with_decoder(CHECKPOINT_MODELS["self-forcing"], "taehv")
    assert (taehv.frame_width, taehv.frame_height) == (832, 480)
    assert decoder_state_bytes(taehv, torch.bfloat16) == 67_092_480
    assert decoder_state_bytes(taehv, torch.bfloat16) < decoder_state_bytes(sf, torch.bfloat16) / 25
    # the head at full resolution over the block's 12 frames: 64 channels in, three at 64
    assert decoder_activation_bytes(taehv, torch.bfloat16, 1) == 12 * 480 * 832 * 256 * 2


def test_bfloat16_decode_is_close_to_float32(taehv_file, decoder):
    z = latents(3, seed=6)
    lo = load_taehv_decoder(taehv_file, H, W, dtype=torch.bfloat16)
    diff = (decode_chunks(lo, z.bfloat16(), [1, 2]).float() - decode_chunks(decoder, z, [1, 2])).abs()
    assert diff.max() < 0.05 and diff.mean() < 0.005


def test_wrong_latents_or_state_raise(decoder):
    with pytest.raises(ValueError, match="expected"):
        decoder(torch.zeros(1, 1, 16, H + 1, W), decoder.init_state())
    with pytest.raises(ValueError, match="holds 1 sessions, latents 2"):
        decoder(latents(1, batch=2), decoder.init_state())


def _corrupt(tmp_path: Path, edit) -> Path:
    tensors = taehv_tensors()
    edit(tensors)
    torch.save(tensors, tmp_path / "bad.pth")
    return tmp_path / "bad.pth"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent.pth", "no such file"),
        (lambda d: (d / "junk.pth").write_bytes(b"not a pickle") and d / "junk.pth", "cannot read"),
        (lambda d: torch.save([1, 2], d / "list.pth") or d / "list.pth", "not a state dict"),
        (lambda d: _corrupt(d, lambda t: t.pop("decoder.15.conv.2.bias")), "missing tensor 'decoder.15.conv.2.bias'"),
        (lambda d: _corrupt(d, lambda t: t.update({"decoder.1.weight": torch.zeros(256, 48, 3, 3)})), r"'decoder.1.weight' has shape \(256, 48, 3, 3\), expected \(256, 16, 3, 3\)"),
        (lambda d: _corrupt(d, lambda t: t.update({"decoder.23.weight": torch.zeros(3)})), "unexpected decoder tensor 'decoder.23.weight'"),
        (lambda d: _corrupt(d, lambda t: t.update({"decoder.1.bias": torch.zeros(256, dtype=torch.long)})), "not a float type"),
        (lambda d: torch.save({"conv2.weight": torch.zeros(16, 16, 1, 1, 1)}, d / "wan.pth") or d / "wan.pth", "missing tensor 'decoder.1.weight' .*not a TAEHV"),
    ],
)  # fmt: skip
def test_malformed_files_raise_one_clear_error(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as err:
        load_taehv_decoder(path, H, W)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def _world(**kw):
    return {"world": {"enabled": True, "model": "self-forcing", **kw}, "robot": {"enabled": False}}


@pytest.fixture(scope="module")
def sf_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sf")
    return write_self_forcing(d / "self_forcing_dmd.pt"), write_embeddings(d / "prompts.safetensors")


def test_the_config_load_checks_the_taehv_file_and_names_it(tmp_path, sf_files, taehv_file, monkeypatch):
    ckpt, emb = (str(p) for p in sf_files)
    monkeypatch.setitem(CHECKPOINT_MODELS, "self-forcing", SMALL_WAN)
    config = config_from_mapping(
        _world(checkpoint=ckpt, prompt_embeddings=emb, decoder="taehv", vae=str(taehv_file))
    )
    assert config.world.decoder == "taehv"
    with pytest.raises(ConfigError, match=r"world\.vae.*needs a path"):
        config_from_mapping(_world(checkpoint=ckpt, prompt_embeddings=emb, decoder="taehv"))
    with pytest.raises(ConfigError, match=r"world\.vae': .*absent.pth: no such file") as err:
        config_from_mapping(
            _world(checkpoint=ckpt, prompt_embeddings=emb, decoder="taehv", vae=str(tmp_path / "absent.pth"))
        )
    assert "\n" not in str(err.value)
    wan_file = tmp_path / "Wan2.1_VAE.pth"
    torch.save({"conv2.weight": torch.zeros(16, 16, 1, 1, 1)}, wan_file)
    with pytest.raises(
        ConfigError, match=r"world\.vae': .*Wan2.1_VAE.pth: missing tensor 'decoder.1.weight'"
    ):
        config_from_mapping(
            _world(checkpoint=ckpt, prompt_embeddings=emb, decoder="taehv", vae=str(wan_file))
        )
    with pytest.raises(ConfigError, match=r"world\.vae': .*taew2_1.pth: missing tensor 'conv2.weight'"):
        config_from_mapping(
            _world(checkpoint=ckpt, prompt_embeddings=emb, vae=str(taehv_file))
        )  # decoder wan2.1
    with pytest.raises(ConfigError, match=r"world\.decoder.*applies to world.model self-forcing or causvid"):
        config_from_mapping({"world": {"enabled": True, "decoder": "taehv"}})
    with pytest.raises(ConfigError, match=r"world\.decoder"):
        config_from_mapping(_world(checkpoint=ckpt, prompt_embeddings=emb, decoder="tae"))


def test_the_serving_path_decodes_blocks_with_taehv(sf_files, taehv_file):
    """``WorldModel.build`` with ``world.decoder: taehv``: the file's decoder, the checkpoint's
    blocks decoded to 1 + 4(n - 1) then 4n frames at 8x, the state planned as held."""
    from models.world.model import WorldModel, WorldTick
    from models.world.text_encoder import PrecomputedEmbeddings, PromptEmbedder

    prompts = PromptEmbedder(
        PrecomputedEmbeddings.load(sf_files[1], dim=SMALL.text_dim, text_len=SMALL.text_len), SMALL.text_len
    )
    model = WorldModel.build(SMALL_TAEHV, slots=2, checkpoint=sf_files[0], vae=taehv_file, prompts=prompts)
    assert isinstance(model.decoder, TAEHVDecoder)
    assert torch.equal(model.decoder.decoder[1].weight, taehv_tensors()["decoder.1.weight"])
    model.open("s", seed=4)
    assert model.decoder_state_bytes == model.sessions["s"].decoder.nbytes
    counts = []
    for b in range(2):
        frames = model.step([WorldTick("s", b, "a red car in the rain", torch.zeros(6))])[0]
        assert frames.dtype == torch.uint8 and frames.shape[1:] == (
            SMALL_TAEHV.frame_height,
            SMALL_TAEHV.frame_width,
            3,
        ) == (32, 48, 3)
        counts.append(frames.shape[0])
    assert counts == [SMALL_TAEHV.frames_for_block(True), SMALL_TAEHV.frames_for_block(False)] == [9, 12]


@pytest.mark.timeout(120)
async def test_a_self_forcing_checkpoint_serves_with_taehv_over_the_world_protocol(
    sf_files, taehv_file, monkeypatch
):

    from realtime.media.video import decode_jpeg_batch
    from tests.serving import serve_in_process

    monkeypatch.setitem(CHECKPOINT_MODELS, "self-forcing", SMALL_WAN)
    monkeypatch.setitem(CONFIGS, "self-forcing", SMALL_WAN)
    ckpt, emb = (str(p) for p in sf_files)
    world = _world(checkpoint=ckpt, prompt_embeddings=emb, decoder="taehv", vae=str(taehv_file))["world"]
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"memory_available_bytes": 2**30},
            "world": {**world, "torch_threads": 1, "compute_admission": False, "max_batch": 2},
        }
    )
    async with serve_in_process(config) as (url, _running):
        async with world_session(url) as (ws, created):
            counts = []
            while len(counts) < 2:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    frames = decode_jpeg_batch(msg)
                    assert (
                        frames[0].shape
                        == (SMALL_TAEHV.frame_height, SMALL_TAEHV.frame_width, 3)
                        == (32, 48, 3)
                    )
                    counts.append(len(frames))
            assert counts == [9, 12]


def test_the_bench_writes_a_random_taehv_file_the_loader_accepts(tmp_path, monkeypatch):
    from models.world import wan_vae
    from realtime.bench import world_checkpoint

    monkeypatch.setitem(world_checkpoint.CHECKPOINT_MODELS, "self-forcing", SMALL)
    monkeypatch.setattr(world_checkpoint, "WAN_VAE", wan_vae.WAN_VAE_TEST)
    paths = world_checkpoint.write_random_checkpoint(tmp_path, "self-forcing")
    assert paths["taehv"].name == "taew2_1.pth"
    assert set(torch.load(paths["taehv"], weights_only=True)) == set(official_decoder_shapes())
    load_taehv_decoder(paths["taehv"], SMALL.latent_height, SMALL.latent_width)


def test_serve_with_a_missing_taehv_file_exits_2_with_one_line(tmp_path, sf_files, capsys, monkeypatch):
    monkeypatch.setitem(CHECKPOINT_MODELS, "self-forcing", SMALL_WAN)  # the test-size DiT passes
    missing = tmp_path / "nowhere" / "taew2_1.pth"
    world = (
        f"model: self-forcing, checkpoint: {sf_files[0]}, decoder: taehv, vae: {missing}, "
        f"prompt_embeddings: {sf_files[1]}"
    )
    serve_exits_2_naming(tmp_path, capsys, world, missing)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_release_size_decodes_on_cuda_in_bfloat16(taehv_file):
    """Self-Forcing's 60x104 latents, a first block then a later one, bf16 on the GPU against fp32
    on the GPU."""
    gpu = load_taehv_decoder(taehv_file, 60, 104, device="cuda", dtype=torch.bfloat16)
    ref = load_taehv_decoder(taehv_file, 60, 104, device="cuda")
    z = torch.randn(1, 6, 16, 60, 104, generator=torch.Generator().manual_seed(0)).cuda()
    lo, hi = decode_chunks(gpu, z.bfloat16(), [3, 3]).float(), decode_chunks(ref, z, [3, 3])
    assert lo.shape == (1, 21, 3, 480, 832) and (lo - hi).abs().mean() < 0.01
    gpu.compile()  # world.compile's decoder (inductor): the same frames within bf16 rounding
    compiled = decode_chunks(gpu, z.bfloat16(), [3, 3]).float()
    assert (compiled - lo).abs().max() < 0.03 and (compiled - hi).abs().mean() < 0.01


def test_channels_last_decodes_the_frames_of_the_contiguous_layout(taehv_file, decoder):
    """The decoder runs channels last (``TAEHVDecoder``); the same weights laid out NCHW decode the
    same frames, so the layout moves no value (``TGrow``'s reordering included), and the frames
    come out as ``[T, H, W, 3]`` memory."""
    nchw = load_taehv_decoder(taehv_file, H, W).to(memory_format=torch.contiguous_format)
    assert decoder.decoder[1].weight.is_contiguous(memory_format=torch.channels_last)
    assert nchw.decoder[1].weight.is_contiguous()
    z = latents(5, batch=2)
    want, got = decode_chunks(nchw, z, [1, 2, 2]), decode_chunks(decoder, z, [1, 2, 2])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    frames, _ = decoder(z[:, :2], decoder.init_state(2))
    assert frames[0].permute(0, 2, 3, 1).is_contiguous()


def test_the_compiled_decoder_is_warmed_at_load_and_decodes_the_eager_frames(sf_files, taehv_file):
    """``world.compile`` compiles TAEHV's decoder (``WorldModel.compile_decoder``); the load's
    warm-up (``measure_step_seconds``) meets every graph it has, so serving batches of other sizes
    and phases (a session starting beside running ones) compiles nothing more, and the frames are
    the eager decoder's."""
    from torch._dynamo.testing import CompileCounter

    from models.world.model import WorldModel, WorldTick
    from models.world.text_encoder import PrecomputedEmbeddings, PromptEmbedder
    from realtime.kinds.world import measure_step_seconds

    def build() -> WorldModel:
        embeddings = PrecomputedEmbeddings.load(sf_files[1], dim=SMALL.text_dim, text_len=SMALL.text_len)
        prompts = PromptEmbedder(embeddings, SMALL.text_len)
        return WorldModel.build(SMALL_TAEHV, slots=4, checkpoint=sf_files[0], vae=taehv_file, prompts=prompts)

    torch._dynamo.reset()
    compiled, eager, counter = build(), build(), CompileCounter()
    compiled.compile_decoder(backend=counter)
    measure_step_seconds(compiled, max_batch=4)
    warmed = counter.frame_count
    assert warmed > 0
    for sid, seed in (("a", 1), ("b", 2), ("c", 3)):
        compiled.open(sid, seed=seed)
        eager.open(sid, seed=seed)
    rounds = [["a"], ["a", "b"], ["a", "b", "c"], ["a", "b", "c"]]  # b and c start beside a: mixed phases
    for sids in rounds:
        ticks = [WorldTick(s, compiled.next_block(s), "a red car in the rain", ACTION) for s in sids]
        for got, want in zip(compiled.step(ticks), eager.step(ticks), strict=True):
            assert torch.equal(got, want)
    assert counter.frame_count == warmed, "a session compiled the decoder while it was served"
