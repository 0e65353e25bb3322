"""Session ids a scaled-out replica allocates are routable; request ids stay distinct."""

from __future__ import annotations

import pytest

from sessions import identities
from sessions.identities import (
    allocated_elsewhere,
    default_request_id,
    new_session_id,
    session_replica_tag,
    set_replica_tag,
)


@pytest.fixture
def tagged():
    set_replica_tag("r7x2k9qa")
    yield "r7x2k9qa"
    identities._replica_tag = ""  # back to the single-process server


def test_untagged_ids_keep_the_single_process_format():
    sid = new_session_id("robot")
    kind, _, token = sid.partition("-")
    assert kind == "robot" and len(token) == 16 and int(token, 16) >= 0
    assert session_replica_tag(sid) is None
    assert not allocated_elsewhere(sid)


def test_a_tagged_replica_allocates_ids_that_name_it(tagged):
    sid = new_session_id("duplex")
    assert sid.startswith(f"duplex-{tagged}.")
    assert session_replica_tag(sid) == tagged
    assert not allocated_elsewhere(sid)
    assert allocated_elsewhere(sid.replace(tagged, "other1"))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "duplex",
        "duplex-abc.123",
        "duplex-ABC.0123456789abcdef",
        "x-a.0123456789abcdeff",
        "-a.0123456789abcdef",
    ],
)
def test_client_text_is_never_taken_for_a_tagged_id(text):
    assert session_replica_tag(text) is None


@pytest.mark.parametrize("tag", ["", "UPPER", "has-dash", "has.dot", "a" * 33])
def test_bad_tags_are_refused(tag):
    with pytest.raises(ValueError):
        set_replica_tag(tag)


def test_request_ids_are_unique_per_tick_and_never_a_session_id(tagged):
    sessions = [new_session_id(kind) for kind in ("robot", "world", "voice", "duplex") for _ in range(50)]
    request_ids = [default_request_id(sid, chunk) for sid in sessions for chunk in (0, 1, 0, 2)]
    assert len(set(request_ids)) == len(request_ids)  # a reset replaying chunk 0 still differs
    assert not set(request_ids) & set(sessions)
    assert all(session_replica_tag(rid) is None for rid in request_ids)  # never routed as a session
    assert all(tagged in rid for rid in request_ids)  # unique across replicas: it names its replica
