"""FP8 storage of the duplex model's temporal KV (``duplex.kv_cache: fp8``): the bytes it saves,
the error it costs (bounded against the model-dtype KV over a stream that rolls), the fused CUDA
kernel against the dequantized read, and the config's refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models.duplex import kv_fp8
from models.duplex.configs import MOSHI_7B, TEST
from models.duplex.kv_cache import KVGeometry, SlotKV, StepRows
from models.duplex.lm import BOS, DuplexLM
from models.duplex.stage import build_duplex_stage
from models.stage import StageItem
from realtime.config import ConfigError, DuplexConfig, config_from_mapping
from realtime.kinds.duplex_model import build_stage


def test_quantize_keeps_each_vector_within_a_sixteenth_of_its_largest_number() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 128) * torch.logspace(-3, 3, 64)[:, None]  # vectors of very different sizes
    values, scales = kv_fp8.quantize(x)
    assert values.dtype == kv_fp8.FP8 and scales.shape == (64,)
    back = kv_fp8.dequantize(values, scales, torch.float32)
    error = (back - x).abs().amax(dim=1) / x.abs().amax(dim=1)
    assert error.max() <= 1 / 16


def test_fp8_storage_takes_about_half_the_bytes_per_session() -> None:
    bf16 = KVGeometry.of(MOSHI_7B, torch.bfloat16)
    fp8 = KVGeometry.of(MOSHI_7B, torch.bfloat16, fp8=True)
    assert bf16.bytes_per_session == 32 * 2 * 32 * 3001 * 128 * 2  # 1.57 GB
    assert fp8.bytes_per_session == 32 * 2 * 32 * 3001 * (128 + 4)  # values and one scale per vector
    assert fp8.bytes_per_session / bf16.bytes_per_session == pytest.approx(0.516, abs=1e-3)
    stage = build_duplex_stage(MOSHI_7B, "meta", 4, kv_fp8=True)  # shapes only: the capacity plan's view
    assert (
        stage.kv.kv.dtype == kv_fp8.FP8
        and stage.kv.kv.nbytes + stage.kv.scales.nbytes == 4 * fp8.bytes_per_session
    )
    assert stage.state_bytes() < build_duplex_stage(MOSHI_7B, "meta", 4).state_bytes() * 0.52


def _teacher_forced(cfg, kv: SlotKV, lm: DuplexLM, frames: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """The hidden state of every step of one stream fed ``frames`` (text, audio, user) as given."""
    hidden = []
    for t, (text, audio, user) in enumerate(frames):
        rows = StepRows.of([1], [t], cfg.context, "cpu")
        hidden.append(lm.step(kv, rows, text, audio, user, torch.tensor([7])).hidden)
    return torch.cat(hidden)


def test_a_stream_over_fp8_kv_stays_close_to_the_model_dtype_kv_through_a_roll() -> None:
    cfg = dataclasses.replace(TEST, context=40, sink=2)
    torch.manual_seed(0)
    lm = DuplexLM(cfg).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(1)
    frames, text, audio = [], torch.tensor([BOS]), torch.full((1, cfg.n_q), lm.start_audio)
    reference = SlotKV(KVGeometry.of(cfg, torch.float32), 3, torch.float32, "cpu", cfg.rope_theta)
    for t in range(70):  # past the context: rolled steps re-rotate the sink keys (the dequantized read)
        user = torch.randint(0, cfg.codebook_size, (1, cfg.n_q), generator=gen)
        frames.append((text, audio, user))
        out = lm.step(
            reference, StepRows.of([1], [t], cfg.context, "cpu"), text, audio, user, torch.tensor([7])
        )
        text, audio = out.text, out.audio
    reference.reset(1)
    exact = _teacher_forced(cfg, reference, lm, frames)
    stored = SlotKV(KVGeometry.of(cfg, torch.float32, fp8=True), 3, torch.float32, "cpu", cfg.rope_theta)
    approx = _teacher_forced(cfg, stored, lm, frames)
    relative = (approx - exact).norm(dim=1) / exact.norm(dim=1)
    assert relative.max() < 0.05, relative.max()
    assert relative.max() > 0  # FP8 storage did change the numbers: the test can see it
    assert stored.kv[[0, 2]].float().abs().sum() == 0 and stored.scales[[0, 2]].abs().sum() == 0


def test_fp8_stage_serves_steps_and_frees_its_slots() -> None:
    stage = build_stage(DuplexConfig(model="duplex-test", kv_cache="fp8"), 2)  # duplex.kv_cache's path
    assert stage.kv.geometry.fp8 and stage.kv.kv.dtype == kv_fp8.FP8
    items = [
        StageItem(f"s{i}", 0, stage.silence(), slot=i, state=stage.open_state(f"s{i}", i)) for i in range(2)
    ]
    for _ in range(3):
        outputs = stage.forward(items)
        assert len(outputs) == 2
    assert stage.kv.scales[0].abs().sum() > 0
    stage.release_state("s0", 0, items[0].state)
    stage.open_state("s0", 0)
    assert stage.kv.scales[0].abs().sum() == 0 and stage.kv.kv[0].float().abs().sum() == 0


@pytest.mark.parametrize("model", ["duplex-cascade", "moshi-test"])
def test_fp8_kv_is_a_config_error_for_models_whose_kv_is_their_librarys(model: str) -> None:
    with pytest.raises(ConfigError, match="kv_cache"):
        config_from_mapping({"duplex": {"enabled": True, "model": model, "kv_cache": "fp8"}})


def test_few_rows_split_their_columns_into_whole_blocks_and_many_rows_do_not() -> None:
    # an H100 has 132 processors: one row of 32 heads takes 8 spans of 6 blocks, 72 rows take one
    assert kv_fp8.split_columns(32, 3001, 132) == (8, 384)
    assert kv_fp8.split_columns(72 * 32, 3001, 132) == (1, 3008)
    assert kv_fp8.split_columns(32, 100, 132) == (2, 64)  # no more spans than blocks
    for programs, columns in [(1, 1), (8, 65), (32, 3001), (160, 3001)]:
        splits, span = kv_fp8.split_columns(programs, columns, 132)
        assert span % kv_fp8.BLOCK_N == 0 and (splits - 1) * span < columns <= splits * span


@pytest.mark.gpu
@pytest.mark.skipif(not kv_fp8.fused_available(torch.device("cuda")), reason="needs CUDA and Triton")
@pytest.mark.parametrize("steps", [(0, 17, 2999, 5000, -1), (5000,)], ids=["five rows", "one row, split"])
def test_the_fused_kernel_equals_the_dequantized_read_over_the_pool_layout(steps: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    B, H, N, D = len(steps), 32, 3001, 128
    assert kv_fp8.split_columns(B * H, N, torch.cuda.get_device_properties(0).multi_processor_count)[0] > 1
    pool = torch.zeros(8, 2, 2, H, N, D, dtype=kv_fp8.FP8, device="cuda")
    scales = torch.zeros(8, 2, 2, H, N, device="cuda")
    for i in range(2):
        values, s = kv_fp8.quantize(torch.randn(B, H, N, D, device="cuda") * 2)
        pool[:B, 1, i], scales[:B, 1, i] = values, s
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
    t = torch.tensor(steps, device="cuda")  # fresh, young, full, rolled, padding
    col = torch.arange(N, device="cuda")[None, :]
    own = torch.where(t >= 0, torch.where(t < N - 1, t, t % (N - 1)), N - 1)
    visible = (((col <= t[:, None]) & (col < N - 1)) | (col == own[:, None]))[:, None, None, :]
    layer, layer_scales = pool[:B, 1], scales[:B, 1]  # strided views, as SlotKV reads them
    fused = kv_fp8.attend(q, layer[:, 0], layer[:, 1], layer_scales[:, 0], layer_scales[:, 1], visible)
    keys = kv_fp8.dequantize(layer[:, 0], layer_scales[:, 0], torch.float32)
    values = kv_fp8.dequantize(layer[:, 1], layer_scales[:, 1], torch.float32)
    read = torch.nn.functional.scaled_dot_product_attention(q.float(), keys, values, attn_mask=visible)
    torch.testing.assert_close(fused.float(), read, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not kv_fp8.fused_available(torch.device("cuda")), reason="needs CUDA and Triton")
def test_fp8_graph_replay_equals_the_fp8_eager_step_on_the_gpu() -> None:
    cfg = dataclasses.replace(TEST, dtype="bfloat16")
    runs = []
    for mode in ("eager", "cuda_graphs"):
        stage = build_duplex_stage(cfg, "cuda", 4, step_mode=mode, kv_fp8=True)
        assert stage.step_mode == mode, stage.graph_error
        items = [
            StageItem(f"s{i}", 0, stage.silence(), slot=i, state=stage.open_state(f"s{i}", i))
            for i in range(3)
        ]
        runs.append([stage.forward(items) for _ in range(6)])
    for eager, replayed in zip(*runs, strict=True):
        assert [o.text for o in eager] == [o.text for o in replayed]
        for a, b in zip(eager, replayed, strict=True):
            np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not kv_fp8.fused_available(torch.device("cuda")), reason="needs CUDA and Triton")
def test_the_fused_kernel_reads_rows_past_two_gigabytes_of_pool() -> None:
    # a Moshi-shaped pool of 72 sessions is 57 GB: row offsets must not wrap at 2**31
    torch.manual_seed(0)
    N, D = 64, 128
    flat = torch.zeros(2**31 + 2 * N * D, dtype=kv_fp8.FP8, device="cuda")
    scales = torch.zeros(2, 2, 1, N, device="cuda")
    keys = flat.as_strided((2, 1, N, D), (2**31, N * D, D, 1))
    values = flat.as_strided((2, 1, N, D), (2**31, N * D, D, 1), storage_offset=N * D)
    for i, stored in enumerate((keys, values)):
        quantized, scale = kv_fp8.quantize(torch.randn(2, 1, N, D, device="cuda"))
        stored.copy_(quantized)
        scales[i] = scale
    q = torch.randn(2, 1, 1, D, device="cuda", dtype=torch.bfloat16)
    visible = torch.ones(2, 1, 1, N, dtype=torch.bool, device="cuda")
    fused = kv_fp8.attend(q, keys, values, scales[0], scales[1], visible)
    read = torch.nn.functional.scaled_dot_product_attention(
        q.float(),
        kv_fp8.dequantize(keys, scales[0], torch.float32),
        kv_fp8.dequantize(values, scales[1], torch.float32),
        attn_mask=visible,
    )
    torch.testing.assert_close(fused.float(), read, atol=2e-2, rtol=2e-2)
