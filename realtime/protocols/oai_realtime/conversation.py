"""One connection's conversation, sans-I/O: its items in order, bounded, and the answers to the
client's item events (``conversation.item.create`` / ``delete`` / ``retrieve`` / ``truncate``).

Items are :mod:`.items`'; each entry also records how many milliseconds of assistant audio were
generated for it (what ``conversation.item.truncate`` is clamped to). Beyond ``max_items`` the
oldest items are dropped, as OpenAI truncates a conversation. Each answer is the server event to
send, or the :class:`~.errors.Rejected` to send as an error (the caller adds the ``event_id``).
Owned by the connection's runner (not thread-safe).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import errors
from . import server_events as ev
from .errors import Rejected
from .items import InputAudio, InputText, Item, Message, OutputAudio, OutputText
from .session_config import AudioFormat


@dataclass
class Entry:
    """A conversation item and, for assistant audio, how many ms of it were generated."""

    item: Item
    audio_ms: int = 0


def item_text(item: Item) -> str:
    """What an item says as text: its text parts and the transcripts of its audio parts."""
    if not isinstance(item, Message):
        return ""
    texts = []
    for part in item.content:
        if isinstance(part, InputText | OutputText):
            texts.append(part.text)
        elif isinstance(part, InputAudio | OutputAudio):
            texts.append(part.transcript or "")
    return " ".join(t for t in texts if t).strip()


def untranscribed_audio(item: Item) -> bytes:
    """The client's audio of ``item`` that came without a transcript (the ASR must make one)."""
    content = item.content if isinstance(item, Message) else ()
    return b"".join(
        p.audio for p in content if isinstance(p, InputAudio) and p.audio and p.transcript is None
    )


def _too_big(part: object) -> bool:
    """Audio that ``conversation.item.retrieved`` would leave out anyway."""
    return isinstance(part, InputAudio) and len(part.audio or b"") > ev.MAX_RETRIEVED_AUDIO_BYTES


class Conversation:
    """A connection's items in conversation order, at most ``max_items`` (see the module docstring)."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._entries: dict[str, Entry] = {}  # in conversation order

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._entries

    def get(self, item_id: str) -> Entry | None:
        return self._entries.get(item_id)

    def items(self) -> list[Item]:
        return [e.item for e in self._entries.values()]

    def delete(self, item_id: str) -> bool:
        return self._entries.pop(item_id, None) is not None

    def insert(self, item: Item, previous_item_id: str | None) -> str | None:
        """Insert after ``previous_item_id`` (``"root"``: first; ``None``: last; it must exist
        otherwise); returns the id of the item now before it."""
        entries = list(self._entries.items())
        if previous_item_id is None:
            index = len(entries)
        elif previous_item_id == "root":
            index = 0
        else:
            index = next(i for i, (k, _) in enumerate(entries) if k == previous_item_id) + 1
        entries.insert(index, (item.id, Entry(item)))
        del entries[: max(0, len(entries) - self.max_items)]
        self._entries = dict(entries)
        return self.previous_of(item.id)

    def snapshot(self) -> tuple[tuple[Item, int], ...]:
        """Every item with its generated audio ms, in order (what :meth:`restore` takes)."""
        return tuple((e.item, e.audio_ms) for e in self._entries.values())

    def restore(self, entries: tuple[tuple[Item, int], ...]) -> None:
        """Continue a conversation :meth:`snapshot` took (the newest ``max_items`` of it)."""
        kept = entries[max(0, len(entries) - self.max_items) :]
        self._entries = {item.id: Entry(item, audio_ms) for item, audio_ms in kept}

    def last_id(self) -> str | None:
        """The id of the last item (``None`` when empty)."""
        return next(reversed(self._entries), None)

    def previous_of(self, item_id: str) -> str | None:
        previous = None
        for key in self._entries:
            if key == item_id:
                return previous
            previous = key
        return None

    # -- committed user audio -------------------------------------------------------------
    def commit_audio(self, item_id: str) -> list[ev.ServerEvent]:
        """``input_audio_buffer.committed``: the utterance is a user item (its transcript follows)."""
        user = Message(item_id, "user", (InputAudio(None, None),))
        previous = self.insert(user, None)
        return [
            ev.AudioCommitted(item_id, previous),
            ev.ItemAdded(user, previous),
            ev.ItemDone(user, previous),
        ]

    def transcribed(
        self, item_id: str, text: str | None, audio_seconds: float, *, announce: bool
    ) -> list[ev.ServerEvent]:
        """The ASR's transcript of a user item's audio (``None``: it failed, the item says
        nothing); with ``announce`` (transcription on) its completed or failed event."""
        entry = self._entries.get(item_id)
        if entry is not None and isinstance(entry.item, Message):
            parts = tuple(
                replace(p, transcript=text or "") if isinstance(p, InputAudio) else p
                for p in entry.item.content
            )
            entry.item = replace(entry.item, content=parts)
        if not announce:
            return []
        if text is None:
            return [ev.TranscriptionFailed(item_id, 0, errors.transcription_failed())]
        return [ev.TranscriptionCompleted(item_id, 0, text, ev.DurationUsage(round(audio_seconds, 3)))]

    # -- the client's item events ---------------------------------------------------------
    def create(self, item: Item, previous_item_id: str | None) -> list[ev.ServerEvent] | Rejected:
        """``conversation.item.create``; audio too big to ever be retrieved is not kept (the
        conversation's memory stays bounded)."""
        if item.id in self._entries:
            return errors.item_id_in_use(item.id)
        if previous_item_id not in (None, "root") and previous_item_id not in self._entries:
            return errors.item_not_found(previous_item_id, "previous_item_id")
        if isinstance(item, Message) and any(_too_big(p) for p in item.content):
            content = tuple(replace(p, audio=None) if _too_big(p) else p for p in item.content)
            item = replace(item, content=content)
        previous = self.insert(item, previous_item_id)
        return [ev.ItemAdded(item, previous), ev.ItemDone(item, previous)]

    def remove(self, item_id: str) -> ev.ServerEvent | Rejected:
        """``conversation.item.delete``."""
        return ev.ItemDeleted(item_id) if self.delete(item_id) else errors.item_not_found(item_id)

    def retrieve(self, item_id: str) -> ev.ServerEvent | Rejected:
        """``conversation.item.retrieve``."""
        entry = self._entries.get(item_id)
        return errors.item_not_found(item_id) if entry is None else ev.ItemRetrieved(entry.item)

    def truncate(
        self, item_id: str, content_index: int, audio_end_ms: int, fmt: AudioFormat
    ) -> ev.ServerEvent | Rejected:
        """``conversation.item.truncate``: an assistant audio part cut at ``audio_end_ms`` (at most
        what was generated). OpenAI drops the transcript too: the model must not "remember" words
        the user never heard."""
        entry = self._entries.get(item_id)
        if entry is None:
            return errors.item_not_found(item_id)
        message = entry.item
        if (
            not isinstance(message, Message)
            or message.role != "assistant"
            or content_index >= len(message.content)
            or not isinstance(message.content[content_index], OutputAudio)
        ):
            return errors.truncate_not_assistant_audio()
        if audio_end_ms > entry.audio_ms:
            return errors.truncate_beyond_audio(entry.audio_ms, audio_end_ms)
        part = message.content[content_index]
        assert isinstance(part, OutputAudio)
        kept = (
            None
            if part.audio is None
            else part.audio[: fmt.sample_rate * fmt.bytes_per_sample * audio_end_ms // 1000]
        )
        content = list(message.content)
        content[content_index] = OutputAudio("", kept)
        entry.item, entry.audio_ms = replace(message, content=tuple(content)), audio_end_ms
        return ev.ItemTruncated(item_id, content_index, audio_end_ms)
