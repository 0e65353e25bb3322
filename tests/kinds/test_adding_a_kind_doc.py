"""docs/adding-a-session-kind.md shows echo.py's own code: every Python block of the guide is
marked as taken from ``realtime/kinds/echo.py`` and appears there verbatim (at some indentation),
so the guide cannot drift from the worked example."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "adding-a-session-kind.md"
MARK = "<!-- from realtime/kinds/echo.py -->"
BLOCK = re.compile(r"(?P<mark>[^\n]*)\n```python\n(?P<code>.*?)```", re.S)


def _blocks() -> list[tuple[str, str]]:
    return [(m["mark"].strip(), m["code"]) for m in BLOCK.finditer(GUIDE.read_text())]


def _appears(code: str, source: str) -> bool:
    lines = textwrap.dedent(code).splitlines()
    return any(
        "\n".join(indent + line if line else line for line in lines) in source
        for indent in ("", " " * 4, " " * 8)
    )


def test_every_code_block_of_the_guide_is_echo_py_verbatim() -> None:
    source = (ROOT / "realtime" / "kinds" / "echo.py").read_text()
    blocks = _blocks()
    assert len(blocks) >= 4
    for mark, code in blocks:
        assert mark == MARK, f"an unmarked block:\n{code}"
        assert _appears(code, source), f"not in realtime/kinds/echo.py:\n{code}"


def test_a_changed_snippet_is_caught() -> None:
    source = (ROOT / "realtime" / "kinds" / "echo.py").read_text()
    _, code = _blocks()[0]
    assert not _appears(code.replace("await self.manager.start()", "self.manager.start()"), source)
