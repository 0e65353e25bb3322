"""What every checkpoint reader shares: the one-line error that names the file, and JSON files.

The config layer turns a :class:`CheckpointError` into one line naming the file and what is wrong
(exit 2) before any model memory is taken: pi0 checkpoints (``models/policy/checkpoint.py``) and
ASR folders (``models/voice/asr.py``) raise it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint file is missing or malformed; ``str()`` is one line naming the file."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a missing file, bad JSON or another JSON value raises
    :class:`CheckpointError`."""
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(path, "must hold a JSON object")
    return data
