"""The cascade as a duplex stage (``models/duplex/cascade.py``), driven directly at the frame
clock's pace with the real offline parts (loaded once per process: ``load_parts`` is shared with
the e2e module's server when they run in one process)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import numpy as np
import pytest

from models.duplex.cascade import ChatContext
from models.duplex.stage import FRAME_SAMPLES, SAMPLE_RATE, DuplexInput, DuplexInputError, DuplexOutput
from models.stage import StageItem
from models.voice.llm import ChatMessage, UnknownConversation
from realtime.config import DuplexConfig
from realtime.kinds.duplex_model import build_stage
from tests.voice.speech import spoken_24k

pytestmark = pytest.mark.timeout(300)

PERIOD_S = FRAME_SAMPLES / SAMPLE_RATE
CONFIG = DuplexConfig(model="duplex-cascade", max_sessions=4)  # the e2e server's: one copy of the parts


@pytest.fixture(scope="module")
def stage():
    return build_stage(CONFIG, CONFIG.max_sessions)


def said(text: str) -> list[np.ndarray]:
    audio = spoken_24k(text, 0.0, 0.0)
    padded = np.zeros(-(-len(audio) // FRAME_SAMPLES) * FRAME_SAMPLES, np.float32)
    padded[: len(audio)] = audio
    return list(padded.reshape(-1, FRAME_SAMPLES))


def clocked(
    stage, session_id: str, slot: int, frames: Iterator[np.ndarray | None], epoch: int = 0
) -> Iterator[DuplexOutput]:
    """One session stepped every 80 ms on ``frames`` (None: the silence a session steps on)."""
    start = time.monotonic()
    for n, pcm in enumerate(frames):
        time.sleep(max(0.0, start + n * PERIOD_S - time.monotonic()))
        payload = stage.silence() if pcm is None else DuplexInput(pcm)
        (out,) = stage.forward([StageItem(session_id, epoch, payload, slot=slot)])
        assert isinstance(out, DuplexOutput), out
        yield out


def silence(seconds: float = 60.0) -> Iterator[None]:
    """Silence frames; the loops break as soon as what they wait for happens (the bound only
    ends a test whose model never answers)."""
    return iter([None] * int(seconds / PERIOD_S))


def test_the_stage_contract(stage) -> None:
    for slot in (0, 1):
        stage.open_state(f"c{slot}", slot)
    try:
        bad = np.full(FRAME_SAMPLES, np.nan, np.float32)
        items = [
            StageItem("c0", 0, DuplexInput(np.zeros(10, np.float32)), slot=0),
            StageItem("c1", 0, DuplexInput(bad), slot=1),
        ]
        assert [type(o) for o in stage.forward(items)] == [DuplexInputError, DuplexInputError]
        for step in range(3):
            outs = stage.forward([StageItem(f"c{s}", 0, stage.silence(), slot=s) for s in (0, 1)])
            assert [(o.step, o.speaking, o.text, float(np.abs(o.pcm).max())) for o in outs] == [
                (step, False, "", 0.0)
            ] * 2
        assert stage.state_bytes() > stage.parts.chat.kv_bytes_per_conversation > 0
    finally:
        for slot in (0, 1):
            stage.release_state(f"c{slot}", slot, None)
    stage.open_state("c0-again", 0)  # a released slot opens fresh
    (out,) = stage.forward([StageItem("c0-again", 0, stage.silence(), slot=0)])
    assert out.step == 0
    stage.release_state("c0-again", 0, None)


def test_the_stage_yields_within_barge_in_and_its_reply_stops(stage) -> None:
    stage.open_state("b", 0)
    session = stage.sessions[0]
    try:
        frames = iter([*said("Tell me a long story about a dragon."), *silence()])
        spoken = 0
        for out in clocked(stage, "b", 0, frames):
            spoken += out.speaking
            if spoken == 12:  # a second of the story
                break
        story = session.reply
        assert story is not None and story.committed and story.thread.is_alive()
        interruption = iter([*said("What is the capital of Germany?"), *silence()])
        after = []
        for out in clocked(stage, "b", 0, interruption):
            after.append((session.turns.in_speech, out))
            if not out.speaking:
                break
        frames_to_yield = next(i for i, (_, o) in enumerate(after) if not o.speaking) - next(
            i for i, (heard, _) in enumerate(after) if heard
        )
        assert frames_to_yield <= -(-CONFIG.barge_in_ms // 80) + 1, after
        assert session.reply is not story and story.stop.is_set()
        story.thread.join(5)
        assert not story.thread.is_alive()
        assert session.history[-1].role == "assistant" and session.history[-1].content == story.text
    finally:
        stage.release_state("b", 0, None)


def test_an_epoch_bump_cuts_the_reply_in_that_step_and_the_speech_is_answered(stage) -> None:
    stage.open_state("e", 2)
    session = stage.sessions[2]
    try:
        spoken = 0
        for out in clocked(stage, "e", 2, iter([*said("Tell me a long story about a dragon."), *silence()])):
            spoken += out.speaking
            if spoken == 6:
                break
        story = session.reply
        frames = iter([*said("What is the capital of Germany?"), *silence()])
        outs = clocked(stage, "e", 2, frames, epoch=1)  # the kind's barge-in bumped the epoch
        assert not next(outs).speaking and story.stop.is_set() and session.reply is None
        for _ in outs:
            if session.reply is not None and session.reply.committed:
                break
        else:
            raise AssertionError("the interruption was never answered")
        assert [m.content for m in session.history if m.role == "user"][
            -1
        ] == "What is the capital of Germany?"
    finally:
        stage.release_state("e", 2, None)


def test_release_during_a_reply_stops_it_and_frees_the_conversation(stage) -> None:
    stage.open_state("r", 1)
    session = stage.sessions[1]
    for _ in clocked(stage, "r", 1, iter([*said("Tell me a long story about a dragon."), *silence()])):
        if session.reply is not None and session.reply.playout.ready():
            break
    else:
        raise AssertionError("no reply")
    reply = session.reply
    assert reply is not None
    stage.release_state("r", 1, None)
    reply.thread.join(5)
    assert reply.stop.is_set() and not reply.thread.is_alive()
    with pytest.raises(UnknownConversation):
        stage.parts.chat.last_usage("r")
    assert stage.sessions[1] is None


def test_a_restored_session_remembers_the_conversation_and_answers_with_it(stage, monkeypatch) -> None:
    before = (ChatMessage("user", "My name is Ada."), ChatMessage("assistant", "Nice to meet you, Ada."))
    asked: list[tuple[ChatMessage, ...]] = []
    reply_chunks = stage.llm.reply_chunks

    def recording(session_id, request, stop):  # noqa: ANN001, ANN202 (the LLM stage's own)
        asked.append(request.messages)
        return reply_chunks(session_id, request, stop)

    monkeypatch.setattr(stage.llm, "reply_chunks", recording)
    stage.open_state("k", 3)
    session = stage.sessions[3]
    try:
        first = dataclasses.replace(stage.silence(), restore=ChatContext(before))
        (out,) = stage.forward([StageItem("k", 0, first, slot=3)])
        assert isinstance(out, DuplexOutput) and session.history == list(before)
        session.last_thread.join(30)
        assert asked[0][:2] == before, "the restored conversation's prompt is prefilled at once"
        carried = []
        for out in clocked(stage, "k", 3, iter([*said("What is my name?"), *silence()])):
            carried += [out.context] if out.context is not None else []
            if session.reply is not None and session.reply.committed:
                break
        question = session.history[-1]
        assert question.role == "user" and asked[-1] == (*before, question), "the reply is asked with it"
        assert carried[-1] == ChatContext((*before, question)), "the session's log goes on from it"
    finally:
        stage.release_state("k", 3, None)
