"""Codecs take model validators from their kind instead of importing them.

Regression for issue 27 (codecs import model validators): ``realtime/protocols/openpi.py`` imported
the policy's prompt check and ``realtime/protocols/world.py`` the world model's control check.
(``oai_realtime/audio.py`` shares ``models.voice.audio``'s sample conversions: not a validator.)
"""

from __future__ import annotations

from tests.test_import_direction import ROOT, _imported_top_levels


def test_the_openpi_and_world_codecs_import_no_model_code():
    violations = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in (
            ROOT / "realtime" / "protocols" / name for name in ("openpi.py", "world.py", "strict_json.py")
        )
        for top, line in _imported_top_levels(path)
        if top == "models"
    ]
    assert not violations, violations
