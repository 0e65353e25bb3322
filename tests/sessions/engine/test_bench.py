"""``realtime bench engine`` runs end to end and ends with its headline JSON line."""

from __future__ import annotations

import json

from realtime.bench import run_scenario


def test_engine_bench_prints_ratios_and_a_json_last_line(capsys):
    argv = ["--sessions", "4", "--duration", "0.4", "--rate", "40", "--fixed-reps", "2", "--item-reps", "2"]
    assert run_scenario("engine", argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    headline = json.loads(lines[-1])
    assert headline["throughput_ratio"] > 0 and headline["p99_ratio"] > 0
    assert any(line.startswith("batched ") for line in lines)
    assert any(line.startswith("unbatched (max_batch=1)") for line in lines)
