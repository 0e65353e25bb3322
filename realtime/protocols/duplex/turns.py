"""Model steps -> OpenAI response events; barge-in detection; the playback ledger and history.

A sans-I/O state machine per session (:class:`Turns`), fed one model step at a time:

- **Speak / listen.** The model decides every 80 ms frame. A listen -> speak transition opens a
  response in OpenAI's order (``response.created``, ``response.output_item.added``,
  ``conversation.item.added``, ``response.content_part.added``) then ``response.speak``; every
  speaking frame is one ``response.output_audio.delta`` (80 ms) and, when the model produced a
  text piece, one ``response.output_audio_transcript.delta``; speak -> listen closes it (the
  ``*.done`` events, ``response.done`` status ``completed``) then ``response.listen``.
- **Barge-in.** :meth:`Turns.user_audio` sees every input frame the client sent; speech (RMS at
  least ``barge_in_rms``) for ``barge_in_frames`` frames in a row while a response is open
  answers True: the caller bumps the epoch and calls :meth:`Turns.cancel`, which closes the
  response with status ``cancelled`` (reason ``turn_detected``; ``client_cancelled`` for
  ``response.cancel``). The model's audio then stays muted until the model itself chooses to
  listen: a new response needs a fresh listen -> speak decision.
- **Playback ledger and history.** Each response records ``generated_ms`` (80 ms per speaking
  frame) and the ms at which each text piece came. ``playback.ack {response_id, played_ms}``
  raises ``played_ms`` (monotonic, capped at ``generated_ms``). History (what
  ``conversation.item.retrieve`` returns) holds each response's transcript only up to its
  committed ms: under ``ack_only`` that is ``played_ms``; under ``commit_all_on_done`` a finished
  response commits all it generated. The model's own context is not rewound (it heard itself).
  History keeps the last ``max_history`` responses.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Literal

from realtime.protocols.oai_realtime import errors
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.errors import Rejected
from realtime.protocols.oai_realtime.items import Message, OutputAudio
from realtime.protocols.oai_realtime.responses import ResponseSettings
from realtime.protocols.oai_realtime.wire import new_id

from .events import PlaybackAcknowledged, ResponseListen, ResponseSpeak

CommitPolicy = Literal["ack_only", "commit_all_on_done"]
UNKNOWN_RESPONSE = "unknown_response"


@dataclass(frozen=True)
class TurnPolicy:
    frame_ms: int
    barge_in_rms: float
    barge_in_frames: int
    commit_policy: CommitPolicy
    max_history: int


@dataclass(frozen=True)
class ModelStep:
    """What the protocol needs of one model step: ``audio`` already in the output format."""

    step: int
    speaking: bool
    text: str
    audio: bytes


@dataclass(eq=False)
class Spoken:
    """One response's ledger."""

    response_id: str
    item_id: str
    marks: list[tuple[int, str]] = field(default_factory=list)  # (ms into the response, text piece)
    generated_ms: int = 0
    played_ms: int = 0
    done: bool = False
    status: str = "in_progress"

    @property
    def transcript(self) -> str:
        return "".join(text for _, text in self.marks)

    def committed_ms(self, policy: CommitPolicy) -> int:
        if policy == "commit_all_on_done" and self.done:
            return self.generated_ms
        return self.played_ms

    def transcript_until(self, ms: int) -> str:
        return "".join(text for at, text in self.marks if at < ms)


class Turns:
    def __init__(self, policy: TurnPolicy, settings: ResponseSettings, conversation_id: str) -> None:
        self.policy = policy
        self.settings = settings
        self.conversation_id = conversation_id
        self.active: Spoken | None = None
        self.muted = False  # after a cancel, until the model chooses to listen
        self.loud_frames = 0
        self.input_ms = 0  # client audio seen so far
        self._history: collections.OrderedDict[str, Spoken] = collections.OrderedDict()  # by response id

    # -- model steps ------------------------------------------------------------------------
    def step(self, out: ModelStep) -> list[ev.ServerEvent]:
        if not out.speaking:
            self.muted = False
            return self._close("completed", None, out.step) if self.active is not None else []
        if self.muted:
            return []
        events: list[ev.ServerEvent] = []
        if self.active is None:
            events += self._open(out.step)
        spoken = self.active
        assert spoken is not None
        ref = ev.PartRef(spoken.response_id, spoken.item_id)
        if out.text:
            spoken.marks.append((spoken.generated_ms, out.text))
        spoken.generated_ms += self.policy.frame_ms
        events.append(ev.AudioDelta(ref, out.audio))
        if out.text:
            events.append(ev.TranscriptDelta(ref, out.text))
        return events

    def _open(self, step: int) -> list[ev.ServerEvent]:
        spoken = self.active = Spoken(new_id("resp"), new_id("item"))
        self._remember(spoken)
        item = Message(spoken.item_id, "assistant", (OutputAudio(""),), "in_progress")
        ref = ev.PartRef(spoken.response_id, spoken.item_id)
        return [
            ev.ResponseCreated(self._state(spoken)),
            ev.OutputItemAdded(spoken.response_id, 0, item),
            ev.ItemAdded(item),
            ev.ContentPartAdded(ref, OutputAudio("")),
            ResponseSpeak(spoken.response_id, step),
        ]

    def cancel(self, reason: str, step: int) -> list[ev.ServerEvent]:
        """Close the open response as cancelled and mute the model until it listens (no-op if none)."""
        if self.active is None:
            return []
        self.muted = True
        return self._close("cancelled", reason, step)

    def _close(self, status: str, reason: str | None, step: int) -> list[ev.ServerEvent]:
        spoken = self.active
        assert spoken is not None
        self.active = None
        spoken.done, spoken.status = True, status
        transcript = spoken.transcript
        ref = ev.PartRef(spoken.response_id, spoken.item_id)
        item_status = "completed" if status == "completed" else "incomplete"
        item = Message(spoken.item_id, "assistant", (OutputAudio(transcript),), item_status)
        return [
            ev.AudioDone(ref),
            ev.TranscriptDone(ref, transcript),
            ev.ContentPartDone(ref, OutputAudio(transcript)),
            ev.OutputItemDone(spoken.response_id, 0, item),
            ev.ItemDone(item),
            ev.ResponseDone(self._state(spoken, status, reason, (item,))),
            ResponseListen(spoken.response_id, step),
        ]

    def _state(
        self, spoken: Spoken, status: str = "in_progress", reason: str | None = None, output: tuple = ()
    ) -> ev.ResponseState:
        return ev.ResponseState(
            spoken.response_id,
            self.settings,
            status,
            reason,
            output=output,
            conversation_id=self.conversation_id,
        )

    # -- user audio -------------------------------------------------------------------------
    def user_audio(self, rms: float) -> bool:
        """One client input frame: True when it completes a barge-in (see the module docstring)."""
        self.input_ms += self.policy.frame_ms
        self.loud_frames = self.loud_frames + 1 if rms >= self.policy.barge_in_rms else 0
        if self.active is not None and self.loud_frames >= self.policy.barge_in_frames:
            self.loud_frames = 0
            return True
        return False

    # -- playback and history ---------------------------------------------------------------
    def ack(self, response_id: str, played_ms: int) -> PlaybackAcknowledged | Rejected:
        spoken = self._history.get(response_id)
        if spoken is None:
            return Rejected(
                UNKNOWN_RESPONSE, f"No response '{response_id}' in this session's history.", "response_id"
            )
        spoken.played_ms = max(spoken.played_ms, min(played_ms, spoken.generated_ms))
        committed = spoken.committed_ms(self.policy.commit_policy)
        return PlaybackAcknowledged(
            response_id, spoken.played_ms, spoken.generated_ms, committed, spoken.transcript_until(committed)
        )

    def retrieve(self, item_id: str) -> Message | Rejected:
        """The history's item: the transcript as committed (no audio kept)."""
        for spoken in self._history.values():
            if spoken.item_id == item_id:
                committed = spoken.committed_ms(self.policy.commit_policy)
                status = "in_progress" if not spoken.done else "completed"
                return Message(
                    item_id, "assistant", (OutputAudio(spoken.transcript_until(committed)),), status
                )
        return errors.item_not_found(item_id)

    def _remember(self, spoken: Spoken) -> None:
        self._history[spoken.response_id] = spoken
        while len(self._history) > self.policy.max_history:
            self._history.popitem(last=False)
