"""The benches are a leaf (issue 27): no serving module imports ``realtime.bench``, and the benches
reach the server only through public names.

Checked statically on every import statement (lazy ones inside functions too). The one way in is
``realtime bench ...``: ``realtime/cli.py`` may import the bench package inside a function, never at
module level, so ``realtime serve`` loads no scenario. Inside ``realtime/bench/`` no module reads a
private attribute of an object it does not own (``x._y`` with ``x`` other than ``self``/``cls``) or
imports a private name from outside the bench.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "realtime" / "bench"
SERVING = ("realtime", "sessions", "models", "clients")
CLI = ROOT / "realtime" / "cli.py"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, path: Path, root: Path) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved against ``path``'s package."""
    if node.level == 0:
        return node.module or ""
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def bench_imports(path: Path, root: Path = ROOT) -> list[tuple[int, bool]]:
    """``(line, at module level)`` of every statement in ``path`` that imports ``realtime.bench``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path, root)
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        if any(name == "realtime.bench" or name.startswith("realtime.bench.") for name in names):
            found.append((node.lineno, id(node) in top_level))
    return sorted(found)


def private_reaches(path: Path, root: Path = ROOT) -> list[str]:
    """Private attributes read off objects the module does not own, and private names imported
    from outside the bench."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in {"self", "cls"}):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path, root)
            if not module.startswith("realtime.bench"):
                found += [f"{node.lineno}: {module}.{a.name}" for a in node.names if _private(a.name)]
    return sorted(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _serving_modules() -> list[Path]:
    paths = [p for package in SERVING for p in sorted((ROOT / package).rglob("*.py"))]
    return [p for p in paths if BENCH not in p.parents]


def test_no_serving_module_imports_the_benches():
    violations = []
    for path in _serving_modules():
        for line, top_level in bench_imports(path):
            if path == CLI and not top_level:
                continue  # ``realtime bench ...``: the one way in, inside a function
            violations.append(f"{path.relative_to(ROOT)}:{line} imports realtime.bench")
    assert not violations, "\n".join(violations)


def test_the_cli_reaches_the_benches_only_lazily():
    lines = bench_imports(CLI)
    assert lines, "realtime/cli.py no longer dispatches `realtime bench`"
    assert not [line for line, top_level in lines if top_level]


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_the_benches_use_only_public_names(path):
    assert not private_reaches(path), private_reaches(path)


def test_the_checkers_catch_violations(tmp_path):
    module = tmp_path / "realtime" / "kinds" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from realtime.bench import robot\n"
        "def f(client):\n"
        "    from ..bench.examples import libero\n"
        "    import realtime.bench.world\n"
        "    from realtime import bench\n"
        "    from models.world.model import _private\n"
        "    client._ws.close()\n"
        "    self._mine = 1\n"
    )
    assert bench_imports(module, tmp_path) == [(1, True), (3, False), (4, False), (5, False)]
    assert private_reaches(module, tmp_path) == ["6: models.world.model._private", "7: ._ws"]
