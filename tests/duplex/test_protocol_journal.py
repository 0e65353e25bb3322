"""The duplex replay journal, sans-I/O (``realtime/protocols/duplex/journal.py``)."""

from __future__ import annotations

import json

from realtime.protocols.duplex.journal import Journal


def _frame(seq: int, size: int = 0) -> str:
    return json.dumps({"type": "x", "server_event_seq": seq, "pad": "p" * size})


def _record(journal: Journal, n: int, *, epoch: int = 0, delta: bool = False, size: int = 0) -> list[int]:
    seqs = []
    for _ in range(n):
        seq = journal.next_seq()
        seqs.append(journal.record(_frame(seq, size), epoch, delta=delta).seq)
    return seqs


def test_seqs_start_at_one_and_strictly_increase() -> None:
    journal = Journal(max_events=100, max_bytes=1 << 20)
    assert journal.last_seq == 0 and journal.next_seq() == 1 and journal.first_available() == 1
    assert _record(journal, 5) == [1, 2, 3, 4, 5]
    assert journal.last_seq == 5 and journal.next_seq() == 6


def test_replay_from_a_cursor_is_every_later_entry_once_in_order() -> None:
    journal = Journal(max_events=100, max_bytes=1 << 20)
    _record(journal, 10)
    entries, gap = journal.after(6)
    assert [e.seq for e in entries] == [7, 8, 9, 10] and not gap
    assert [json.loads(e.frame)["server_event_seq"] for e in entries] == [7, 8, 9, 10]
    assert journal.after(10) == ([], False), "nothing missed: nothing replayed"
    entries, gap = journal.after(0)
    assert [e.seq for e in entries] == list(range(1, 11)) and not gap


def test_the_event_bound_drops_the_oldest_and_a_resume_behind_it_is_a_gap() -> None:
    journal = Journal(max_events=4, max_bytes=1 << 20)
    _record(journal, 10)
    assert journal.first_available() == 7
    entries, gap = journal.after(3)
    assert [e.seq for e in entries] == [7, 8, 9, 10] and gap, "seqs 4-6 are lost: resync required"
    entries, gap = journal.after(6)
    assert [e.seq for e in entries] == [7, 8, 9, 10] and not gap, "the client had all that was dropped"


def test_the_byte_bound_drops_the_oldest_frames() -> None:
    one = len(_frame(1, 100))
    journal = Journal(max_events=1000, max_bytes=3 * one + 10)
    _record(journal, 6, size=100)
    entries, gap = journal.after(0)
    assert [e.seq for e in entries] == [4, 5, 6] and gap
    assert sum(len(e.frame) for e in entries) <= journal.max_bytes


def test_a_frame_larger_than_the_byte_bound_is_not_kept() -> None:
    journal = Journal(max_events=10, max_bytes=50)
    (seq,) = _record(journal, 1, size=200)
    assert journal.last_seq == seq == 1, "it still took its seq (it was sent)"
    assert journal.after(0) == ([], True) and journal.first_available() == 2


def test_drop_stale_forgets_the_deltas_of_older_epochs_only() -> None:
    journal = Journal(max_events=100, max_bytes=1 << 20)
    _record(journal, 2, epoch=0, delta=True)  # 1, 2: audio of the interrupted response
    _record(journal, 1, epoch=0)  # 3: a lifecycle event of epoch 0 (kept)
    _record(journal, 1, epoch=1, delta=True)  # 4: audio of the new epoch
    assert journal.drop_stale(1) == 2
    entries, gap = journal.after(0)
    assert [e.seq for e in entries] == [3, 4] and not gap, "dropped deltas are neither sent nor a gap"
    assert journal.drop_stale(1) == 0
    assert journal.next_seq() == 5, "seqs are never reused"


def test_release_through_forgets_what_the_client_holds() -> None:
    journal = Journal(max_events=100, max_bytes=1 << 20)
    _record(journal, 10, size=10)
    assert journal.release_through(6) == 6
    assert journal.first_available() == 7 and not journal.after(6)[1]
    assert [e.seq for e in journal.after(6)[0]] == [7, 8, 9, 10]
    assert journal.after(5)[1], "a resume from behind the ack is a gap"
    assert journal.release_through(6) == 0, "idempotent"
    assert journal.release_through(10) == 4 and journal.after(10) == ([], False)
    _record(journal, 1)
    assert [e.seq for e in journal.after(10)[0]] == [11]
