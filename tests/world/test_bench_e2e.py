"""``realtime bench world --e2e`` (issue 16's end-to-end world figures) runs and reports its keys:
a smoke test on the random test-sized model, so the GPU bench cannot rot between GPU runs."""

from __future__ import annotations

import json

from realtime.bench import world


def test_e2e_section_reports_fps_ttff_aggregate_and_mfu(capsys):
    argv = ["--e2e", "--model", "world-test", "--e2e-seconds", "0.5", "--e2e-warmup-s", "0.2"]
    assert world.main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["fps_1"] > 0 and figures["ttff_ms"] > 0
    assert figures["dit_tflop_per_block"] >= 0 and 0 <= figures["mfu"] < 1
    assert set(figures["e2e_fps"]) == {"batched", "sliced"}
    assert all(figures["e2e_fps"][mode]["8"] > 0 for mode in ("batched", "sliced"))  # 8 sessions served
    assert figures["aggregate_ratio_4"] == round(figures["e2e_fps"]["batched"]["4"] / figures["fps_1"], 3)
