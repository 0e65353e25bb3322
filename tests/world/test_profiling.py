"""``models.world.profiling``: the stage-timing seam. Off by default (no marks, no timings); on,
each thread collects its own marks, and a block's marks resolve to its ``BlockTimings``."""

import threading

import torch

from models.stage import StageItem
from models.world.configs import TEST
from models.world.model import WorldModel, WorldTick
from models.world.profiling import OFF, DeviceProfiler, block_timings
from models.world.stage import WorldBlockInput, WorldBlockStage, WorldDecodeStage


def _one_block(model: WorldModel):
    dit, decode = WorldBlockStage(model), WorldDecodeStage(model)
    dit.open_state("a", 0)
    decode.open_state("a", 0)
    tick = WorldTick("a", 0, "stone", torch.zeros(TEST.action_dim))
    (block,) = dit.forward([StageItem("a", 0, WorldBlockInput(tick, seed=1), slot=0)])
    (frames,) = decode.forward([StageItem("a", 0, block, slot=0)])
    return block, frames


def test_timing_is_off_by_default_and_marks_nothing():
    model = WorldModel.build(TEST, slots=1, seed=3)
    assert model.profiler is OFF
    block, frames = _one_block(model)
    assert block.marks == {} and block.previous is None and frames.timings is None


def test_on_the_marks_of_a_block_resolve_to_its_timings():
    block, frames = _one_block(WorldModel.build(TEST, slots=1, seed=3, profiler=DeviceProfiler(cuda=False)))
    assert list(block.marks) == ["begin", "denoise", "denoised", "clean", "cleaned", "committed"]
    t = frames.timings
    assert t is not None and t.gap_ms == t.idle_ms == 0.0 and min(t.denoise_ms, t.clean_ms, t.decode_ms) > 0


def test_each_thread_collects_its_own_marks_and_marks_outside_a_collect_are_dropped():
    profiler = DeviceProfiler(cuda=False)
    profiler.mark("nowhere")  # no collect on this thread: nothing to record into
    seen: dict[str, list[str]] = {}

    def work(name: str, started: threading.Barrier) -> None:
        with profiler.collect() as marks:
            started.wait()
            profiler.mark(name)
            started.wait()
        seen[name] = list(marks)

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=work, args=(n, barrier)) for n in ("decode", "denoise")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"decode": ["decode"], "denoise": ["denoise"]}
    with profiler.collect() as outer:
        with profiler.collect() as inner:
            profiler.mark("clean")
        profiler.mark("cleaned")
    assert list(inner) == ["clean"] and list(outer) == ["cleaned"]


def test_a_block_without_every_mark_has_no_timings():
    marks = {"begin": -0.01, "denoise": 0.0, "denoised": 0.1, "clean": 0.1, "cleaned": 0.2, "committed": 0.21}
    decode = {"decode": 0.3, "decoded": 0.4, "copied": 0.45}
    assert block_timings(1.0, 5.0, marks, None, decode) is not None
    assert block_timings(1.0, 5.0, marks, None, {}) is None
    assert block_timings(1.0, 5.0, {"denoise": 0.0}, None, decode) is None
    gapped = block_timings(1.0, 5.0, marks, {"cleaned": -0.05}, decode)
    assert gapped is not None and abs(gapped.gap_ms - 50.0) < 1e-9 and gapped.idle_ms == 0.0


def test_idle_is_the_dit_streams_wait_from_the_previous_commit_to_this_forwards_first_work():
    """``gap`` = the previous commit, then idle, then this forward's inputs (host clocks here)."""
    marks = {"begin": -0.02, "denoise": 0.0, "denoised": 0.1, "clean": 0.1, "cleaned": 0.2, "committed": 0.21}
    decode = {"decode": 0.3, "decoded": 0.4, "copied": 0.45}
    t = block_timings(1.0, 5.0, marks, {"cleaned": -0.05, "committed": -0.045}, decode)
    assert t is not None and abs(t.gap_ms - 50.0) < 1e-9 and abs(t.idle_ms - 25.0) < 1e-9
