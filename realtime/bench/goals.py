"""The benches' goals, one table: what each scenario prints beside its figures and what
``docs/benchmarks.md``'s front table shows (``tests/test_docs_benchmarks.py`` checks they agree).

Keys are the JSON keys of a scenario's last line. A goal names the issue that set it where the
record says; a later issue's goal replaces an earlier one for the same key (issue 30's GPU frontier
replaced issue 16's robot and world-latency goals). The goals hold for the machine the issue names
(issue 30: one H200); a CPU figure is shown against the same goal, and the docs say why the CPU
cannot reach it where it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Goal:
    """``figure <bound> value``, e.g. ``throughput_ratio_8 >= 4.5``."""

    bound: str  # ">=" or "<="
    value: float
    issue: int | None = None  # the issue that set it, where the record names one

    def __str__(self) -> str:
        return f"{self.bound} {self.value:g}"


GOALS: dict[str, dict[str, Goal]] = {
    "engine": {
        "throughput_ratio": Goal(">=", 3),
        "p99_ratio": Goal("<=", 2),
    },
    "robot": {
        "overhead_ratio_libero": Goal("<=", 1.1),
        "overhead_ratio_aloha": Goal("<=", 1.1),
        "throughput_ratio_8": Goal(">=", 4.5, 30),
        "p99_ratio_8": Goal("<=", 2.0, 30),
        "latency_ms_1": Goal("<=", 18, 30),
        "mfu_8": Goal(">=", 0.65, 30),
        "idle_p50_ratio": Goal("<=", 1.1, 12),
    },
    "world": {
        "key_to_frame_ms_p50": Goal("<=", 400, 12),
        "key_to_frame_continuous_play_ratio": Goal(">=", 0.95, 12),
        "fps_1": Goal(">=", 30, 16),
        "ttff_ms": Goal("<=", 250, 30),
        "aggregate_ratio_4": Goal(">=", 0.9, 16),
        "mfu": Goal(">=", 0.55, 16),
        "fps_each_4": Goal(">=", 16, 30),
        "sessions_at_16fps": Goal(">=", 4, 30),
    },
    "voice": {
        "ttfa_ms_1": Goal("<=", 1000, 13),
        "ttfa_8_vs_1_ratio": Goal("<=", 2, 13),
        "ttfa_8_vs_1_burst_ratio": Goal("<=", 2, 13),
        "ttfa_chunked_vs_full_ratio": Goal("<=", 0.3, 13),
        "ttfa_ms_p50_32": Goal("<=", 300, 30),
        "webrtc_added_ttfa_p50_ms": Goal("<=", 30, 31),
        "webrtc_added_ttfa_p50_ms_8": Goal("<=", 30, 31),
    },
    "duplex": {
        "max_sessions_80ms": Goal(">=", 128, 30),
    },
    "reliability": {
        "crashes": Goal("<=", 0, 26),
        "isolation_p99_ratio": Goal("<=", 1.5, 26),
        "healthz_p99_ms": Goal("<=", 20, 26),
        "soak_rss_growth_pct": Goal("<=", 5, 26),
    },
    "scale": {
        "proxy_added_p50_ms": Goal("<=", 1.0, 28),
        "throughput_ratio_2_vs_1": Goal(">=", 1.8, 28),
        "resume_after_loss_ms": Goal("<=", 2000, 28),
        "lost_sessions": Goal("<=", 0, 28),
    },
}


def goal_note(scenario: str, key: str) -> str:
    """`` (goal >= 4.5)`` for a key with a goal, else the empty string: for the benches' lines."""
    goal = GOALS.get(scenario, {}).get(key)
    return f" (goal {goal})" if goal else ""
