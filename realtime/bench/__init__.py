"""Benchmark scenarios: ``realtime bench <scenario> [options]``.

Each scenario module exposes ``main(argv: list[str]) -> int``. It runs ours and the peer the
issue names in one run, prints a side-by-side table with ratios, and ends with one line holding
one JSON object of its headline figures (key names as its issue gives them).
"""

from __future__ import annotations

import importlib

SCENARIOS: dict[str, str] = {
    "engine": "realtime.bench.engine",
    "robot": "realtime.bench.robot",
    "world": "realtime.bench.world",
    "voice": "realtime.bench.voice",
    "duplex": "realtime.bench.duplex",
    "llm": "realtime.bench.llm",
    "scale": "realtime.bench.scale",
    "reliability": "realtime.bench.reliability",
}


def run_scenario(name: str, argv: list[str]) -> int:
    module = importlib.import_module(SCENARIOS[name])
    return int(module.main(list(argv)) or 0)
