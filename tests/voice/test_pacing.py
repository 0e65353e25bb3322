"""Reply pacing and step priority (models/voice/pacing.py) and the transformers LLM stage using them.

The stage tests drive ``TransformersLlmStage`` with a scripted chat backend (a word per step, a
few ms per "forward", every step logged), so the order of steps across replies is observable.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from models.stage import StageItem
from models.voice.llm import ChatMessage, ChatUsage
from models.voice.pacing import BEHIND, FIRST, RELAXED, PacingPolicy, PlaybackClock, ReplyPace, StepGate
from models.voice.stages import ChatRequest, TransformersLlmStage


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_lead_is_sent_audio_not_yet_played_and_a_stall_is_not_credited():
    t = FakeTime()
    clock = PlaybackClock(t)
    assert clock.lead_s() == 0.0  # nothing sent
    clock.sent(2.0)
    t.now += 0.5
    clock.sent(1.0)
    assert clock.lead_s() == pytest.approx(2.5)
    t.now += 5.0  # played out 2.5 s ago: the player stalled
    assert clock.lead_s() == 0.0
    clock.sent(1.0)  # playback resumes now, not 2.5 s in the past
    assert clock.lead_s() == pytest.approx(1.0)


def test_text_queued_for_the_tts_and_not_voiced_yet_is_lead_at_the_responses_own_speech_rate():
    t = FakeTime()
    clock = PlaybackClock(t)
    pace = ReplyPace(PacingPolicy(max_lead_s=4.0, urgent_lead_s=1.0), clock)
    pace.emitted(("x" * 45,))  # a clause handed to the TTS, no audio yet: 3 s at 15 chars/s
    assert pace.spoke and clock.lead_s() == 0.0 and clock.pending_s() == pytest.approx(3.0)
    assert not pace.ahead()
    pace.emitted(("y" * 30,))  # 5 s of text waiting for a TTS that fell behind: generation waits
    assert pace.ahead()
    clock.sent(1.5, chars=45)  # the first clause voiced: this voice speaks 30 chars/s
    assert clock.pending_s() == pytest.approx(1.0) and clock.lead_s() == pytest.approx(1.5)
    assert not pace.ahead()  # 2.5 s in all
    assert pace.level() == RELAXED  # urgency counts the audio the listener has, not text in flight
    t.now += 1.4
    assert pace.level() == BEHIND
    clock.sent(1.0, chars=30)
    assert clock.pending_s() == 0.0


def test_a_reply_sleeps_while_its_lead_is_at_the_maximum_and_not_before_its_first_clause():
    clock = PlaybackClock()
    pace = ReplyPace(PacingPolicy(max_lead_s=0.2, urgent_lead_s=0.05), clock)
    clock.sent(0.5)
    start = time.monotonic()
    pace.wait(threading.Event())
    assert time.monotonic() - start < 0.05  # no clause out yet: time-to-first-audio work never waits
    assert pace.level() == FIRST
    pace.spoke = True
    assert pace.level() == RELAXED  # ~0.5 s of lead: above urgent_lead_s
    pace.wait(threading.Event())
    assert clock.lead_s() < 0.2 and time.monotonic() - start >= 0.25
    stop = threading.Event()
    clock.sent(10.0)
    stop.set()
    start = time.monotonic()
    pace.wait(stop)  # an abort ends the wait at once
    assert time.monotonic() - start < 0.05


def test_a_stalled_reply_ranks_with_first_clauses_and_a_nearly_stalled_one_behind_them():
    t = FakeTime()
    clock = PlaybackClock(t)
    pace = ReplyPace(PacingPolicy(max_lead_s=4.0, urgent_lead_s=1.0), clock)
    pace.spoke = True
    clock.sent(3.0)
    assert pace.level() == RELAXED
    t.now += 2.5  # 0.5 s left to play
    assert pace.level() == BEHIND
    t.now += 1.0  # played out: the listener hears silence
    assert pace.level() == FIRST


class Reply:
    def __init__(self, level: int) -> None:
        self.at = level

    def level(self) -> int:
        return self.at


@pytest.mark.parametrize("later", [BEHIND, RELAXED])
def test_a_continuation_waits_while_a_reply_is_in_its_first_clause_even_between_its_steps(later):
    gate = StepGate(permits=2)
    order: list[str] = []
    urgent_in = threading.Event()
    release = threading.Event()

    first = Reply(FIRST)

    def urgent() -> None:
        with gate.step(first):
            urgent_in.set()
            order.append("urgent step")
        release.wait(5)  # between its steps: still urgent
        order.append("urgent done")
        gate.finish(first)

    def relaxed() -> None:
        with gate.step(Reply(later)):
            order.append("relaxed")

    threads = [threading.Thread(target=urgent)]
    threads[0].start()
    urgent_in.wait(5)
    threads.append(threading.Thread(target=relaxed))
    threads[1].start()
    time.sleep(0.15)  # a free permit, yet the relaxed step must not run beside the urgent one
    release.set()
    for t in threads:
        t.join(5)
    assert order == ["urgent step", "urgent done", "relaxed"]
    assert gate.yielded == 1


def test_a_waiting_relaxed_step_runs_beside_a_behind_one_once_its_own_lead_falls():
    gate = StepGate(permits=2)
    release, ran = threading.Event(), threading.Event()
    falling = Reply(RELAXED)

    def urgent() -> None:
        with gate.step(Reply(BEHIND)):
            release.wait(5)

    def relaxed() -> None:
        with gate.step(falling):
            ran.set()

    a, b = threading.Thread(target=urgent), threading.Thread(target=relaxed)
    a.start()
    time.sleep(0.05)
    b.start()
    assert not ran.wait(0.15)
    falling.at = BEHIND  # its playback is about to stall: it is urgent now
    assert ran.wait(1.0)
    release.set()
    a.join(5)
    b.join(5)


# ------------------------------------------------------------------------------ the stage


class ScriptedChat:
    """``TransformersChat``'s surface: every reply is ``words`` words, one per step of ``step_s``,
    a clause every ``clause`` words; each step is logged as ``(conversation, step)``."""

    kv_bytes_per_conversation = 0

    def __init__(self, words: int = 24, clause: int = 4, step_s: float = 0.004) -> None:
        self.words, self.clause, self.step_s = words, clause, step_s
        self.log: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def open(self, conversation_id: str) -> None: ...

    def release(self, conversation_id: str) -> None: ...

    def last_usage(self, conversation_id: str) -> ChatUsage:
        return ChatUsage(1, 0, self.words)

    def generate(self, conversation_id: str, messages, *, should_stop, **kwargs):
        def pieces():
            for step in range(self.words):
                if should_stop():
                    return
                time.sleep(self.step_s)
                with self._lock:
                    self.log.append((conversation_id, step))
                yield f" w{step}." if (step + 1) % self.clause == 0 else f" w{step}"

        return pieces()


def request(clock: PlaybackClock | None) -> ChatRequest:
    return ChatRequest((ChatMessage("user", "hi"),), playback=clock)


async def consume(stage: TransformersLlmStage, session: str, clock: PlaybackClock | None, clause_s: float):
    """The kind's part: every clause the stage completes becomes ``clause_s`` of audio sent."""
    item = StageItem(session, 0, request(clock), request_id=f"r-{session}")
    clauses = 0
    async for chunk in stage.stream(item):
        clauses += len(chunk.clauses)
        if clock is not None and chunk.clauses:
            clock.sent(clause_s * len(chunk.clauses), sum(len(c) for c in chunk.clauses))
    return clauses


@pytest.mark.parametrize("max_lead_s", [0.0, 0.2])
async def test_a_reply_is_generated_only_a_bounded_lead_ahead_of_its_playback(max_lead_s):
    chat = ScriptedChat(words=24, clause=4)  # 6 clauses, 0.6 s of "audio"; ~0.1 s to generate
    stage = TransformersLlmStage(
        chat, 2, workers=1, pacing=PacingPolicy(max_lead_s=max_lead_s, urgent_lead_s=0.0)
    )
    try:
        start = time.monotonic()
        assert await consume(stage, "a", PlaybackClock(), clause_s=0.1) == 6
        elapsed = time.monotonic() - start
    finally:
        stage.close()
    if max_lead_s:
        assert elapsed >= 0.6 - max_lead_s - 0.1 - 0.05  # the last clause's audio is the lead left
    else:
        assert elapsed < 0.3  # pacing off: as fast as the model goes


async def test_a_new_turns_first_clause_runs_before_other_replies_continue():
    chat = ScriptedChat(words=40, clause=4, step_s=0.003)
    stage = TransformersLlmStage(chat, 2, workers=2, pacing=PacingPolicy(max_lead_s=100.0, urgent_lead_s=0.5))
    try:
        a_clock = PlaybackClock()
        a = asyncio.create_task(consume(stage, "a", a_clock, clause_s=1.0))  # a long, relaxed reply
        while not any(c == "a" and s >= 8 for c, s in chat.log):
            await asyncio.sleep(0.005)
        b = await consume(stage, "b", None, clause_s=0.0)  # a new turn (no clock: urgent throughout)
        await a
    finally:
        stage.close()
    assert b == 10
    first_b = chat.log.index(("b", 0))
    b_first_clause = chat.log.index(("b", 3))
    assert [c for c, _ in chat.log[first_b : b_first_clause + 1]] == ["b"] * 4  # no step of a between
    assert stage.gate.yielded >= 1


async def test_an_aborted_reply_ends_at_once_while_another_reply_is_urgent():
    chat = ScriptedChat(words=300, clause=4, step_s=0.004)
    stage = TransformersLlmStage(chat, 2, workers=2, pacing=PacingPolicy(max_lead_s=100.0, urgent_lead_s=0.5))
    try:
        a = asyncio.create_task(consume(stage, "a", PlaybackClock(), clause_s=1.0))  # relaxed after a clause
        while not any(c == "a" and s >= 8 for c, s in chat.log):
            await asyncio.sleep(0.005)
        b = asyncio.create_task(consume(stage, "b", None, clause_s=0.0))  # urgent for ~1.2 s
        while ("b", 2) not in chat.log:
            await asyncio.sleep(0.005)
        stage.abort("r-a")  # a barge-in: a's waiting step must not wait for b
        await asyncio.wait_for(a, 0.3)
        assert not b.done()
        await b
    finally:
        stage.close()
    assert stage.aborts == 1
