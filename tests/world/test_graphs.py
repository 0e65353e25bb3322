"""CUDA graphs of the world DiT's steady pass (``models.world.graphs``, ``world.cuda_graphs``).

On the CPU the capture itself is stood in for (a "graph" whose replay reruns the captured function
into the capture's output): what these tests check is everything around it, the static buffers,
the pool's gather scratch, which blocks replay, the commit from the past's room, and the check
that rejects a graph replaying stale inputs. On CUDA the real capture runs: blocks generated with
graphs equal blocks generated without, and a graphed block still never makes the host wait."""

from __future__ import annotations

import logging

import pytest
import torch

import models.world.graphs as graphs_module
from models.world.attention import kernel_usable
from models.world.configs import TEST
from models.world.graphs import GraphMismatch
from models.world.kv_cache import KVGeometry, KVPool
from models.world.memory import ALLOCATOR_MARGIN, fixed_bytes, graph_bytes
from models.world.model import WorldModel, WorldTick
from realtime.config import ConfigError, config_from_mapping

ACTION = torch.zeros(TEST.action_dim)
TEST_STEADY = KVGeometry.of(TEST, torch.float32).steady_block


class _RerunGraph:
    """The CPU's stand-in for a captured graph: a replay reruns ``fn`` into the capture's output
    (``stale``: a replay that leaves the output as the capture made it)."""

    def __init__(self, fn, out: torch.Tensor, stale: bool = False) -> None:
        self.fn, self.out, self.stale = fn, out, stale

    def replay(self) -> None:
        if not self.stale:
            self.out.copy_(self.fn())


@pytest.fixture
def rerun_capture(monkeypatch):
    """Patch the capture for CPU models; yields a dict whose ``stale`` flag breaks replays."""
    flags = {"stale": False}

    def capture(fn, pool, warmup_iters=2):
        out = fn()
        return _RerunGraph(fn, out, flags["stale"]), out

    monkeypatch.setattr(graphs_module, "capture", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 0))
    return flags


def _pair(max_batch: int, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Two equal models (same seed), the second replaying graphs."""
    plain = WorldModel.build(TEST, slots=4, device=device, dtype=dtype, seed=5)
    graphed = WorldModel.build(TEST, slots=4, device=device, dtype=dtype, seed=5)
    graphed.capture_graphs(max_batch)
    return plain, graphed


def _tick_both(plain: WorldModel, graphed: WorldModel, ticks: list[WorldTick]) -> None:
    want, got = plain.generate(ticks), graphed.generate(ticks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _schedule(plain: WorldModel, graphed: WorldModel, rounds: list[list[tuple[str, str]]]) -> None:
    """Each round: one batched tick over (session, prompt) pairs, on both models."""
    for batch in rounds:
        ticks = [WorldTick(sid, plain.next_block(sid), prompt, ACTION) for sid, prompt in batch]
        _tick_both(plain, graphed, ticks)


def test_graphed_blocks_equal_eager_blocks_over_phases_batches_and_prompts(rerun_capture):
    plain, graphed = _pair(max_batch=3)
    for i, sid in enumerate(("a", "b", "c")):
        for model in (plain, graphed):
            model.open(sid, seed=i, slot=(2, 0, 3)[i])  # slots out of order: the gather's rows
    steady = plain.pool.geometry.steady_block
    rounds = [[("a", "stone")]] * (steady + 2)  # a alone: first (replayed), filling, then steady (replayed)
    rounds += [[("a", "stone"), ("b", "sand")]]  # b's first block beside a's steady one: masked, eager
    rounds += [[("a", "stone"), ("b", "sand")]] * steady  # b fills its window, then both replay
    rounds += [[("c", "ice"), ("a", "stone"), ("b", "sand")]] * (steady + 2)  # three, c filling first
    rounds += [[("b", "a new prompt"), ("a", "stone")]] * 2  # a prompt change: fresh cross K/V
    rounds += [[("b", "a new prompt")]]  # b moves from the scratch's row 2 to row 0 ...
    rounds += [[("c", "ice"), ("a", "stone"), ("b", "a new prompt")]] * 2  # ... and back
    _schedule(plain, graphed, rounds)
    passes = len(TEST.sigmas) + 1
    # a's first block (alone: the first-block graph); steady batches: a alone twice, a + b once
    # (b's steady block), then a + b + c twice, then two, then b alone, then the three twice
    replayed_blocks = 1 + 2 + 1 + 2 + 2 + 1 + 2
    assert graphed.graphs is not None and graphed.graphs.replayed == passes * replayed_blocks
    for sid in ("a", "b", "c"):  # the committed KV (from the past's room) is the same
        for got, want in zip(graphed.pool.snapshot(sid), plain.pool.snapshot(sid), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sessions_starting_together_replay_the_first_block_graph_and_commit_its_kv(rerun_capture):
    plain, graphed = _pair(max_batch=2)
    for model in (plain, graphed):
        model.open("a", seed=1, slot=3)
        model.open("b", seed=2, slot=1)
    _schedule(plain, graphed, [[("a", "x"), ("b", "y")]] * 2)  # two first blocks, then two filling
    assert graphed.graphs is not None and graphed.graphs.replayed == len(TEST.sigmas) + 1
    for sid in ("a", "b"):  # the first block's K/V, committed from the room, as eager
        for got, want in zip(graphed.pool.snapshot(sid), plain.pool.snapshot(sid), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_batch_past_the_captured_sizes_runs_eagerly(rerun_capture):
    plain, graphed = _pair(max_batch=1)
    for model in (plain, graphed):
        model.open("a", seed=1)
        model.open("b", seed=2)
    _schedule(plain, graphed, [[("a", "x"), ("b", "x")]] * (plain.pool.geometry.steady_block + 2))
    assert graphed.graphs is not None and graphed.graphs.replayed == 0


def test_a_replay_of_stale_inputs_fails_the_capture(rerun_capture):
    rerun_capture["stale"] = True
    model = WorldModel.build(TEST, slots=2, seed=5)
    with pytest.raises(GraphMismatch, match="batch 1: replay differs"):
        model.capture_graphs(2)
    assert model.graphs is None


def test_stage_timings_mark_replayed_passes(rerun_capture):
    from models.stage import StageItem
    from models.world.profiling import DIT_MARKS, DeviceProfiler
    from models.world.stage import WorldBlockInput, WorldBlockStage

    model = WorldModel.build(TEST, slots=1, seed=5, profiler=DeviceProfiler(cuda=False))
    model.capture_graphs(1)
    stage = WorldBlockStage(model)
    stage.open_state("a", 0)
    for block in range(model.pool.geometry.steady_block + 1):
        item = StageItem("a", 0, WorldBlockInput(WorldTick("a", block, "x", ACTION), seed=1), slot=0)
        (out,) = stage.forward([item])
        assert set(out.marks) == set(DIT_MARKS)  # the replayed passes are marked like eager ones
    assert model.graphs is not None and model.graphs.replayed == 2 * (len(TEST.sigmas) + 1)  # first, steady


def test_the_gather_scratch_returns_views_equal_to_fresh_buffers():
    pool = KVPool(KVGeometry.of(TEST, torch.float32), 3, torch.float32, "cpu")
    for sid in ("a", "b", "c"):
        pool.open(sid)
    g = pool.geometry
    room = g.frames_per_block * g.tokens_per_frame
    torch.manual_seed(0)
    pool.k.normal_()
    pool.v.normal_()
    for sid in ("a", "b", "c"):  # every frame slot held: a full window at frame 100
        pool.frame_pos[pool.slot_ids([sid])[0]] = torch.tensor(
            [*range(g.sink_frames), *range(100 - g.window_frames, 100)]
        )
    fresh, fresh_mask = pool.gather(["c", "a"], [100, 100], room)
    pool.reserve_scratch(2)
    held, held_mask = pool.gather(["c", "a"], [100, 100], room)
    assert fresh_mask is None and held_mask is None
    length = g.resident_frames * g.tokens_per_frame
    scratch = pool.scratch_past(2, length + room)
    for (fk, fv), (hk, hv), (sk, _) in zip(fresh, held, scratch, strict=True):
        assert hk.is_contiguous() and hk.shape == fk.shape == sk.shape
        assert hk.data_ptr() == sk.data_ptr()
        assert torch.equal(hk[:, :length], fk[:, :length]) and torch.equal(hv[:, :length], fv[:, :length])
    third, _ = pool.gather(["a", "b", "c"], [100] * 3, room)  # past the scratch: fresh buffers again
    assert third[0][0].data_ptr() != scratch[0][0].data_ptr()


def test_a_steady_gather_into_the_scratch_copies_a_session_once_then_commits_keep_it():
    pool = KVPool(KVGeometry.of(TEST, torch.float32), 2, torch.float32, "cpu")
    g = pool.geometry
    room, tpf = g.frames_per_block * g.tokens_per_frame, g.tokens_per_frame
    pool.open("a")
    pool.reserve_scratch(1)
    pool.frame_pos[0] = torch.tensor([*range(g.sink_frames), *range(100 - g.window_frames, 100)])
    pool.k.normal_()
    first, _ = pool.gather(["a"], [100], room)
    held = first[0][0][0, : g.resident_frames * tpf].clone()
    assert torch.equal(held, pool.k[0, 0, : g.resident_frames * tpf])
    pool.k[0, 0].zero_()  # behind the pool's back: a second gather must not copy again
    again, _ = pool.gather(["a"], [100], room)
    assert torch.equal(again[0][0][0, : g.resident_frames * tpf], held)
    block = [(torch.ones(1, room, g.heads, g.head_dim), torch.ones(1, room, g.heads, g.head_dim))] * g.layers
    pool.commit(["a"], [100], block)  # the commit writes the row too
    after, _ = pool.gather(["a"], [100 + g.frames_per_block], room)
    for frame in range(100, 100 + g.frames_per_block):
        dst = pool._index(frame) * tpf
        assert bool((after[0][0][0, dst : dst + tpf] == 1).all())
    pool.gather(["a"], [100 + g.frames_per_block], room=0)  # another layout: the rows move
    pool.k[0, 0].fill_(2.0)  # so the next gather copies again
    moved, _ = pool.gather(["a"], [100 + g.frames_per_block], room)
    assert bool((moved[0][0][0, : g.resident_frames * tpf] == 2).all())


def test_graph_memory_is_planned():
    dtype = torch.bfloat16
    with_graphs, without = fixed_bytes(TEST, dtype, 4, graphs=True), fixed_bytes(TEST, dtype, 4)
    assert graph_bytes(TEST, dtype, 4) > 0
    assert with_graphs - without == pytest.approx(ALLOCATOR_MARGIN * graph_bytes(TEST, dtype, 4), abs=2)


def test_cuda_graphs_config_resolves_per_device():
    def world(**kw):
        return config_from_mapping({"world": {"enabled": True, **kw}}).world

    assert world().graphs is False  # auto on the CPU
    assert world(device="cuda").graphs is True
    assert world(device="cuda", cuda_graphs=False).graphs is False
    with pytest.raises(ConfigError, match="cuda_graphs"):
        world(cuda_graphs=True)  # on the CPU


def test_a_failed_capture_under_auto_leaves_eager_passes(monkeypatch, caplog):
    from realtime.kinds.world import WorldService

    def fail(self, max_batch):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(WorldModel, "capture_graphs", fail)
    service = WorldService.__new__(WorldService)
    service.model = WorldModel.build(TEST, slots=1, seed=5)
    for setting, raises in (("auto", False), (True, True)):
        service.config = config_from_mapping(
            {"world": {"enabled": True, "device": "cuda", "cuda_graphs": setting}}
        ).world
        if raises:
            with pytest.raises(RuntimeError, match="capturing"):
                service._capture_graphs()
            continue
        with caplog.at_level(logging.WARNING, logger="realtime.world"):
            service._capture_graphs()
        assert service.model.graphs is None
        assert (
            "capture failed (RuntimeError: operation not permitted when stream is capturing)" in caplog.text
        )


CUDA_CASES = [
    pytest.param("sdpa", torch.float32, False, id="sdpa-fp32"),
    pytest.param("sdpa", torch.bfloat16, True, id="sdpa-bf16-compiled"),
    pytest.param(
        "flash4",
        torch.bfloat16,
        True,
        id="flash4-bf16-compiled",
        marks=pytest.mark.skipif(
            not (torch.cuda.is_available() and kernel_usable("flash4", torch.device("cuda"))),
            reason="needs a Hopper GPU and the flash4 extra",
        ),
    ),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention,dtype,compiled", CUDA_CASES)
def test_captured_graphs_replay_the_eager_blocks_on_cuda(attention, dtype, compiled):
    plain = WorldModel.build(TEST, slots=4, device="cuda", dtype=dtype, seed=5, attention=attention)
    graphed = WorldModel.build(TEST, slots=4, device="cuda", dtype=dtype, seed=5, attention=attention)
    if compiled:
        plain.dit.compile_blocks()
        graphed.dit.compile_blocks()
    graphed.capture_graphs(3)
    for model in (plain, graphed):
        for i, sid in enumerate(("a", "b", "c")):
            model.open(sid, seed=i)
    steady = plain.pool.geometry.steady_block
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for batch in ([("a",)] * (steady + 2)) + [("a", "b")] * (steady + 1) + [("a", "b", "c")] * (steady + 1):
        ticks = [WorldTick(sid, plain.next_block(sid), "stone", ACTION) for sid in batch]
        torch.testing.assert_close(graphed.generate(ticks), plain.generate(ticks), **tol)
    assert graphed.graphs is not None and graphed.graphs.replayed >= 4 * (len(TEST.sigmas) + 1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a replayed block never makes the host wait
    try:
        ticks = [WorldTick(sid, graphed.next_block(sid), "stone", ACTION) for sid in ("a", "b")]
        graphed.generate(ticks)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_graphs_meet_the_compiled_blocks_warm_up_graphs_and_no_more(rerun_capture):
    """Captured over static buffers and the pool's scratch, a compiled DiT still has the four
    graphs of ``CausalDiT.compile_blocks`` (the static views match what eager gathers pass), and
    serving after the load (capture, then the warm-up) compiles nothing more."""
    from torch._dynamo.testing import CompileCounter

    from realtime.kinds.world import measure_step_seconds

    model = WorldModel.build(TEST, slots=4, dtype=torch.float64, seed=5)
    counter = CompileCounter()
    model.dit.compile_blocks(backend=counter)
    model.capture_graphs(4)  # the world kind's load: capture, then the warm-up
    measure_step_seconds(model, max_batch=4)
    assert counter.frame_count == 4
    plain = WorldModel.build(TEST, slots=4, dtype=torch.float64, seed=5)
    for group in (["a"], ["b", "c", "d"]):  # batch 3: a graph the warm-up never replayed
        for i, sid in enumerate(group):
            model.open(sid, seed=i)
            plain.open(sid, seed=i)
        _schedule(plain, model, [[(sid, "stone") for sid in group]] * (TEST_STEADY + 2))
    assert counter.frame_count == 4, "a session compiled while it was served"
    assert model.graphs is not None and model.graphs.replayed > 0
