"""The checkpoint store's table: one newest checkpoint per session, bounded per session and in
total (oldest written go first), each expiring after its TTL."""

from __future__ import annotations

import pytest

from realtime.scale.resume import Checkpoint, CheckpointTable, CheckpointTooLargeError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cp(sid: str, seq: int, size: int = 10) -> Checkpoint:
    return Checkpoint(sid, "duplex", seq, bytes(size))


def test_the_newest_checkpoint_wins_and_a_late_older_one_changes_nothing():
    table = CheckpointTable(max_bytes=100, max_total_bytes=1000, ttl_s=60)
    assert table.put(cp("a", 2))
    assert not table.put(cp("a", 1, size=20))
    assert table.get("a") == cp("a", 2) and table.stats() == {"sessions": 1, "bytes": 10}
    assert table.put(cp("a", 3, size=30)) and table.stats() == {"sessions": 1, "bytes": 30}
    table.delete("a")
    table.delete("a")  # idempotent
    assert table.get("a") is None and table.stats() == {"sessions": 0, "bytes": 0}


def test_a_state_over_the_bound_is_refused_and_the_older_one_stays():
    table = CheckpointTable(max_bytes=100, max_total_bytes=1000, ttl_s=60)
    table.put(cp("a", 1))
    with pytest.raises(CheckpointTooLargeError) as refused:
        table.put(cp("a", 2, size=101))
    assert refused.value.code == "checkpoint_too_large" and refused.value.details["limit"] == 100
    assert table.get("a") == cp("a", 1)


def test_the_total_bound_drops_the_checkpoints_written_longest_ago():
    clock = Clock()
    table = CheckpointTable(max_bytes=100, max_total_bytes=250, ttl_s=60, clock=clock)
    for i, sid in enumerate("abc"):
        clock.now = i
        table.put(cp(sid, 1, size=80))
    clock.now = 3
    table.put(cp("a", 2, size=80))  # rewritten: now the newest
    table.put(cp("d", 1, size=80))  # 320 > 250: "b" (oldest write) goes
    assert [s for s in "abcd" if table.get(s)] == ["a", "c", "d"]
    assert table.stats() == {"sessions": 3, "bytes": 240}


def test_checkpoints_expire_after_their_ttl_from_the_last_put():
    clock = Clock()
    table = CheckpointTable(max_bytes=100, max_total_bytes=1000, ttl_s=10, clock=clock)
    table.put(cp("a", 1))
    clock.now = 5
    table.put(cp("b", 1))
    clock.now = 10.5
    assert table.get("a") is None and table.get("b") is not None
    clock.now = 15.5
    assert table.stats() == {"sessions": 0, "bytes": 0}
