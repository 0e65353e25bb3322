"""Codecs are pure: no protocol module imports model code; the kind passes its validators in.

Regression for issue 27 (codecs import model validators): ``realtime/protocols/openpi.py`` imported
the policy's prompt check and ``realtime/protocols/world.py`` the world model's control check.
"""

from __future__ import annotations

from tests.test_import_direction import ROOT, _imported_top_levels


def test_no_protocol_module_imports_models():
    violations = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "realtime" / "protocols").rglob("*.py"))
        for top, line in _imported_top_levels(path)
        if top == "models"
    ]
    assert not violations, violations
