"""The session router's placement policy (pure: reports in, ranks of replica tags out)."""

from __future__ import annotations

from realtime.scale.affinity import kind_of, named_session, owner_of, replica_key
from realtime.scale.placement import KindLoad, Placements, ReplicaReport, Request, rank

ROUTES = (
    ("/", "robot"),
    ("/v1/realtime/robot/openpi", "robot"),
    ("/v1/realtime/world", "world"),
    ("/v1/duplex", "duplex"),
    ("/v1/realtime", "duplex"),
    ("/v1/realtime", "voice"),
)


def report(tag: str, ready: bool = True, at: float = 100.0, **kinds: tuple[int, int]) -> ReplicaReport:
    return ReplicaReport(tag, at, ready, {k: KindLoad(*v) for k, v in kinds.items()}, ROUTES)


def test_reports_survive_serve_s_stats_dict_and_junk_is_no_report():
    r = report("a", robot=(8, 3))
    assert ReplicaReport.from_stats(r.to_stats()) == r
    assert ReplicaReport.from_stats({}) is None  # before a replica's first report
    assert ReplicaReport.from_stats({"replica": "a"}) is None


def test_a_session_goes_back_to_its_replica_even_when_it_is_full():
    reports = {"a": report("a", robot=(1, 1)), "b": report("b", robot=(8, 0))}
    assert rank(Request(owner="a", kind="robot"), reports, Placements()) == [["a"]]


def test_a_draining_owner_sends_its_sessions_reconnects_elsewhere_but_still_answers_its_peers():
    reports = {"a": report("a", ready=False), "b": report("b", duplex=(2, 0))}
    assert rank(Request(owner="a", kind="duplex"), reports, Placements()) == [["b"], ["a", "b"]]
    assert rank(Request(owner="a"), reports, Placements()) == [["a"]]  # replica:<a> calls, HTTP


def test_new_sessions_go_least_loaded_first_and_ties_stay_in_one_rank():
    reports = {
        "a": report("a", world=(4, 3)),
        "b": report("b", world=(4, 1)),
        "c": report("c", world=(8, 2)),
        "d": report("d", world=(4, 4)),
    }
    assert rank(Request(kind="world"), reports, Placements()) == [["b", "c"], ["a"], ["a", "b", "c", "d"]]


def test_a_full_cluster_still_gets_a_replica_that_answers_the_capacity_error():
    reports = {"a": report("a", duplex=(2, 2)), "b": report("b", duplex=(2, 2))}
    assert rank(Request(kind="duplex"), reports, Placements()) == [["a", "b"]]


def test_a_gone_owner_means_placement_by_capacity_and_unready_replicas_come_last():
    reports = {"a": report("a", voice=(2, 0)), "b": report("b", ready=False), "c": None}
    assert rank(Request(owner="zz", kind="voice"), reports, Placements()) == [["a"], ["a", "b", "c"]]
    assert rank(Request(), reports, Placements()) == [["a"], ["a", "b", "c"]]


def test_sessions_placed_since_a_report_count_until_a_report_settled_after_them():
    placed = Placements()
    reports = {"a": report("a", at=100.0, robot=(2, 0)), "b": report("b", at=100.0, robot=(2, 1))}
    placed.add("a", "robot", 100.5)
    placed.add("a", "robot", 100.6)  # a burst inside one stats period: "a" is full now
    placed.add("a", "world", 100.7)  # another kind does not count
    assert rank(Request(kind="robot"), reports, placed) == [["b"], ["a", "b"]]
    soon = {**reports, "a": report("a", at=101.0, robot=(2, 1))}  # may miss a handshake in flight
    assert placed.since("a", "robot", 101.0) == 2
    assert rank(Request(kind="robot"), soon, placed) == [["b"], ["a", "b"]]
    settled = {**reports, "a": report("a", at=101.7, robot=(2, 1))}  # holds every one of them
    assert placed.since("a", "robot", 101.7) == 0
    assert rank(Request(kind="robot"), settled, placed)[0] == ["a", "b"]


def test_what_a_request_names_and_opens():
    scope = {"type": "websocket", "query_string": b"autostart=0&session_id=duplex-ab12.0123456789abcdef"}
    assert named_session(scope) == "duplex-ab12.0123456789abcdef"
    assert owner_of(named_session(scope)) == "ab12"
    assert (
        named_session({"headers": [(b"X-Session_ID", b"voice-q.0123456789abcdef")]})
        == "voice-q.0123456789abcdef"
    )
    assert named_session({"query_string": b"", "headers": []}) is None
    assert owner_of("my-own-episode-name") is None and owner_of(None) is None
    assert owner_of(replica_key("ab12")) == "ab12" and owner_of("replica:../x") is None
    assert kind_of("/", b"", ROUTES) == "robot"
    assert kind_of("/v1/realtime", b"model=gpt", ROUTES) == "voice"
    assert kind_of("/v1/realtime", b"mode=duplex", ROUTES) == "duplex"
    assert kind_of("/v1/realtime", b"mode=nonsense", ROUTES) == "voice"
    assert kind_of("/v1/status", b"", ROUTES) is None
