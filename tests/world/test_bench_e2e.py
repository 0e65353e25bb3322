"""``realtime bench world --e2e`` (issue 16's end-to-end world figures) runs and reports its keys:
a smoke test on the random test-sized model, so the GPU bench cannot rot between GPU runs."""

from __future__ import annotations

import json

import pytest

from realtime.bench import world
from realtime.bench.world import E2ESession
from realtime.kinds.world_timing import STAGES


def test_e2e_section_reports_fps_ttff_aggregate_mfu_and_stage_breakdown(capsys):
    # a second per point: under a loaded 2-core box a half-second window once caught no 2 chunks of 8 sessions
    argv = ["--e2e", "--model", "world-test", "--e2e-seconds", "1.0", "--e2e-warmup-s", "0.2"]
    assert world.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(out[-1])
    assert figures["fps_1"] > 0 and figures["ttff_ms"] > 0
    assert figures["dit_tflop_per_block"] >= 0 and 0 <= figures["mfu"] < 1
    # over the DiT's own span per block (denoise + clean means): rounds to 0 on a CPU against 989 TFLOP/s
    assert figures["mfu_dit_span"] is not None and 0 <= figures["mfu_dit_span"] < 1
    (line,) = [line for line in out if "over the DiT's own span of" in line]
    assert float(line.split("span of ")[1].split(" ms")[0]) > 0
    assert set(figures["e2e_fps"]) == {"batched", "sliced"}
    assert all(figures["e2e_fps"][mode]["8"] > 0 for mode in ("batched", "sliced"))  # 8 sessions served
    assert figures["aggregate_ratio_4"] == round(figures["e2e_fps"]["batched"]["4"] / figures["fps_1"], 3)
    # issue 30's per-session keys: the slowest session of each run, and the real-time session count
    slowest = figures["fps_each"]["batched"]
    assert (
        figures["fps_each_4"] == slowest["4"]
        and 0 < slowest["4"] <= figures["e2e_fps"]["batched"]["4"] / 4 + 0.01
    )
    assert figures["sessions_at_16fps"] == max((int(n) for n, fps in slowest.items() if fps >= 16), default=0)
    assert figures["fps_at_bf16_peak"] > 0
    # the per-stage breakdown scraped from the server's /metrics, for every mode and session count
    for mode in ("batched", "sliced"):
        for n in ("1", "2", "4", "8"):
            stages = figures["stage_ms"][mode][n]
            assert stages["n"] > 0 and stages["n_first"] == int(n), (mode, n)  # each run's sessions
            for stage in STAGES:
                assert stages["p50"][stage] is not None and stages["max"][stage] >= stages["p50"][stage]
                assert stages["first_block"][stage] is not None
    assert any(line.strip().startswith("denoise") for line in out)  # the printed breakdown


def test_e2e_batched_only_skips_the_time_sliced_server(capsys):
    argv = ["--e2e", "--model", "world-test", "--e2e-seconds", "0.3", "--e2e-warmup-s", "0.1"]
    assert world.main([*argv, "--e2e-sessions", "1", "--e2e-batched-only"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(out[-1])
    assert set(figures["e2e_fps"]) == set(figures["stage_ms"]) == {"batched"}
    assert figures["fps_1"] > 0 and not any(line.lstrip().startswith("sliced") for line in out)


def test_e2e_without_one_session_is_refused_before_any_work(capsys):
    # it once ran 2 and 4 sessions on a GPU and then raised KeyError: the one-session figures are the headline
    with pytest.raises(SystemExit) as exit_info:
        world.main(["--e2e", "--model", "world-test", "--e2e-sessions", "2", "4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--e2e-sessions must include 1" in err and "Traceback" not in err


def test_session_fps_runs_from_its_first_to_its_last_chunk_in_the_window():
    session = E2ESession(arrivals=[(9.9, 12), (10.0, 12), (10.4, 12), (10.8, 12), (11.2, 12), (12.1, 12)])
    assert session.fps_in(10.0, 12.0) == pytest.approx(36 / 1.2)  # not 48 frames / 2 s
    assert session.fps_in(10.0, 10.3) == 0.0  # one chunk: no interval to measure
