"""The Wan 2.1 VAE decoder (models/world/wan_vae.py) on random weights in the official layout.

``official_decoder_shapes`` spells out the key names and shapes of ``Wan2.1_VAE.pth``'s decoder
half as Wan's ``Decoder3d`` constructor creates them (written from Wan's source, independently of
our module's names); ``write_wan_vae_checkpoint`` saves random tensors under them, plus encoder
keys the loader must skip, and every test loads through ``load_wan_vae_decoder``, the path the real
file takes. Equivalence with Wan's own code: docs/models-world-vae-t5.md.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models.world.configs import CheckpointError
from models.world.vae import DecoderState, split_state, stack_states
from models.world.wan_vae import (
    CACHE_T,
    WAN_VAE,
    WAN_VAE_TEST,
    Upsample,
    WanVAEConfig,
    WanVAEDecoder,
    _Caches,
    decoder_state_bytes,
    load_wan_vae_decoder,
    wan_name,
)

H, W = 2, 3  # latent size of the tests (non-square: a swapped axis fails)


def official_decoder_shapes(cfg: WanVAEConfig) -> dict[str, tuple[int, ...]]:
    """``WanVAE_``'s ``conv2.*`` and ``decoder.*`` tensors: name -> shape, as Wan builds them."""
    out: dict[str, tuple[int, ...]] = {}

    def conv(name: str, c_in: int, c_out: int, kernel: tuple[int, ...]) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = (c_out, c_in, *kernel), (c_out,)

    def residual(name: str, c_in: int, c_out: int) -> None:
        out[f"{name}.residual.0.gamma"] = (c_in, 1, 1, 1)
        conv(f"{name}.residual.2", c_in, c_out, (3, 3, 3))
        out[f"{name}.residual.3.gamma"] = (c_out, 1, 1, 1)
        conv(f"{name}.residual.6", c_out, c_out, (3, 3, 3))
        if c_in != c_out:
            conv(f"{name}.shortcut", c_in, c_out, (1, 1, 1))

    mult = list(cfg.dim_mult)
    dims = [cfg.dim * u for u in [mult[-1]] + mult[::-1]]
    conv("conv2", cfg.z_dim, cfg.z_dim, (1, 1, 1))
    conv("decoder.conv1", cfg.z_dim, dims[0], (3, 3, 3))
    residual("decoder.middle.0", dims[0], dims[0])
    out["decoder.middle.1.norm.gamma"] = (dims[0], 1, 1)
    conv("decoder.middle.1.to_qkv", dims[0], dims[0] * 3, (1, 1))
    conv("decoder.middle.1.proj", dims[0], dims[0], (1, 1))
    residual("decoder.middle.2", dims[0], dims[0])
    k = 0
    for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        if i in (1, 2, 3):
            c_in //= 2
        for _ in range(cfg.num_res_blocks + 1):
            residual(f"decoder.upsamples.{k}", c_in, c_out)
            c_in, k = c_out, k + 1
        if i != len(mult) - 1:
            if cfg.temporal_upsample[i]:
                conv(f"decoder.upsamples.{k}.time_conv", c_out, c_out * 2, (3, 1, 1))
            conv(f"decoder.upsamples.{k}.resample.1", c_out, c_out // 2, (3, 3))
            k += 1
    out["decoder.head.0.gamma"] = (dims[-1], 1, 1, 1)
    conv("decoder.head.2", dims[-1], 3, (3, 3, 3))
    return out


def wan_vae_tensors(cfg: WanVAEConfig = WAN_VAE_TEST, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random decoder tensors in the official layout (scaled so activations stay O(1) and most
    outputs stay inside the [-1, 1] clamp), plus two encoder tensors the loader must skip."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in official_decoder_shapes(cfg).items():
        if name.endswith("gamma"):
            t = 0.5 + torch.rand(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.2 * torch.rand(shape, generator=g) - 0.1
        else:
            fan_in = int(torch.tensor(shape[1:]).prod())
            t = torch.randn(shape, generator=g) / fan_in**0.5
        out[name] = t
    out["decoder.head.2.weight"] *= 0.3
    out["encoder.conv1.weight"] = torch.randn(cfg.dim, 3, 3, 3, 3, generator=g)
    out["conv1.weight"] = torch.randn(2 * cfg.z_dim, 2 * cfg.z_dim, 1, 1, 1, generator=g)
    return out


def write_wan_vae_checkpoint(path: Path, cfg: WanVAEConfig = WAN_VAE_TEST, seed: int = 0) -> Path:
    """A random-weight ``Wan2.1_VAE.pth`` (torch state dict) at ``cfg``'s size."""
    torch.save(wan_vae_tensors(cfg, seed), path)
    return path


@pytest.fixture(scope="module")
def vae_file(tmp_path_factory) -> Path:
    return write_wan_vae_checkpoint(tmp_path_factory.mktemp("wan-vae") / "Wan2.1_VAE.pth")


@pytest.fixture(scope="module")
def decoder(vae_file) -> WanVAEDecoder:
    return load_wan_vae_decoder(vae_file, H, W, WAN_VAE_TEST, dtype=torch.float64)


def latents(n: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, WAN_VAE_TEST.z_dim, H, W, generator=g, dtype=torch.float64)


def decode_chunks(decoder: WanVAEDecoder, z: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    state, frames, i = decoder.init_state(z.shape[0]), [], 0
    with torch.no_grad():
        for n in chunks:
            f, state = decoder(z[:, i : i + n], state)
            frames.append(f)
            i += n
    return torch.cat(frames, dim=1)


def test_real_size_matches_the_official_layout():
    with torch.device("meta"):
        dec = WanVAEDecoder(WAN_VAE, 60, 104)
    ours = {wan_name(k): tuple(v.shape) for k, v in dec.state_dict().items()}
    assert ours == official_decoder_shapes(WAN_VAE)
    assert len(dec.cache_shapes()) == 32  # Self-Forcing's demo keeps 32 decoder caches


def test_real_size_state_bytes_are_self_forcings_cache():
    # (channels, spatial factor) of Self-Forcing's ZERO_VAE_CACHE (demo_utils/constant.py), 60x104
    caches = [(16, 1)] + [(384, 1)] * 11 + [(192, 2)] + [(384, 2)] * 6 + [(192, 4)] * 6 + [(96, 8)] * 7
    expected = sum(c * CACHE_T * 60 * s * 104 * s for c, s in caches) * 2
    assert decoder_state_bytes(WAN_VAE, 60, 104, torch.bfloat16) == expected == 1_888_573_440


def test_loader_maps_the_official_names(vae_file, decoder):
    tensors = torch.load(vae_file, weights_only=True)
    pairs = [
        ("conv2.weight", decoder.post_quant_conv.weight),
        ("decoder.conv1.bias", decoder.conv_in.bias),
        ("decoder.middle.0.residual.2.weight", decoder.middle[0].conv1.weight),
        ("decoder.middle.1.to_qkv.weight", decoder.middle[1].to_qkv.weight),
        ("decoder.upsamples.3.time_conv.weight", decoder.upsamples[3].time_conv.weight),
        ("decoder.upsamples.4.shortcut.weight", decoder.upsamples[4].shortcut.weight),
        ("decoder.upsamples.11.resample.1.weight", decoder.upsamples[11].conv.weight),
        ("decoder.upsamples.14.residual.3.gamma", decoder.upsamples[14].norm2.gamma),
        ("decoder.head.0.gamma", decoder.head_norm.gamma),
    ]
    for key, param in pairs:
        torch.testing.assert_close(param, tensors[key].double(), rtol=0, atol=0)
    assert decoder.upsamples[11].time_conv is None  # the third upsample is 2-D only


def test_safetensors_with_the_official_keys_loads_the_same(tmp_path, decoder):
    path = tmp_path / "wan_2.1_vae.safetensors"
    save_file(wan_vae_tensors(), str(path))
    other = load_wan_vae_decoder(path, H, W, WAN_VAE_TEST, dtype=torch.float64)
    for (k, a), b in zip(decoder.state_dict().items(), other.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_first_latent_gives_one_frame_then_four_each(decoder):
    z = latents(3)
    with torch.no_grad():
        f1, s = decoder(z[:, :1], decoder.init_state())
        f2, s = decoder(z[:, 1:], s)
        f3, _ = decoder(latents(2, seed=5), s)
        g, _ = decoder(z, decoder.init_state())
    assert f1.shape == (1, 1, 3, 8 * H, 8 * W)
    assert f2.shape[1] == 8 and f3.shape[1] == 8
    assert g.shape[1] == 1 + 4 * 2  # a first chunk of n latents: 1 + 4(n - 1)
    assert 0.0 <= float(g.min()) and float(g.max()) <= 1.0
    assert 0.05 < float(g.std())  # not a constant (saturated or zero) image


@pytest.mark.parametrize("chunks", [[1, 1, 1, 1, 1], [2, 3], [1, 4], [3, 1, 1]])
def test_chunked_decode_equals_whole_clip(decoder, chunks):
    z = latents(5)
    torch.testing.assert_close(
        decode_chunks(decoder, z, chunks), decode_chunks(decoder, z, [5]), rtol=0, atol=1e-12
    )


def test_first_frame_skips_time_conv(decoder):
    """Wan's 'Rep': a stream's first slice passes the temporal upsamples untouched, later ones not."""
    other = copy.deepcopy(decoder)
    with torch.no_grad():
        other.upsamples[3].time_conv.weight.mul_(-1.0)
    z = latents(2)
    a, b = decode_chunks(decoder, z, [2]), decode_chunks(other, z, [2])
    torch.testing.assert_close(a[:, 0], b[:, 0], rtol=0, atol=0)
    assert (a[:, 1:] - b[:, 1:]).abs().max() > 1e-3


@pytest.mark.parametrize("first", [False, True])
def test_time_upsample_orders_steps_as_wan(first):
    """``time_conv``'s 2c output channels are two time steps, channels [:c] first (the layout of
    Wan's ``init_weight2``); its kernel's last tap is the current slice (the cache comes before)."""
    up = Upsample(4, temporal=True).double()
    plain = Upsample(4, temporal=False).double()
    with torch.no_grad():
        eye = torch.eye(4, dtype=torch.float64)
        up.time_conv.weight.zero_()
        up.time_conv.weight[:4, :, 2, 0, 0] = eye
        up.time_conv.weight[4:, :, 2, 0, 0] = 2 * eye
        up.time_conv.bias.zero_()
        up.conv.bias.zero_()
        plain.conv.load_state_dict(up.conv.state_dict())
    x = torch.randn(1, 4, 3, H, W, dtype=torch.float64)
    y = up(x, _Caches(DecoderState([torch.randn(1, 4, CACHE_T, H, W, dtype=torch.float64)], first)))
    ref = plain(x, _Caches(DecoderState([], first)))  # each slice upsampled in space only
    if first:  # the stream's first slice passes alone, the others double
        torch.testing.assert_close(y[:, :, :1], ref[:, :, :1], rtol=0, atol=1e-12)
        y, ref = y[:, :, 1:], ref[:, :, 1:]
    assert y.shape[2] == 2 * ref.shape[2]
    torch.testing.assert_close(y[:, :, 0::2], ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(y[:, :, 1::2], 2 * ref, rtol=0, atol=1e-12)


def test_interleaved_sessions_do_not_share_state(decoder):
    za, zb = latents(3, seed=1), latents(3, seed=2)
    sa, sb, fa, fb = decoder.init_state(), decoder.init_state(), [], []
    with torch.no_grad():
        for i in range(3):
            f, sa = decoder(za[:, i : i + 1], sa)
            fa.append(f)
            f, sb = decoder(zb[:, i : i + 1], sb)
            fb.append(f)
    torch.testing.assert_close(torch.cat(fa, 1), decode_chunks(decoder, za, [3]), rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat(fb, 1), decode_chunks(decoder, zb, [3]), rtol=0, atol=1e-12)


def test_batched_sessions_equal_single_ones(decoder):
    """Sessions in the same phase share one forward; stack/split states round-trip."""
    za, zb = latents(3, seed=1), latents(3, seed=2)
    states, out = [decoder.init_state(), decoder.init_state()], []
    with torch.no_grad():
        for chunk in (slice(0, 1), slice(1, 3)):
            frames, state = decoder(torch.cat([za[:, chunk], zb[:, chunk]]), stack_states(states))
            states = split_state(state, 2)
            out.append(frames)
    single = torch.cat([decode_chunks(decoder, z, [1, 2]) for z in (za, zb)])
    torch.testing.assert_close(torch.cat(out, 1), single, rtol=0, atol=1e-12)


def test_state_is_explicit_and_sized_as_planned(decoder):
    state = decoder.init_state(2)
    before = [c.clone() for c in state.caches]
    with torch.no_grad():
        _, after = decoder(latents(2, batch=2), state)
    assert state.first and not after.first
    for old, kept in zip(state.caches, before, strict=True):  # the input state is not modified
        torch.testing.assert_close(old, kept, rtol=0, atol=0)
    assert [c.shape for c in after.caches] == [c.shape for c in state.caches]
    assert after.nbytes == 2 * decoder_state_bytes(WAN_VAE_TEST, H, W, torch.float64)
    assert decoder.cache_shapes()[0] == (WAN_VAE_TEST.z_dim, H, W)


def test_bfloat16_decode_is_close_to_float64(vae_file, decoder):
    bf = load_wan_vae_decoder(vae_file, H, W, WAN_VAE_TEST, dtype=torch.bfloat16)
    z = latents(2)
    with torch.no_grad():
        got, _ = bf(z.bfloat16(), bf.init_state())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), decode_chunks(decoder, z, [2]), rtol=0, atol=0.03)


def test_wrong_latents_or_state_raise(decoder):
    with pytest.raises(ValueError, match="expected"):
        decoder(torch.zeros(1, 1, WAN_VAE_TEST.z_dim, H + 1, W, dtype=torch.float64), decoder.init_state())
    with pytest.raises(ValueError, match="holds 2 sessions"):
        decoder(latents(1), decoder.init_state(2))


def _corrupt(tmp_path: Path, name: str, edit) -> Path:
    tensors = wan_vae_tensors()
    edit(tensors)
    path = tmp_path / name
    torch.save(tensors, path)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent.pth", "no such file"),
        (lambda d: d, "not a file"),
        (lambda d: (d / "junk.pth").write_bytes(b"not a checkpoint") and d / "junk.pth", "cannot read"),
        (lambda d: torch.save([torch.zeros(1)], d / "list.pth") or d / "list.pth", "not a state dict"),
        (
            lambda d: _corrupt(d, "missing.pth", lambda t: t.pop("decoder.head.2.weight")),
            "missing tensor 'decoder.head.2.weight'",
        ),
        (
            lambda d: _corrupt(d, "shape.pth", lambda t: t.update({"conv2.bias": torch.zeros(5)})),
            r"'conv2.bias' has shape \(5,\), expected \(4,\)",
        ),
        (
            lambda d: _corrupt(
                d,
                "extra.pth",
                lambda t: t.update({"decoder.upsamples.15.residual.0.gamma": t["decoder.head.0.gamma"]}),
            ),
            "unexpected decoder tensor 'decoder.upsamples.15",
        ),
    ],
)
def test_malformed_files_raise_one_clear_error(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as err:
        load_wan_vae_decoder(path, H, W, WAN_VAE_TEST)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_a_checkpoint_of_another_size_is_refused(vae_file):
    with pytest.raises(CheckpointError, match="has shape"):
        load_wan_vae_decoder(vae_file, H, W, WAN_VAE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_release_size_decodes_on_cuda_in_bfloat16(tmp_path):
    """Wan's widths at 480x832 on the GPU: two sessions batched, a first block then a later one,
    bf16 against fp32 (the kernels: nearest-exact in bf16, single-head attention of width 384)."""
    path = write_wan_vae_checkpoint(tmp_path / "Wan2.1_VAE.pth", WAN_VAE)
    ref = load_wan_vae_decoder(path, 60, 104, WAN_VAE, device="cuda", dtype=torch.float32)
    bf = load_wan_vae_decoder(path, 60, 104, WAN_VAE, device="cuda", dtype=torch.bfloat16)
    z = torch.randn(2, 6, 16, 60, 104, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    ref_state, bf_state = ref.init_state(2), bf.init_state(2)
    with torch.no_grad():
        for chunk, frames in ((slice(0, 3), 9), (slice(3, 6), 12)):
            want, ref_state = ref(z[:, chunk], ref_state)
            got, bf_state = bf(z[:, chunk].bfloat16(), stack_states(split_state(bf_state, 2)))
            assert got.shape == (2, frames, 3, 480, 832)
            assert (got.float() - want).abs().max() < 0.05
    assert bf_state.nbytes == 2 * decoder_state_bytes(WAN_VAE, 60, 104, torch.bfloat16)
