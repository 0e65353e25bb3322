"""A duplex model's context rebuilt from a checkpoint's host data (``models/duplex/context.py``):
the token rows of the embedded Moshi-shaped stage (KV recomputed in one prefill), the cascade's
chat messages, the logs' bounds, and the typed failure of a restore that cannot be done."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models.duplex.cascade import MESSAGE_OVERHEAD_BYTES, ChatContext, ChatLog, bounded
from models.duplex.configs import TEST, DuplexModelConfig
from models.duplex.context import TokenContext, TokenLog
from models.duplex.stage import ContextRestoreFailed, DuplexOutput, DuplexStage, build_duplex_stage
from models.stage import StageItem
from models.voice.llm import ChatMessage
from tests.duplex.conftest import speech_frames


def stepped(cfg: DuplexModelConfig, steps: int, slot: int = 1) -> tuple[DuplexStage, TokenLog]:
    """A stage whose session ``"s"`` in ``slot`` stepped ``steps`` frames of speech, and the log
    its outputs fed (what the session side keeps)."""
    stage = build_duplex_stage(cfg, "cpu", slot_capacity=2)
    stage.open_state("s", slot)
    log = stage.context_log()
    for frame in speech_frames(steps):
        (out,) = stage.forward([StageItem("s", 0, frame, slot=slot)])
        assert isinstance(out, DuplexOutput)
        log.add(out.context)
    return stage, log


def restored(cfg: DuplexModelConfig, context: TokenContext, slot: int = 0) -> tuple[DuplexStage, object]:
    """A fresh stage (same weights) whose session ``"s"`` steps once on an input carrying ``context``."""
    stage = build_duplex_stage(cfg, "cpu", slot_capacity=2)
    stage.open_state("s", slot)
    frame = dataclasses.replace(speech_frames(1, seed=9)[0], restore=context)
    (out,) = stage.forward([StageItem("s", 0, frame, slot=slot)])
    return stage, out


def kv_without(stage: DuplexStage, slot: int, frame: int) -> torch.Tensor:
    """The slot's KV columns but the scratch one and ``frame``'s (the step after the restore)."""
    keep = torch.ones(stage.kv.geometry.columns, dtype=torch.bool)
    keep[[int(stage.kv.index(torch.tensor([frame]))[0]), stage.config.context]] = False
    return stage.kv.kv[slot][..., keep, :]


@pytest.mark.parametrize(
    ("cfg", "steps"),
    [
        (dataclasses.replace(TEST, dtype="float64"), 20),  # within the context: every layer
        (dataclasses.replace(TEST, dtype="float64", layers=1, context=16, sink=2), 45),  # rolled twice
    ],
    ids=["unrolled", "rolled"],
)
def test_a_restored_slot_holds_the_kv_of_the_slot_that_stepped_the_same_frames(cfg, steps) -> None:
    # Unrolled, the prefill is the stepped stream exactly. Rolled, a one-layer model's keys depend
    # on their own frame only, so the ring placement and the sink's rotation are checked exactly.
    lived, log = stepped(cfg, steps)
    context = log.snapshot(1 << 20)
    assert context is not None and context.steps == steps and context.head == cfg.sink
    assert len(context.inputs) == min(steps, cfg.context) and context.inputs.shape[1] == 1 + 2 * cfg.n_q
    stage, out = restored(cfg, context)
    assert isinstance(out, DuplexOutput) and out.step == steps, "the stream goes on at its step"
    assert stage.steps[0] == lived.steps[1] + 1 == steps + 1
    assert stage.seeds[0] == lived.seeds[1], "same session id, same sampling noise"
    torch.testing.assert_close(
        kv_without(stage, 0, steps), kv_without(lived, 1, steps), rtol=1e-12, atol=1e-12
    )


def test_after_a_restore_the_stream_goes_on_as_the_stepped_one_whose_codec_restarted() -> None:
    # The codec's buffers are the one part a restore starts fresh: restart them in the stepped
    # slot too, and both go on with the same tokens, decisions, text and audio.
    cfg = dataclasses.replace(TEST, dtype="float64")
    lived, log = stepped(cfg, 12)
    lived.codec_state.reset(1)
    stage = build_duplex_stage(cfg, "cpu", slot_capacity=2)
    stage.open_state("s", 0)
    frames = speech_frames(6, seed=9)
    frames[0] = dataclasses.replace(frames[0], restore=log.snapshot(1 << 20))
    for frame in frames:
        (a,) = lived.forward([StageItem("s", 0, dataclasses.replace(frame, restore=None), slot=1)])
        (b,) = stage.forward([StageItem("s", 0, frame, slot=0)])
        assert isinstance(a, DuplexOutput) and isinstance(b, DuplexOutput)
        assert (b.step, b.text, b.speaking) == (a.step, a.text, a.speaking)
        np.testing.assert_array_equal(b.context.inputs, a.context.inputs)
        np.testing.assert_array_equal(b.context.outputs, a.context.outputs)
        np.testing.assert_allclose(b.pcm, a.pcm, rtol=1e-9, atol=1e-12)


def test_the_token_log_keeps_the_sink_and_the_newest_rows_within_its_bytes() -> None:
    cfg = dataclasses.replace(TEST, dtype="float64")
    _, log = stepped(cfg, 60)  # past the context (48): the ring wrapped
    row = log.ring[0].nbytes  # (1 + 2 n_q) int32
    full = log.snapshot(1 << 20)
    assert full is not None and len(full.inputs) == cfg.context
    assert full.frames.tolist() == [0, 1, *range(60 - cfg.window, 60)]
    small = log.snapshot(10 * row)
    assert small is not None and small.frames.tolist() == [0, 1, *range(52, 60)]
    np.testing.assert_array_equal(small.inputs[2:], full.inputs[-8:])
    again = TokenLog(cfg.sink, cfg.window, 1 + 2 * cfg.n_q)
    again.restore(full)
    np.testing.assert_array_equal(again.snapshot(1 << 20).inputs, full.inputs)
    stage, out = restored(cfg, small)  # a trimmed context loads too (fewer frames in the window)
    assert isinstance(out, DuplexOutput) and out.step == 60 and stage.steps[0] == 61


def test_a_restore_that_cannot_be_done_fails_its_item_alone_and_leaves_the_slot_empty() -> None:
    cfg = dataclasses.replace(TEST, dtype="float64")
    _, log = stepped(cfg, 8)
    good = log.snapshot(1 << 20)
    bad_token = dataclasses.replace(good, inputs=good.inputs + cfg.text_vocab)
    too_long = dataclasses.replace(good, steps=3)
    stage = build_duplex_stage(cfg, "cpu", slot_capacity=2)
    for broken in (bad_token, too_long, ChatContext(())):
        for slot in (0, 1):
            stage.open_state(f"s{slot}", slot)
        frames = speech_frames(2)
        items = [
            StageItem("s0", 0, dataclasses.replace(frames[0], restore=broken), slot=0),
            StageItem("s1", 0, frames[1], slot=1),
        ]
        failed, fine = stage.forward(items)
        assert isinstance(failed, ContextRestoreFailed) and failed.code == "context_restore_failed"
        assert isinstance(fine, DuplexOutput) and fine.step == 0
        assert stage.steps[0] == 0 and stage.kv.kv[0].abs().sum() == 0, "nothing half-restored"


def test_the_moshi_adapter_keeps_no_context_and_refuses_a_restore() -> None:
    pytest.importorskip("moshi")
    from models.duplex.moshi_adapter import SMALL_LM_KWARGS, SMALL_MIMI_CONFIG, MoshiDuplexStage

    stage = MoshiDuplexStage.from_config("cpu", 1, SMALL_LM_KWARGS, SMALL_MIMI_CONFIG)
    assert stage.context_log() is None
    stage.open_state("m", 0)
    frame = dataclasses.replace(stage.silence(), restore=TokenContext(np.zeros((0, 17)), np.zeros(9), 0, 0))
    (out,) = stage.forward([StageItem("m", 0, frame, slot=0)])
    assert isinstance(out, ContextRestoreFailed)


def test_the_chat_log_keeps_the_newest_messages_within_its_bytes_from_a_user_turn() -> None:
    said = [ChatMessage("user" if n % 2 == 0 else "assistant", f"message {n} " + "x" * 50) for n in range(10)]
    size = 60 + MESSAGE_OVERHEAD_BYTES  # each message's share of the budget
    log = ChatLog()
    assert log.snapshot(1 << 20) is None
    log.add(ChatContext(tuple(said)))
    assert log.snapshot(1 << 20) == ChatContext(tuple(said))
    three = log.snapshot(3 * size)  # room for three messages: the first of them is an assistant's
    assert three is not None and three.messages == tuple(said[-2:])
    again = ChatLog()
    again.restore(three)
    assert again.messages == three.messages
    assert bounded(said, 3) == said[-2:] and bounded(said, 0) == [] and bounded(said, 99) == said
