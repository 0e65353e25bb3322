"""Model steps -> OpenAI response events, barge-in, the playback ledger and history, sans-I/O
(``realtime/protocols/duplex/turns.py``)."""

from __future__ import annotations

from realtime.protocols.duplex.events import PlaybackAcknowledged, ResponseListen, ResponseSpeak
from realtime.protocols.duplex.turns import UNKNOWN_RESPONSE, CommitPolicy, ModelStep, TurnPolicy, Turns
from realtime.protocols.oai_realtime import SessionConfig
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.errors import Rejected
from realtime.protocols.oai_realtime.responses import ResponseSettings

AUDIO = b"\x01\x00" * 4


def _turns(commit: CommitPolicy = "ack_only", max_history: int = 8, barge_in_frames: int = 2) -> Turns:
    policy = TurnPolicy(
        frame_ms=80,
        barge_in_rms=0.1,
        barge_in_frames=barge_in_frames,
        commit_policy=commit,
        max_history=max_history,
    )
    return Turns(policy, ResponseSettings.of_session(SessionConfig(model="m")), "conv_1")


def _speak(turns: Turns, steps: range, text: str = "w") -> list[ev.ServerEvent]:
    out: list[ev.ServerEvent] = []
    for step in steps:
        out += turns.step(ModelStep(step, True, f"{text}{step} " if step % 2 == 0 else "", AUDIO))
    return out


def _listen(turns: Turns, step: int) -> list[ev.ServerEvent]:
    return turns.step(ModelStep(step, False, "", b""))


def test_speaking_opens_a_response_in_openai_order_then_one_delta_per_frame() -> None:
    turns = _turns()
    assert _listen(turns, 0) == [], "listening with no response says nothing"
    events = _speak(turns, range(1, 4))
    assert [type(e) for e in events] == [
        ev.ResponseCreated,
        ev.OutputItemAdded,
        ev.ItemAdded,
        ev.ContentPartAdded,
        ResponseSpeak,
        ev.AudioDelta,  # step 1: no text piece
        ev.AudioDelta,  # step 2
        ev.TranscriptDelta,
        ev.AudioDelta,  # step 3
    ]
    speak = events[4]
    assert isinstance(speak, ResponseSpeak) and speak.step == 1
    assert speak.response_id == events[0].response.id == turns.active.response_id
    assert all(e.audio == AUDIO for e in events if isinstance(e, ev.AudioDelta))


def test_listening_closes_the_response_completed_with_its_transcript() -> None:
    turns = _turns()
    _speak(turns, range(0, 4))
    events = _listen(turns, 4)
    assert [type(e) for e in events] == [
        ev.AudioDone,
        ev.TranscriptDone,
        ev.ContentPartDone,
        ev.OutputItemDone,
        ev.ItemDone,
        ev.ResponseDone,
        ResponseListen,
    ]
    assert events[1].transcript == "w0 w2 "
    done = events[5].response
    assert done.status == "completed" and done.reason is None
    assert done.output[0].status == "completed"
    assert turns.active is None and events[6].step == 4
    again = _speak(turns, range(5, 6))
    assert isinstance(again[0], ev.ResponseCreated) and again[0].response.id != done.id, "ids never reused"


def test_barge_in_needs_loud_frames_in_a_row_while_the_model_speaks() -> None:
    turns = _turns(barge_in_frames=2)
    assert not turns.user_audio(0.5) and not turns.user_audio(0.5), "no response open: no barge-in"
    _speak(turns, range(0, 2))
    assert turns.user_audio(0.5), "the user still speaking as the model starts: the run counts"
    assert turns.loud_frames == 0, "a completed barge-in starts a new run"
    assert not turns.user_audio(0.01), "a quiet frame resets the run"
    assert not turns.user_audio(0.5)
    assert turns.user_audio(0.5)
    assert turns.input_ms == 6 * 80


def test_cancel_closes_the_response_and_mutes_the_model_until_it_listens() -> None:
    turns = _turns()
    _speak(turns, range(0, 3))
    events = turns.cancel("turn_detected", 3)
    done = next(e for e in events if isinstance(e, ev.ResponseDone)).response
    assert done.status == "cancelled" and done.reason == "turn_detected"
    assert done.output[0].status == "incomplete"
    assert isinstance(events[-1], ResponseListen)
    assert _speak(turns, range(3, 6)) == [], "muted: the model's speech is not a new response"
    assert turns.cancel("client_cancelled", 6) == [], "nothing open: a no-op"
    assert _listen(turns, 6) == [] and not turns.muted, "the model chose to listen: unmuted"
    assert isinstance(_speak(turns, range(7, 8))[0], ev.ResponseCreated)


def test_ack_commits_history_up_to_played_ms_monotonic_and_capped() -> None:
    turns = _turns()
    events = _speak(turns, range(0, 6))  # pieces at 0, 160, 320 ms; 480 ms generated
    response_id, item_id = events[0].response.id, turns.active.item_id
    _listen(turns, 6)
    assert turns.retrieve(item_id).content[0].transcript == "", "ack_only: nothing played yet"
    ack = turns.ack(response_id, 200)
    assert isinstance(ack, PlaybackAcknowledged)
    assert (ack.played_ms, ack.generated_ms, ack.committed_ms) == (200, 480, 200)
    assert ack.history_committed == "w0 w2 " and turns.retrieve(item_id).content[0].transcript == "w0 w2 "
    assert turns.ack(response_id, 100).played_ms == 200, "played_ms never goes back"
    capped = turns.ack(response_id, 10_000)
    assert capped.played_ms == capped.committed_ms == 480 and capped.history_committed == "w0 w2 w4 "


def test_commit_all_on_done_commits_a_finished_response_without_acks() -> None:
    turns = _turns(commit="commit_all_on_done")
    _speak(turns, range(0, 4))
    item_id = turns.active.item_id
    assert turns.retrieve(item_id).content[0].transcript == "", "not done yet: still what was played"
    _listen(turns, 4)
    item = turns.retrieve(item_id)
    assert item.content[0].transcript == "w0 w2 " and item.status == "completed"


def test_history_keeps_the_last_responses_and_unknown_ids_are_typed_errors() -> None:
    turns = _turns(max_history=2)
    ids = []
    for start in (0, 10, 20):
        ids.append(_speak(turns, range(start, start + 2))[0].response.id)
        _listen(turns, start + 2)
    forgotten = turns.ack(ids[0], 80)
    assert isinstance(forgotten, Rejected) and forgotten.code == UNKNOWN_RESPONSE
    assert isinstance(turns.ack(ids[2], 80), PlaybackAcknowledged)
    missing = turns.retrieve("item_nope")
    assert isinstance(missing, Rejected) and missing.code == "item_not_found"
