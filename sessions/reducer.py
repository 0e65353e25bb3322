"""The per-session control reducer protocol supplied by model adapters.

Contract (vllm-omni seed reference §2.6): at each tick boundary the session calls
``prepare(current_controls=..., events=..., chunk_index=...)`` with the sticky controls (by
track) and the pending events sorted by ``event_id``. ``prepare`` is speculative: it must not
change reducer state that survives a failed tick. After the executor's result is verified the
session calls ``commit(prepared)``; reducer commit and the session's own commit form one logical
commit (a raising ``commit`` fails the session closed). ``reset()`` runs on session reset.

``PreparedControls.controls`` becomes the snapshot's controls and the next sticky controls; one
control per track, which the session sorts by track name. ``state`` is free for the reducer
(for example a script's consumption cursor applied on commit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sessions.events import ControlInput, SessionEvent


@dataclass(frozen=True)
class PreparedControls:
    controls: tuple[ControlInput, ...]
    state: Any = None


class ControlReducer(Protocol):
    def prepare(
        self,
        *,
        current_controls: Mapping[str, ControlInput],
        events: tuple[SessionEvent, ...],
        chunk_index: int,
    ) -> PreparedControls: ...

    def commit(self, prepared: PreparedControls) -> None: ...

    def reset(self) -> None: ...


class LatestWinsReducer:
    """The default: each track keeps the control of the newest event that set it (sticky)."""

    def prepare(
        self,
        *,
        current_controls: Mapping[str, ControlInput],
        events: tuple[SessionEvent, ...],
        chunk_index: int,
    ) -> PreparedControls:
        merged = dict(current_controls)
        for event in events:
            for control in event.controls:
                merged[control.track] = control
        return PreparedControls(tuple(merged.values()))

    def commit(self, prepared: PreparedControls) -> None:
        return None

    def reset(self) -> None:
        return None
