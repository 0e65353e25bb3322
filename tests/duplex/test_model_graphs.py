"""The duplex LM's bucketed (CUDA-graph) step: equal to the eager step token for token, padding
rows never touch a session's KV, graph replay equal to eager on a GPU, loud fallback to eager."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from models.cuda_graphs import BatchGraphs, buckets
from models.duplex.configs import TEST, DuplexModelConfig
from models.duplex.graphs import StepMode
from models.duplex.stage import DuplexInput, DuplexOutput, DuplexStage, build_duplex_stage
from models.stage import StageItem
from tests.duplex.conftest import speech_frames

# frame -> sessions opening / closing before it; "c" skips every 4th frame (its row pads then)
JOINS = {0: ["a", "b"], 3: ["c"], 5: ["d"], 9: ["e"]}
LEAVES = {7: ["b"], 12: ["a"]}
FRAMES = 40  # past the context of 24 below: rolled steps (sink re-rotation) included


def _config(dtype: str) -> DuplexModelConfig:
    return dataclasses.replace(TEST, dtype=dtype, context=24, sink=2)


def _run(stage: DuplexStage, audio: list[DuplexInput]) -> tuple[list[list[DuplexOutput]], list[bool]]:
    """Drive ``stage`` through sessions joining and leaving (lowest free slot first, as the
    engine's slot table does); returns each frame's outputs and, per frame where a live session
    sat out, whether its KV stayed bit for bit what it was."""
    free, live, frames, untouched = list(range(stage.slot_capacity - 1, -1, -1)), {}, [], []
    context = stage.config.context
    for frame in range(FRAMES):
        for sid in JOINS.get(frame, []):
            live[sid] = free.pop()
            stage.open_state(sid, live[sid])
        for sid in LEAVES.get(frame, []):
            stage.release_state(sid, live[sid], None)
            free.append(live.pop(sid))
        out_of_batch = "c" in live and frame % 4 == 1
        stepping = [sid for sid in live if not (sid == "c" and out_of_batch)]
        before = stage.kv.kv[live["c"], ..., :context, :].clone() if out_of_batch else None
        items = [StageItem(sid, 0, audio[frame], slot=live[sid]) for sid in stepping]
        outs = stage.forward(items)
        assert all(isinstance(o, DuplexOutput) for o in outs), outs
        frames.append(outs)
        if before is not None:
            untouched.append(torch.equal(stage.kv.kv[live["c"], ..., :context, :], before))
    return frames, untouched


def _stage(dtype: str, device: str, mode: StepMode) -> DuplexStage:
    return build_duplex_stage(_config(dtype), device, slot_capacity=6, seed=3, step_mode=mode)


def _assert_same_streams(got: list[list[DuplexOutput]], want: list[list[DuplexOutput]], atol: float) -> None:
    assert len(got) == len(want) == FRAMES
    for outs, refs in zip(got, want, strict=True):
        assert [(o.text, o.speaking, o.step, o.rolled) for o in outs] == [
            (r.text, r.speaking, r.step, r.rolled) for r in refs
        ]
        for o, r in zip(outs, refs, strict=True):
            np.testing.assert_allclose(o.pcm, r.pcm, rtol=0, atol=atol)


def test_buckets_for_a_stateful_step_are_finer_than_powers_of_two() -> None:
    assert buckets(64, 8) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert buckets(20, 8) == (1, 2, 4, 8, 16, 20)
    assert buckets(3, 8) == (1, 2, 3)
    assert buckets(32) == (1, 2, 4, 8, 16, 32)  # the robot policy's buckets are unchanged


def test_a_stateful_batch_graph_refuses_to_pad() -> None:
    graphs = BatchGraphs(lambda x: x, max_batch=8, stateful=True)
    with pytest.raises(ValueError, match="whole bucket"):
        graphs(torch.zeros(3, 2))  # 3 is no bucket of 8: padding would repeat a stateful row


def test_the_bucketed_step_equals_the_eager_step_as_sessions_join_and_leave() -> None:
    audio = speech_frames(FRAMES, seed=5)
    bucketed = _stage("float64", "cpu", "buckets")
    assert bucketed.step_mode == "buckets" and bucketed.bucketed is not None
    got, untouched = _run(bucketed, audio)
    want, _ = _run(_stage("float64", "cpu", "eager"), audio)
    _assert_same_streams(got, want, atol=1e-12)
    assert any(o.rolled for outs in got for o in outs)  # the sink re-rotation ran
    assert any(o.text for outs in got for o in outs)  # sampling chose some words
    # a live session sitting a frame out was a padding row of its bucket: KV bit for bit unchanged
    assert len(untouched) >= 5 and all(untouched)


def test_the_scratch_column_is_never_visible_to_a_session() -> None:
    stage = _stage("float64", "cpu", "buckets")
    for slot in range(3):
        stage.open_state(f"s{slot}", slot)
    frames = speech_frames(4)
    stage.forward([StageItem("s2", 0, frames[0], slot=2)])  # rows 0, 1 and 3 pad (bucket of 4)
    kv = stage.kv.kv
    scratch = kv[..., stage.config.context, :]
    assert scratch[:2].abs().sum() > 0  # the padding rows wrote there...
    assert kv[:2, ..., : stage.config.context, :].abs().sum() == 0  # ...and nowhere else
    # reopening the padded slots gives the same stream as a fresh stage: the scratch is unseen
    fresh = _stage("float64", "cpu", "buckets")
    for stg in (stage, fresh):
        stg.open_state("x", 0)
        for slot in (1, 2):
            stg.release_state(f"s{slot}", slot, None)
    stage.kv.kv[0, ..., stage.config.context, :] = 1e3  # a garbage scratch column changes nothing
    for f in frames:
        a = stage.forward([StageItem("x", 0, f, slot=0)])[0]
        b = fresh.forward([StageItem("x", 0, f, slot=0)])[0]
        assert (a.text, a.step) == (b.text, b.step)  # type: ignore[union-attr]
        np.testing.assert_array_equal(a.pcm, b.pcm)  # type: ignore[union-attr]


def test_a_failed_capture_is_logged_and_the_stage_steps_eagerly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr("models.duplex.stage.BucketedStep", broken)
    with caplog.at_level(logging.ERROR, logger="models.duplex.stage"):
        stage = _stage("float32", "cpu", "buckets")
    assert stage.step_mode == "eager" and stage.bucketed is None
    assert stage.graph_error == "capture: RuntimeError: operation not permitted when stream is capturing"
    assert "stepping eagerly" in caplog.text and "operation not permitted" in caplog.text
    stage.open_state("a", 0)
    assert isinstance(stage.forward([StageItem("a", 0, speech_frames(1)[0], slot=0)])[0], DuplexOutput)


def test_cuda_graphs_need_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        _stage("float32", "cpu", "cuda_graphs")


@pytest.mark.gpu
def test_graph_replay_equals_the_eager_step_on_the_gpu() -> None:
    audio = speech_frames(FRAMES, seed=5)
    graphs = _stage("float32", "cuda", "cuda_graphs")
    assert graphs.step_mode == "cuda_graphs", graphs.graph_error
    got, untouched = _run(graphs, audio)
    assert graphs.step_mode == "cuda_graphs", graphs.graph_error  # no replay fell back
    assert all(untouched)
    bucketed, _ = _run(_stage("float32", "cuda", "buckets"), audio)
    _assert_same_streams(got, bucketed, atol=1e-6)  # the same kernels, replayed
    eager, _ = _run(_stage("float32", "cuda", "eager"), audio)
    _assert_same_streams(got, eager, atol=1e-4)


@pytest.mark.gpu
def test_the_default_build_on_cuda_replays_graphs_in_bfloat16() -> None:
    stage = build_duplex_stage(_config("bfloat16"), "cuda", slot_capacity=4, seed=3)
    assert stage.step_mode == "cuda_graphs", stage.graph_error
    frames = speech_frames(30)
    for i in range(4):
        stage.open_state(f"s{i}", i)
    for f in frames:
        outs = stage.forward([StageItem(f"s{i}", 0, f, slot=i) for i in (0, 2, 3)])
        assert all(isinstance(o, DuplexOutput) and np.isfinite(o.pcm).all() for o in outs)
    assert stage.step_mode == "cuda_graphs", stage.graph_error
    assert stage.kv.kv[1, ..., : stage.config.context, :].abs().sum() == 0  # slot 1 only ever padded
