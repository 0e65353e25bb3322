"""``realtime bench voice --transport webrtc`` (realtime/bench/voice_webrtc.py) at its smallest: one
session, one measured round on each transport, on the real server with the real clients (plain
websockets and the aiortc call of clients/webrtc_call.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("aiortc", reason="the webrtc extra is not installed (pip install -e '.[webrtc]')")

from realtime.bench import run_scenario  # noqa: E402
from realtime.bench.voice_webrtc import onset_ms  # noqa: E402

pytestmark = pytest.mark.timeout(240)

KEYS = (
    "ttfa_ms_1_websocket",
    "ttfa_ms_1_webrtc",
    "ttfa_ms_1_websocket_p95",
    "ttfa_ms_1_webrtc_p95",
    "webrtc_added_ttfa_p50_ms",
    "first_delta_ms_1_websocket",
    "reply_onset_ms_1",
    "webrtc_started_ms_1",
    "webrtc_media_ms_1",
)


def test_bench_voice_webrtc_ends_with_both_transports_side_by_side(capsys):
    argv = [
        "--transport",
        "webrtc",
        "--sessions",
        "1",
        "--rounds",
        "2",
        "--question",
        "What is the capital of France?",
    ]
    assert run_scenario("voice", argv) == 0
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    assert set(KEYS) <= set(figures), set(KEYS) - set(figures)
    assert figures["turns_1"] == 1 and figures["rounds"] == 2
    assert all(figures[k] > 0 for k in KEYS if k not in ("webrtc_added_ttfa_p50_ms", "webrtc_media_ms_1"))
    assert figures["webrtc_added_ttfa_p50_ms"] == pytest.approx(
        figures["ttfa_ms_1_webrtc"] - figures["ttfa_ms_1_websocket"], abs=0.11
    )
    # the websocket's first audible audio is its first delta plus the reply's lead-in
    assert figures["ttfa_ms_1_websocket"] == pytest.approx(
        figures["first_delta_ms_1_websocket"] + figures["reply_onset_ms_1"], abs=0.11
    )
    assert "(goal <= 30)" in out


def test_the_onset_is_the_first_audible_20_ms_window():
    quiet, loud = np.zeros(480 * 3, np.int16), np.full(480, 3000, np.int16)
    assert onset_ms(np.concatenate([quiet, loud]).tobytes()) == 60.0
    assert onset_ms(quiet.tobytes()) is None


def test_webrtc_mode_wants_a_warm_up_round(capsys):
    with pytest.raises(SystemExit):
        run_scenario("voice", ["--transport", "webrtc", "--rounds", "1"])
    assert "--rounds >= 2" in capsys.readouterr().err
