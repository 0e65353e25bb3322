"""Dependencies point one way: realtime -> sessions -> models (architecture §2).

sessions/ imports nothing from realtime/; models/ imports nothing from realtime/ or sessions/.
Checked statically on every module's import statements, including lazy ones inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"sessions": {"realtime"}, "models": {"realtime", "sessions"}, "clients": {"sessions", "models"}}


def _imported_top_levels(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package):
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for top, line in _imported_top_levels(path):
            if top in FORBIDDEN[package]:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not violations, "\n".join(violations)


def test_checker_detects_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from realtime.app import create_app\n")
    assert ("realtime", 2) in _imported_top_levels(bad)
