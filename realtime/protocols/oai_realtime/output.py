"""One response, sans-I/O: its lifecycle and the server events of its output as the model makes it.

:func:`refusal` checks a ``response.create`` against the conversation. :class:`ResponseOutput` is
a small state machine per response, h11 style (events out, nothing sent): :meth:`~.open`
announces the assistant message (unless a forced tool call makes the response only a function
call) and, in the conversation, adds it; :meth:`~.text_delta`, :meth:`~.audio` and the
``call_*`` methods render each piece the model makes (audio encoded in the response's output
format and cut into deltas of at most ``audio_delta_ms``, the first
``MAX_RETRIEVED_AUDIO_BYTES`` of it kept for ``conversation.item.retrieved``); :meth:`~.cancel`
records why it was cancelled (once); :meth:`~.finish` decides its status (cancelled, failed,
incomplete at the token cap, completed), writes the closing events (a call cut short is closed
``incomplete``), puts the message and the calls into the conversation, and ends with exactly one
``response.done``.

Ownership hands over once each way: the connection's runner opens it, the response's streaming
task renders the pieces, the runner closes it after that task ended. Only ``open`` and ``close``
touch the conversation.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import errors
from . import server_events as ev
from .audio import encode_audio
from .conversation import Conversation
from .errors import ParamError, Rejected
from .items import FunctionCall, Item, Message, OutputAudio, OutputText
from .responses import ItemReference, ResponseSettings
from .session_config import check_tool_choice
from .wire import new_id

#: ``rate_limits.updated`` after every response: this server does not rate-limit.
RATE_LIMITS = ev.RateLimitsUpdated(
    (ev.RateLimit("requests", 1_000_000, 1_000_000, 0.0), ev.RateLimit("tokens", 1_000_000, 1_000_000, 0.0))
)


def refusal(settings: ResponseSettings, conversation: Conversation) -> Rejected | None:
    """Why a ``response.create`` cannot start (an ``input`` reference to no item, a forced tool
    that is not offered), else None."""
    for i in settings.input or ():
        if isinstance(i, ItemReference) and i.id not in conversation:
            return errors.item_not_found(i.id, "response.input")
    try:
        check_tool_choice(settings.tools, settings.tool_choice, "response.tool_choice")
    except ParamError as exc:
        return exc.rejected
    return None


class ResponseOutput:
    """One response's lifecycle and output events (see the module docstring)."""

    def __init__(self, state: ev.ResponseState, audio_delta_ms: int) -> None:
        self.state = state
        self.started = False  # opened: its tick was requested
        self.cancel_reason: str | None = None
        self.settings = settings = state.settings
        self.in_conversation = settings.conversation != "none"
        fmt = settings.output_format
        self.delta_bytes = fmt.sample_rate * audio_delta_ms // 1000 * fmt.bytes_per_sample
        self.item_id = ""  # the assistant message ("": a forced tool call, no message)
        self.after_id: str | None = None  # the conversation item the response's output follows
        self.text_parts: list[str] = []
        self.kept = bytearray()  # the audio conversation.item.retrieved returns
        self.audio_bytes = 0
        self._calls: dict[int, FunctionCall] = {}
        self._call_previous: dict[int, str | None] = {}
        self._last: str | None = None

    @property
    def ref(self) -> ev.PartRef:
        return ev.PartRef(self.state.id, self.item_id)

    @property
    def audio_ms(self) -> int:
        fmt = self.settings.output_format
        return self.audio_bytes * 1000 // (fmt.sample_rate * fmt.bytes_per_sample)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def cancellable(self) -> bool:
        return self.cancel_reason is None

    def cancel(self, reason: str) -> list[ev.ServerEvent]:
        """Record the cancel (``client_cancelled``, ``turn_detected``). Not started yet: nothing
        was announced, so its ``response.done`` comes now; else the caller stops the model and
        :meth:`finish` closes it."""
        self.cancel_reason = reason
        if self.started:
            return []
        return [ev.ResponseDone(replace(self.state, status="cancelled", reason=reason))]

    def open(self, conversation: Conversation, *, message: bool) -> list[ev.ServerEvent]:
        """The opening events: the assistant message and its content part (``message``)."""
        self.started = True
        self.after_id = self._last = conversation.last_id() if self.in_conversation else None
        if not message:
            return []
        self.item_id = new_id("item")
        opening = Message(self.item_id, "assistant", (), "in_progress")
        events: list[ev.ServerEvent] = [ev.OutputItemAdded(self.state.id, 0, opening)]
        if self.in_conversation:
            events.append(ev.ItemAdded(opening, conversation.insert(opening, None)))
            self.after_id = self._last = self.item_id
        part = OutputAudio("") if self.settings.audio_output else OutputText("")
        events.append(ev.ContentPartAdded(self.ref, part))
        return events

    # -- the pieces, as the model makes them ----------------------------------------------
    def text_delta(self, piece: str) -> list[ev.ServerEvent]:
        self.text_parts.append(piece)
        audio = self.settings.audio_output
        return [ev.TranscriptDelta(self.ref, piece) if audio else ev.TextDelta(self.ref, piece)]

    def audio(self, samples: np.ndarray) -> list[ev.ServerEvent]:
        data = encode_audio(samples, self.settings.output_format)
        self.audio_bytes += len(data)
        self.kept += data[: max(ev.MAX_RETRIEVED_AUDIO_BYTES - len(self.kept), 0)]
        step = self.delta_bytes
        fmt = self.settings.output_format
        return [ev.AudioDelta(self.ref, data[i : i + step], fmt) for i in range(0, len(data), step)]

    def call_started(self, index: int, name: str) -> list[ev.ServerEvent]:
        call = FunctionCall(new_id("item"), new_id("call"), name, "", "in_progress")
        self._calls[index], self._call_previous[index] = call, self._last
        events: list[ev.ServerEvent] = [ev.OutputItemAdded(self.state.id, self._index(index), call)]
        if self.in_conversation:
            events.append(ev.ItemAdded(call, self._last))
            self._last = call.id
        return events

    def call_arguments(self, index: int, delta: str) -> list[ev.ServerEvent]:
        call = self._calls[index]
        return [ev.FunctionArgumentsDelta(self.state.id, call.id, self._index(index), call.call_id, delta)]

    def call_done(self, index: int, arguments: str) -> list[ev.ServerEvent]:
        call = self._calls[index] = replace(self._calls[index], arguments=arguments, status="completed")
        rid, at = self.state.id, self._index(index)
        events: list[ev.ServerEvent] = [
            ev.FunctionArgumentsDone(rid, call.id, at, call.call_id, call.name, call.arguments),
            ev.OutputItemDone(rid, at, call),
        ]
        if self.in_conversation:
            events.append(ev.ItemDone(call, self._call_previous[index]))
        return events

    def _index(self, call_index: int) -> int:
        return call_index + (1 if self.item_id else 0)  # the assistant message, when there is one, is 0

    # -- the end ----------------------------------------------------------------------------
    def finish(
        self,
        conversation: Conversation,
        *,
        failure: str | None,
        usage: ev.Usage | None,
        max_output_tokens: int,
    ) -> list[ev.ServerEvent]:
        """The closing events, ``response.done`` and ``rate_limits.updated``; the output enters
        the conversation. Status: ``cancelled`` after :meth:`cancel`, ``failed`` with the model's
        ``failure`` code, ``incomplete`` when ``usage`` reached ``max_output_tokens``, else
        ``completed``."""
        status, reason, error = "completed", None, None
        if self.cancel_reason is not None:
            status, reason = "cancelled", self.cancel_reason
        elif failure is not None:
            status, error = "failed", errors.response_failed(failure)
        elif usage is not None and usage.output_text_tokens >= max_output_tokens:
            status, reason = "incomplete", "max_output_tokens"
        self.state = replace(self.state, status=status)
        closing: list[ev.ServerEvent] = []
        output: list[Item] = [self._close_message(conversation, status, closing)] if self.item_id else []
        output += self._close_calls(conversation, closing)
        state = replace(
            self.state, status=status, reason=reason, error=error, output=tuple(output), usage=usage
        )
        return [*closing, ev.ResponseDone(state), RATE_LIMITS]

    def _close_message(
        self, conversation: Conversation, status: str, closing: list[ev.ServerEvent]
    ) -> Message:
        audio, text, ref = self.settings.audio_output, self.text, self.ref
        part: OutputAudio | OutputText = (
            OutputAudio(text, bytes(self.kept) or None) if audio else OutputText(text)
        )
        final = Message(
            self.item_id, "assistant", (part,), "completed" if status == "completed" else "incomplete"
        )
        previous = conversation.previous_of(self.item_id) if self.in_conversation else None
        entry = conversation.get(self.item_id)
        if entry is not None:
            entry.item, entry.audio_ms = final, self.audio_ms
        closing += [ev.AudioDone(ref), ev.TranscriptDone(ref, text)] if audio else [ev.TextDone(ref, text)]
        closing += [
            ev.ContentPartDone(ref, OutputAudio(text) if audio else part),
            ev.OutputItemDone(self.state.id, 0, final),
        ]
        if self.in_conversation:
            closing.append(ev.ItemDone(final, previous))
        return final

    def _close_calls(self, conversation: Conversation, closing: list[ev.ServerEvent]) -> list[FunctionCall]:
        """The calls enter the conversation after the message (or after the item the response
        followed); a call cut short (cancel, token cap) is closed incomplete."""
        previous = self.after_id if self.after_id in conversation else None
        out = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if call.status == "in_progress":
                call = replace(call, status="incomplete")
                closing.append(ev.OutputItemDone(self.state.id, self._index(index), call))
                if self.in_conversation:
                    closing.append(ev.ItemDone(call, previous))
            if self.in_conversation:
                conversation.insert(call, previous)
                previous = call.id
            out.append(call)
        return out
