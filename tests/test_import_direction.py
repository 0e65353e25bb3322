"""Dependencies point one way: realtime -> sessions -> models (architecture §2).

sessions/ imports nothing from realtime/; models/ imports nothing from realtime/ or sessions/; no
serving module imports training code (``models/world/training/``: the world model's training
script, its maze and start-frame rendering). Checked statically on every module's import
statements, including lazy ones inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"sessions": {"realtime"}, "models": {"realtime", "sessions"}, "clients": {"sessions", "models"}}
TRAINING = "models.world.training"  # training code: nothing that serves imports it
SERVING = ("realtime", "sessions", "models")


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


def _imported_modules(path: Path) -> set[tuple[str, int]]:
    """Full dotted names of the modules ``path`` imports (``from a.b import c`` also as ``a.b.c``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name, node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module, node.lineno))
            found |= {(f"{node.module}.{alias.name}", node.lineno) for alias in node.names}
    return found


def _is_training(module: str) -> bool:
    return module == TRAINING or module.startswith(TRAINING + ".")


def test_no_serving_module_imports_training_code():
    training = ROOT / Path(*TRAINING.split("."))
    violations = []
    for package in SERVING:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(training):
                continue
            for module, line in _imported_modules(path):
                if _is_training(module):
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert training.is_dir() and not violations, "\n".join(violations)


def test_training_checker_detects_both_import_forms(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from models.world import training\nimport models.world.training.train\n")
    assert {m for m, _ in _imported_modules(bad) if _is_training(m)} == {
        "models.world.training",
        "models.world.training.train",
    }


def test_checker_detects_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from realtime.app import create_app\n")
    assert ("realtime", 2) in _imported_top_levels(bad)
