"""The voice kind's conversation: its items in order, bounded, and the prompt they make.

One :class:`Conversation` per connection, owned by the connection's runner (not thread-safe).
Items are the codec's (``realtime.protocols.oai_realtime.items``); each entry also records how many
milliseconds of assistant audio were generated for it (what ``conversation.item.truncate`` is
clamped to). Beyond ``max_items`` the oldest items are dropped, as OpenAI truncates a
conversation; the LLM's own context bound drops the oldest turns of the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from models.voice.llm import ChatMessage
from models.voice.tool_calls import format_tool_call
from realtime.protocols.oai_realtime.items import (
    FunctionCall,
    FunctionCallOutput,
    InputAudio,
    InputText,
    Item,
    Message,
    OutputAudio,
    OutputText,
)
from realtime.protocols.oai_realtime.responses import ItemReference


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


class Conversation:
    """A connection's items in conversation order, at most ``max_items`` (see the module docstring)."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._entries: dict[str, Entry] = {}  # in conversation order

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._entries

    def get(self, item_id: str) -> Entry | None:
        return self._entries.get(item_id)

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

    def prompt(
        self, instructions: str, selection: Sequence[Item | ItemReference] | None
    ) -> tuple[ChatMessage, ...]:
        """The LLM's messages: ``instructions`` as the system message, then the items as text
        (the whole conversation, or ``selection``: a response's ``input``; a reference to an item
        deleted meanwhile is skipped). A function call enters as the assistant's call markup
        (``format_tool_call``), its output as a ``tool`` turn."""
        if selection is None:
            items = [e.item for e in self._entries.values()]
        else:
            items = [
                self._entries[i.id].item if isinstance(i, ItemReference) else i
                for i in selection
                if not isinstance(i, ItemReference) or i.id in self._entries
            ]
        messages = [ChatMessage("system", instructions)]
        for item in items:
            if isinstance(item, FunctionCall):
                messages.append(ChatMessage("assistant", format_tool_call(item.name, item.arguments)))
            elif isinstance(item, FunctionCallOutput):
                messages.append(ChatMessage("tool", item.output))
            elif isinstance(item, Message) and (text := item_text(item)):
                messages.append(ChatMessage(item.role, text))  # type: ignore[arg-type]
        return tuple(messages)
