"""World tests run torch on one thread (2-core machine shared with other suites)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every world test asks for ``one_torch_thread`` (tests/conftest.py)."""
