"""The robot kind keeps frame-sized buffers in the heap (glibc malloc thresholds)."""

from __future__ import annotations

import platform

import pytest

from realtime.kinds.robot import keep_frame_buffers


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_malloc_thresholds_are_applied_on_glibc():
    assert keep_frame_buffers() is True
    assert keep_frame_buffers() is True  # idempotent: load() may run again in the same process
