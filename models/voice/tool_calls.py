"""Function tools for the chat LLMs: Hermes-style tool-call markup in, typed call events out (pure).

Small open chat models (SmolLM2, Qwen2.5, Hermes) call a tool by writing::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

in their reply. :class:`ToolCallExtractor` takes the reply as it streams (detokenized pieces, cut
anywhere, even inside ``<tool_call>``) and splits it into **speakable text** and **call events**
(:class:`CallStarted`, :class:`CallArguments` deltas, :class:`CallDone`), so markup is never
spoken nor put in a transcript. Text that might be the start of ``<tool_call>`` is held back until
the next piece decides it (at most ``len("<tool_call>") - 1`` characters).

A call streams: once ``{"name": "...", "arguments":`` is complete, :class:`CallStarted` names the
tool and the arguments value streams as :class:`CallArguments` deltas as it is generated; the
value ends where its JSON brackets balance (:class:`CallDone`), and the rest of the block up to
``</tool_call>`` is dropped. A block in another key order is parsed whole at ``</tool_call>``; a
block that is not a JSON object naming a tool is dropped (nothing spoken). A call still open when
the reply ends (a token cap) is done with the arguments generated so far.

Forcing a call (``tool_choice`` ``"required"`` or a named function): the model's prompt ends with
:data:`FORCED_PREFIX`, the tool's name is chosen by constrained decoding among
:func:`forced_choices`, and the arguments it generates are made to conform to the tool's schema by
:func:`conform_arguments` (see there for exactly what is guaranteed).

Also here: :func:`tools_system_prompt` (the tool list for chat templates that have no ``tools``
support), :func:`format_tool_call` and :func:`format_tool_result` (how earlier calls and their
outputs are written back into the prompt).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FORCED_PREFIX = OPEN + '\n{"name": "'  # the prompt ends here when a call is forced
_ARGUMENTS_KEY = '", "arguments": '
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call; ``parameters`` is its JSON schema (``None``: no arguments)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None

    def template_entry(self) -> dict[str, Any]:
        """The OpenAI chat-completions shape that chat templates' ``tools=`` expects."""
        parameters = dict(self.parameters) if self.parameters is not None else {"type": "object"}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }


@dataclass(frozen=True, slots=True)
class CallStarted:
    index: int  # 0, 1, ... in the order the reply makes its calls
    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    index: int
    delta: str


@dataclass(frozen=True, slots=True)
class CallDone:
    index: int
    name: str
    arguments: str  # the JSON text of the arguments


ToolEvent = CallStarted | CallArguments | CallDone


class _ValueScanner:
    """Finds where one JSON value ends in streamed text (brackets balanced, strings closed)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False

    def feed(self, text: str) -> int | None:
        """The index in ``text`` just past the value's end, or ``None`` when it goes on."""
        for i, ch in enumerate(text):
            if not self.started:
                if ch.isspace():
                    continue
                self.started = True
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    return i + 1
            elif self.depth == 0 and (ch in ",}" or ch.isspace()):  # a bare scalar ended
                return i
        return None


class ToolCallExtractor:
    """One reply's text in, speakable text and :data:`ToolEvent` s out (see the module docstring).

    Not thread-safe: one reply, one caller. ``push`` and ``finish`` return ``(text, events)``.
    """

    def __init__(self) -> None:
        self._state = "text"  # text | head | args | tail
        self._buffer = ""  # text not yet decided (a possible OPEN prefix, a call's head)
        self._index = 0
        self._name = ""
        self._arguments: list[str] = []
        self._scanner = _ValueScanner()

    def push(self, piece: str) -> tuple[str, list[ToolEvent]]:
        self._buffer += piece
        spoken: list[str] = []
        events: list[ToolEvent] = []
        while self._step(spoken, events):
            pass
        return "".join(spoken), events

    def finish(self) -> tuple[str, list[ToolEvent]]:
        """The end of the reply: held-back text is spoken, an open call is done as it stands."""
        text, events = self.push("")
        if self._state == "text":
            text, self._buffer = text + self._buffer, ""
        elif self._state == "args":
            events.append(self._done())
        self._state, self._buffer = "text", ""
        return text, events

    def _step(self, spoken: list[str], events: list[ToolEvent]) -> bool:
        """Advance the state machine once; False when it needs more text."""
        if self._state == "text":
            at = self._buffer.find(OPEN)
            if at < 0:
                keep = _partial_suffix(self._buffer, OPEN)
                spoken.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return False
            spoken.append(self._buffer[:at])
            self._buffer, self._state = self._buffer[at + len(OPEN) :], "head"
            return True
        if self._state == "head":
            head = _HEAD.match(self._buffer)
            if head is not None:
                self._name = _unescape(head.group(1))
                self._buffer, self._state = self._buffer[head.end() :], "args"
                self._arguments, self._scanner = [], _ValueScanner()
                events.append(CallStarted(self._index, self._name))
                return True
            end = self._buffer.find(CLOSE)
            if end < 0:
                return False
            events.extend(self._whole_block(self._buffer[:end]))
            self._buffer, self._state = self._buffer[end + len(CLOSE) :], "text"
            return True
        if self._state == "args":
            if not self._arguments:
                self._buffer = self._buffer.lstrip()
            end = self._scanner.feed(self._buffer)
            delta = self._buffer if end is None else self._buffer[:end]
            if delta:
                self._arguments.append(delta)
                events.append(CallArguments(self._index, delta))
            if end is None:
                self._buffer = ""
                return False
            self._buffer, self._state = self._buffer[end:], "tail"
            events.append(self._done())
            return True
        end = self._buffer.find(CLOSE)  # tail: the rest of the block is not the model's to say
        if end < 0:
            self._buffer = self._buffer[-(len(CLOSE) - 1) :]
            return False
        self._buffer, self._state = self._buffer[end + len(CLOSE) :], "text"
        return True

    def _done(self) -> CallDone:
        arguments = "".join(self._arguments).strip()
        with_string = _json_or_none(arguments)
        if isinstance(with_string, str):  # some models write the arguments as a JSON string
            arguments = with_string
        done = CallDone(self._index, self._name, arguments)
        self._index += 1
        return done

    def _whole_block(self, block: str) -> list[ToolEvent]:
        call = _json_or_none(block.strip())
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return []  # not a call: dropped, never spoken
        arguments = call.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        index = self._index
        self._index += 1
        return [
            CallStarted(index, call["name"]),
            CallArguments(index, text),
            CallDone(index, call["name"], text),
        ]


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _unescape(json_string_body: str) -> str:
    value = _json_or_none(f'"{json_string_body}"')
    return value if isinstance(value, str) else json_string_body


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


# ------------------------------------------------------------------------------ forced calls


def forced_choices(tools: Sequence[ToolSpec]) -> tuple[str, ...]:
    """What the generation after :data:`FORCED_PREFIX` must start with, one string per tool: its
    name, the end of the head, the arguments object's opening brace and, when the schema declares
    properties, the first one's key (its first required one) and the opening quote of a string
    value. Starting the value steers a small model into filling it rather than writing a schema."""
    out = []
    for tool in tools:
        opening = tool.name + _ARGUMENTS_KEY + "{"
        properties = (tool.parameters or {}).get("properties")
        if isinstance(properties, Mapping) and properties:
            required = [k for k in (tool.parameters or {}).get("required") or () if k in properties]
            key = required[0] if required else next(iter(properties))
            quote = (
                '"'
                if _types(properties[key] if isinstance(properties[key], Mapping) else {}) == ["string"]
                else ""
            )
            opening += json.dumps(key, ensure_ascii=False) + ": " + quote
        out.append(opening)
    return tuple(out)


def close_json(text: str) -> str:
    """``text`` (a JSON object cut short) completed: an open string closed, a dangling key, colon
    or comma dropped, open brackets closed. Text that is not cut short comes back unchanged."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    out = text
    if in_string:
        out = (out[:-1] if escaped else out) + '"'
    if not stack:
        return out
    out = re.sub(r"\s*:\s*$", "", out.rstrip())  # "key": with no value yet: the key goes below
    key = re.search(r'"(?:[^"\\]|\\.)*"$', out)
    if stack[-1] == "}" and key is not None:
        before = out[: key.start()].rstrip()
        if before.endswith(("{", ",")):  # a key, not a value: drop it
            out = before
    out = re.sub(r",\s*$", "", out)
    return out + "".join(reversed(stack))


def conform_arguments(text: str, schema: Mapping[str, Any] | None) -> str:
    """The arguments of a forced call as a JSON object that validates against ``schema``.

    Guarantee: the result parses (``json.loads``) to an object, and it validates against
    ``schema`` when the schema uses only ``type`` (one type or a list), ``properties``,
    ``required``, ``additionalProperties: false``, ``items``, ``enum``, ``const`` and ``default``
    (nested to any depth). The model's values are kept wherever they already fit; text cut short
    is completed (:func:`close_json`); a value of the wrong type is converted when that is exact
    (``"3"`` -> 3, 3 -> ``"3"``, ``"true"`` -> true) and replaced by the schema's ``default``,
    first ``enum`` value or the type's zero (``""``, 0, false, ``[]``, ``{}``) otherwise; missing
    required properties are filled the same way; properties an object schema does not declare
    are dropped (a small model adds made-up ones). Not enforced: string formats and patterns,
    lengths, numeric ranges, ``oneOf``/``anyOf``/``allOf`` and ``$ref``.
    """
    value = _json_or_none(text)
    if value is None:
        value = _json_or_none(close_json(text))
    conformed = _conform(value if isinstance(value, dict) else {}, schema or {"type": "object"})
    if not isinstance(conformed, dict):
        conformed = {}
    return json.dumps(conformed, ensure_ascii=False)


def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    if "properties" in schema:
        return ["object"]
    return []


def _conform(value: Any, schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return value
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return value if value in schema["enum"] else _zero(schema)
    kinds = _types(schema)
    if not kinds:
        return value
    for kind in kinds:
        converted = _as_type(value, kind, schema)
        if converted is not _NO:
            return converted
    return _zero(schema)


_NO = object()


def _as_type(value: Any, kind: str, schema: Mapping[str, Any]) -> Any:
    if kind == "object":
        if not isinstance(value, dict):
            return _NO
        properties = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        out = {}
        for key, item in value.items():
            if key in properties:
                out[key] = _conform(item, properties[key])
            elif not properties and schema.get("additionalProperties") is not False:
                out[key] = item
        for key in schema.get("required") or ():
            if isinstance(key, str) and key not in out:
                out[key] = _zero(properties.get(key, {}))
        return out
    if kind == "array":
        return [_conform(v, schema.get("items")) for v in value] if isinstance(value, list) else _NO
    if kind == "string":
        if isinstance(value, str):
            return value
        return json.dumps(value) if isinstance(value, int | float) and not isinstance(value, bool) else _NO
    if kind in ("integer", "number"):
        if isinstance(value, str):
            value = _json_or_none(value.strip())
        if isinstance(value, bool) or not isinstance(value, int | float):
            return _NO
        if kind == "integer":
            return int(value) if float(value).is_integer() else _NO
        return value
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        return {"true": True, "false": False}.get(value, _NO) if isinstance(value, str) else _NO
    if kind == "null":
        return None if value is None else _NO
    return _NO


def _zero(schema: Any) -> Any:
    """The value a schema's property gets when the model gave none that fits."""
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kinds = _types(schema)
    if "default" in schema and (not kinds or _as_type(schema["default"], kinds[0], schema) is not _NO):
        return schema["default"]
    zeros = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "null": None}
    if not kinds:
        return None
    if kinds[0] == "object":
        return _as_type({}, "object", schema)
    return zeros.get(kinds[0])


# --------------------------------------------------------------------------- prompt rendering


def tools_system_prompt(tools: Sequence[ToolSpec]) -> str:
    """The tool list and calling convention (Hermes style) for templates without ``tools=``."""
    listing = "\n".join(json.dumps(t.template_entry(), ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to assist with the user query. "
        "The functions are listed within <tools></tools>:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call a function, reply with a JSON object with the function name and arguments "
        "within <tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def format_tool_call(name: str, arguments: str) -> str:
    """An earlier call as the model would have written it (the assistant's turn in the prompt)."""
    parsed = _json_or_none(arguments)
    body = json.dumps(parsed, ensure_ascii=False) if parsed is not None else json.dumps(arguments)
    return f'{OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {body}}}\n{CLOSE}'


def format_tool_result(output: str) -> str:
    """A tool's output for templates without a ``tool`` role (written as a user turn)."""
    return f"<tool_response>\n{output}\n</tool_response>"
