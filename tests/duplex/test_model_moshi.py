"""The Moshi adapter on a small random Moshi (Kyutai's ``moshi`` package, no downloads)."""

from __future__ import annotations

import numpy as np
import pytest

from models.duplex.stage import FRAME_SAMPLES, DuplexInput, DuplexInputError, DuplexOutput, DuplexStepFailed
from models.stage import StageItem
from tests.duplex.conftest import speech_frames

pytest.importorskip("moshi", reason="moshi is not installed (.ci/install-test-deps installs it)")

from models.duplex.moshi_adapter import SMALL_LM_KWARGS, SMALL_MIMI_CONFIG, MoshiDuplexStage  # noqa: E402


@pytest.fixture(scope="module")
def stage() -> MoshiDuplexStage:
    return MoshiDuplexStage.from_config(
        slot_capacity=3, lm_kwargs=SMALL_LM_KWARGS, mimi_config=SMALL_MIMI_CONFIG
    )


def test_sessions_at_different_positions_step_together(stage: MoshiDuplexStage) -> None:
    stage.open_state("a", 0)
    stage.open_state("b", 2)
    frames = speech_frames(8)
    outs_a = [stage.forward([StageItem("a", 0, f, slot=0)])[0] for f in frames[:3]]
    for f_a, f_b in zip(frames[3:], frames, strict=False):
        out_a, out_b = stage.forward([StageItem("b", 0, f_b, slot=2), StageItem("a", 0, f_a, slot=0)])[::-1]
        outs_a.append(out_a)
        assert isinstance(out_b, DuplexOutput)
    assert [o.step for o in outs_a] == list(range(8))  # type: ignore[union-attr]
    assert stage.steps.tolist() == [8, 0, 5]  # slot 1 never stepped
    first, later = outs_a[0], outs_a[2:]
    assert isinstance(first, DuplexOutput) and not first.speaking and not first.pcm.any()  # Moshi's delay
    assert all(isinstance(o, DuplexOutput) and o.pcm.shape == (FRAME_SAMPLES,) for o in later)
    assert any(o.pcm.any() for o in later)  # type: ignore[union-attr]
    assert all(np.isfinite(o.pcm).all() for o in later)  # type: ignore[union-attr]


def test_reopening_resets_the_row_and_bad_frames_are_typed(stage: MoshiDuplexStage) -> None:
    stage.open_state("c", 1)
    bad = stage.forward([StageItem("c", 0, DuplexInput(np.zeros(10, np.float32)), slot=1)])[0]
    assert isinstance(bad, DuplexInputError)
    out = stage.forward([StageItem("c", 0, stage.silence(), slot=1)])[0]
    assert isinstance(out, DuplexOutput) and out.step == 0


def test_a_failing_moshi_step_fails_its_sessions_without_raising(
    stage: MoshiDuplexStage, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage.open_state("d", 1)
    stage.forward([StageItem("d", 0, stage.silence(), slot=1)])

    def broken(*args: object) -> object:
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(stage.lm_gen, "step", broken)
    out = stage.forward([StageItem("d", 0, stage.silence(), slot=1)])
    assert isinstance(out[0], DuplexStepFailed) and out[0].code == "duplex_step_failed"
    assert stage.steps[1] == 0  # the row was reset


def test_state_bytes_counts_the_streaming_state_per_row(stage: MoshiDuplexStage) -> None:
    k = SMALL_LM_KWARGS
    kv = k["num_layers"] * 2 * k["dim"] * k["context"] * 4  # the LM's K/V ring alone (float32)
    assert stage.state_bytes() > kv
    assert stage.context_policy == "roll"
