"""Memory-based capacity, with the worked numbers of vllm-omni's KV tests (seed reference §2.10)."""

from __future__ import annotations

import pytest

from sessions.capacity import (
    MemoryDeclaration,
    available_memory_bytes,
    paced_capacity,
    plan_capacity,
    with_compute_limit,
)
from sessions.errors import CapacityError

# The tiny geometry of the reference tests: 8-byte pages; a session keeps 6 pages plus a
# 16-byte cross-attention cache; scratch is 8 pages. required(1) = 128, required(2) = 192.
TINY = MemoryDeclaration(resident_bytes_per_session=6 * 8 + 16, scratch_bytes=8 * 8)

GIB = 1 << 30
LINGBOT_PAGE = 2 * 1560 * 40 * 128 * 2 * 40  # K+V, tokens/frame, heads, head dim, bf16, layers
LINGBOT = MemoryDeclaration(
    resident_bytes_per_session=18 * LINGBOT_PAGE + 2 * 512 * 40 * 128 * 2 * 40,  # sink+window, text KV
    model_owned_bytes_per_session=7_488_000,  # image-condition tensor
    scratch_bytes=8 * LINGBOT_PAGE,  # in-flight block, padding, scratch
)


def test_required_is_scratch_plus_per_session_bytes():
    assert TINY.required(1) == 128 and TINY.required(2) == 192
    assert LINGBOT.required(1) == 33_653_670_400


def test_cannot_fit_one_session_names_both_byte_counts():
    with pytest.raises(CapacityError, match="cannot fit one session") as info:
        plan_capacity(TINY, available_bytes=127, fraction=0.9)
    assert "available=127 bytes" in str(info.value) and "required=128 bytes" in str(info.value)
    assert info.value.details == {"available_bytes": 127, "required_bytes": 128}


def test_fraction_is_a_soft_floor_when_one_session_fits():
    plan = plan_capacity(TINY, available_bytes=1280, fraction=0.05)
    assert plan.configured_budget_bytes == 64
    assert plan.effective_budget_bytes == 128
    assert plan.capacity == 1


def test_capacity_two_fits_exactly():
    assert plan_capacity(TINY, available_bytes=192, fraction=1.0).capacity == 2
    assert plan_capacity(TINY, available_bytes=191, fraction=1.0).capacity == 1


def test_model_owned_state_reduces_capacity():
    assert plan_capacity(TINY, available_bytes=200, fraction=1.0).capacity == 2
    owned = MemoryDeclaration(64, model_owned_bytes_per_session=16, scratch_bytes=64)
    plan = plan_capacity(owned, available_bytes=200, fraction=1.0)
    assert plan.capacity == 1 and plan.per_session_bytes == 80


def test_requested_capacity_is_capped_by_memory_model_and_config():
    requested = MemoryDeclaration(64, scratch_bytes=64, max_sessions=64)
    plan = plan_capacity(requested, available_bytes=192, fraction=1.0)
    assert (plan.capacity, plan.limited_by) == (2, "memory")
    plan = plan_capacity(requested, available_bytes=10_000, fraction=1.0, max_sessions=3)
    assert (plan.capacity, plan.limited_by) == (3, "config")
    plan = plan_capacity(MemoryDeclaration(64, max_sessions=2), available_bytes=10_000, fraction=1.0)
    assert (plan.capacity, plan.limited_by) == (2, "model")


def test_zero_byte_sessions_need_an_explicit_cap():
    with pytest.raises(CapacityError, match="runtime.max_sessions"):
        plan_capacity(MemoryDeclaration(0), available_bytes=1000, fraction=0.5)
    assert (
        plan_capacity(MemoryDeclaration(0), available_bytes=1000, fraction=0.5, max_sessions=8).capacity == 8
    )


def test_shipped_lingbot_geometry_default_fraction_admits_one_session():
    plan = plan_capacity(LINGBOT, available_bytes=100 * GIB, fraction=0.1)
    assert plan.effective_budget_bytes == 33_653_670_400 and plan.capacity == 1


def test_shipped_lingbot_geometry_tuned_fraction_admits_two_sessions():
    assert plan_capacity(LINGBOT, available_bytes=100 * GIB, fraction=0.6).capacity == 2


@pytest.mark.parametrize("bad", [{"resident_bytes_per_session": -1}, {"resident_bytes_per_session": 1.5}])
def test_declarations_are_validated(bad):
    with pytest.raises(ValueError):
        MemoryDeclaration(**bad)


def test_available_cpu_memory_is_measured():
    assert available_memory_bytes("cpu") > 0


def test_paced_capacity_admits_while_the_steps_of_one_period_fit_its_budget():
    steps = {1: 0.05, 2: 0.08, 4: 0.16, 8: 0.32}
    # n <= max_batch: one forward of n items per period; budget 0.8 * 0.5 = 0.4 s
    assert paced_capacity(steps, period_s=0.5, max_batch=8, utilisation=0.8) == 8
    # beyond max_batch: ceil(n / B) forwards of B items: 3 * t(4) = 0.48 > 0.4, so 8 fit, not 9
    assert paced_capacity(steps, period_s=0.5, max_batch=4, utilisation=0.8) == 8
    # between measured sizes the step time is interpolated: t(3) = 0.12 fits 0.125, t(4) does not
    assert paced_capacity(steps, period_s=0.125, max_batch=8, utilisation=1.0) == 3
    # beyond the largest measured size the last slope extends: t(12) = 0.48
    assert paced_capacity(steps, period_s=0.5, max_batch=16, utilisation=0.96) == 12
    # a device too slow for even one session still admits one
    assert paced_capacity({1: 2.0}, period_s=0.5, max_batch=8, utilisation=0.8) == 1


def test_a_compute_limit_caps_the_memory_plan_and_says_so():
    plan = plan_capacity(MemoryDeclaration(100), available_bytes=10_000, fraction=1.0)
    assert plan.capacity == 100 and plan.limited_by == "memory"
    capped = with_compute_limit(plan, 7)
    assert (capped.capacity, capped.limited_by, capped.compute_capacity) == (7, "compute", 7)
    roomy = with_compute_limit(plan, 500)
    assert (roomy.capacity, roomy.limited_by, roomy.compute_capacity) == (100, "memory", 500)
