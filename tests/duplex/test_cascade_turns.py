"""The cascade's turn-taking (``models/duplex/turns.py``) on synthetic inputs: VAD probabilities
frame by frame (32 ms each) and transcripts handed back by hand, so every rule's threshold is
checked to the frame."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.duplex.turns import (
    Backchannel,
    Cancel,
    Commit,
    Draft,
    Transcribe,
    TurnRules,
    TurnTaker,
    sounds_complete,
)
from models.voice.vad import FRAME_MS, FRAME_SAMPLES

SPEECH, QUIET = 0.95, 0.02


def push(taker: TurnTaker, ms: int, p: float) -> list:
    """``ms`` of audio at speech probability ``p``, one VAD frame at a time."""
    n = ms // FRAME_MS
    return taker.hear(np.zeros((n, FRAME_SAMPLES), np.float32), np.full(n, p, np.float32))


def until(taker: TurnTaker, p: float, kind: type, limit_ms: int = 5000) -> tuple[int, list]:
    """Push frames at ``p`` until an action of ``kind`` comes: (ms pushed, the actions so far)."""
    seen: list = []
    for frame in range(limit_ms // FRAME_MS):
        seen += push(taker, FRAME_MS, p)
        if any(isinstance(a, kind) for a in seen):
            return (frame + 1) * FRAME_MS, seen
    raise AssertionError(f"no {kind.__name__} within {limit_ms} ms: {seen}")


def final(actions: list) -> Transcribe:
    return next(a for a in actions if isinstance(a, Transcribe) and a.final)


def kinds(actions: list) -> list[type]:
    return [type(a) for a in actions if not (isinstance(a, Transcribe) and not a.final)]


@pytest.mark.parametrize(
    ("text", "complete"),
    [
        ("What is the capital of France?", True),
        ("Tell me a story.", True),
        ("Wow!", True),
        ('He said "stop."', True),
        ("What is the capital of", False),
        ("I went to the store and.", False),  # Whisper's period after a trailing conjunction
        ("So, um...", False),
        ("Well…", False),
        ("I think that,", False),
        ("", False),
        ("   ", False),
    ],
)
def test_sounds_complete(text: str, complete: bool) -> None:
    assert sounds_complete(text) is complete


def test_a_complete_question_is_drafted_at_its_transcript_and_committed_at_the_end_silence() -> None:
    rules = TurnRules(partial_ms=0)
    taker = TurnTaker(rules)
    assert kinds(push(taker, 992, SPEECH)) == []
    waited, actions = until(taker, QUIET, Transcribe)
    request = final(actions)
    assert waited == rules.pause_ms and len(request.audio) > 0.9 * 16_000  # prefix + speech + pause
    assert taker.transcribed(request.request, "What is the capital of France?") == [
        Draft("What is the capital of France?")
    ]
    assert taker.drafting and not taker.answering
    waited, actions = until(taker, QUIET, Commit)
    assert waited + rules.pause_ms == rules.end_silence_ms
    assert actions == [Commit("What is the capital of France?")]  # the draft is played, not redone
    assert taker.answering and not taker.drafting and not taker.in_speech


def test_an_incomplete_transcript_waits_for_the_max_silence() -> None:
    rules = TurnRules()
    taker = TurnTaker(rules)
    push(taker, 800, SPEECH)
    waited, actions = until(taker, QUIET, Transcribe)
    assert taker.transcribed(final(actions).request, "What is the capital of") == []
    waited, actions = until(taker, QUIET, Commit)
    assert waited + rules.pause_ms == math.ceil(rules.max_silence_ms / FRAME_MS) * FRAME_MS
    assert actions == [Draft("What is the capital of"), Commit("What is the capital of")]


def test_speech_after_a_pause_cancels_the_draft_and_the_turn_goes_on() -> None:
    taker = TurnTaker(TurnRules(partial_ms=0))
    push(taker, 640, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    assert taker.transcribed(final(actions).request, "What is the capital of France?") == [
        Draft("What is the capital of France?")
    ]
    assert push(taker, FRAME_MS, SPEECH) == [Cancel("speech_resumed")]
    assert not taker.drafting
    assert taker.transcribed(final(actions).request, "late copy") == []  # the old pause is stale
    push(taker, 640, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    whole = final(actions)
    assert len(whole.audio) > 1.4 * 16_000  # the next pause transcribes the whole utterance
    assert taker.transcribed(whole.request, "What is the capital of France? And Spain?") == [
        Draft("What is the capital of France? And Spain?")
    ]


def test_an_empty_transcript_is_no_turn() -> None:
    taker = TurnTaker()
    push(taker, 320, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    assert taker.transcribed(final(actions).request, "") == []
    assert push(taker, 2000, QUIET) == []
    assert not taker.in_speech and not taker.answering


def test_a_transcript_that_comes_after_the_max_silence_ends_the_turn_on_arrival() -> None:
    taker = TurnTaker()
    push(taker, 640, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    assert push(taker, 2000, QUIET) == []  # the detector ended the utterance; the text is not back
    assert taker.transcribed(final(actions).request, "Hello there.") == [
        Draft("Hello there."),
        Commit("Hello there."),
    ]
    assert taker.answering


def test_a_late_transcript_heard_while_the_user_speaks_again_opens_the_next_turn() -> None:
    taker = TurnTaker(TurnRules(partial_ms=0))
    push(taker, 640, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    push(taker, 2000, QUIET)
    push(taker, 320, SPEECH)  # a new utterance has begun
    assert taker.transcribed(final(actions).request, "My name is Ada.") == []
    _, actions = until(taker, QUIET, Transcribe)
    assert taker.transcribed(final(actions).request, "What is mine?") == [
        Draft("My name is Ada. What is mine?")
    ]


def test_barge_in_cancels_the_reply_after_barge_in_ms_of_speech_and_becomes_the_next_turn() -> None:
    rules = TurnRules(partial_ms=0)
    taker = TurnTaker(rules)
    push(taker, 640, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    taker.transcribed(final(actions).request, "Tell me a story.")
    until(taker, QUIET, Commit)
    assert taker.answering
    waited, actions = until(taker, SPEECH, Cancel)
    assert waited == rules.barge_in_ms and actions == [Cancel("barge_in")]
    assert not taker.answering
    push(taker, 320, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)  # the interruption is the user's next turn
    assert taker.transcribed(final(actions).request, "Stop.") == [Draft("Stop.")]


def test_speech_shorter_than_barge_in_while_the_model_answers_is_an_aside() -> None:
    rules = TurnRules(partial_ms=0)
    taker = TurnTaker(rules)
    push(taker, 640, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    taker.transcribed(final(actions).request, "Tell me a story.")
    until(taker, QUIET, Commit)
    assert push(taker, rules.barge_in_ms - FRAME_MS, SPEECH) == []
    assert push(taker, 2000, QUIET) == []  # not transcribed, no turn, no cancel
    assert taker.answering
    taker.reply_done()
    assert not taker.answering


def test_the_streaming_transcript_is_requested_every_partial_ms_of_speech() -> None:
    taker = TurnTaker(TurnRules(partial_ms=500))
    actions = push(taker, 1600, SPEECH)
    partials = [a for a in actions if isinstance(a, Transcribe)]
    assert [a.final for a in partials] == [False, False, False]
    assert [len(a.audio) for a in partials] == sorted(len(a.audio) for a in partials)
    assert taker.transcribed(partials[0].request, "stale") == [] and taker.partial == ""
    assert taker.transcribed(partials[-1].request, "What is") == [] and taker.partial == "What is"


def test_no_backchannel_by_default() -> None:
    taker = TurnTaker()
    push(taker, 5000, SPEECH)
    _, actions = until(taker, QUIET, Transcribe)
    taker.partial = "So I was walking"
    assert Backchannel() not in taker.transcribed(final(actions).request, "So I was walking and")


def test_a_backchannel_at_a_mid_thought_pause_of_a_long_turn_at_most_once_per_interval() -> None:
    rules = TurnRules(backchannel=True, backchannel_after_ms=3000, backchannel_every_ms=8000)
    taker = TurnTaker(rules)

    def pause_with(text: str, speech_ms: int) -> list:
        actions = push(taker, speech_ms, SPEECH)
        partial = [a for a in actions if isinstance(a, Transcribe)]
        if partial:
            taker.transcribed(partial[-1].request, "So I was walking")
        _, actions = until(taker, QUIET, Transcribe)
        return taker.transcribed(final(actions).request, text)

    assert pause_with("So I was walking and", 1000) == []  # the turn is not long enough yet
    assert pause_with("So I was walking and then the", 3000) == [Backchannel()]
    assert pause_with("So I was walking and then the dog and", 2000) == []  # within the interval
    assert Backchannel() not in pause_with("So I was walking. It rained.", 7000)  # complete: no


def test_rules_are_checked() -> None:
    with pytest.raises(ValueError, match="pause_ms"):
        TurnRules(pause_ms=600, end_silence_ms=480)
    with pytest.raises(ValueError, match="vad_threshold"):
        TurnRules(vad_threshold=0.0)
    with pytest.raises(ValueError, match="barge_in_ms"):
        TurnRules(barge_in_ms=-1)
