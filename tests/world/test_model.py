"""Correctness of the causal world model (realtime-world-models.md §6.3), on small random weights.

Exact properties run in float64 (tolerance 1e-10); "bit-identical" properties use torch.equal.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from models.world.configs import TEST
from models.world.dit import block_causal_mask
from models.world.model import WorldTick
from models.world.sampler import BlockRequest, recompute_generate, recompute_x0, x0_from_flow
from tests.world.helpers import action, block_inputs, make_model, tick

TOL = 1e-10
BLOCKS = 8  # with fpb=2, sink=1, window=4: eviction starts at block 3


def _rollout(model, sid, n, actions=None, prompt="stone maze"):
    out = []
    for i in range(n):
        act = action(i) if actions is None else actions[i]
        out.append(model.generate([tick(model, sid, i, prompt, act)])[0])
    return out


def test_block_causal_mask_window_and_sink():
    frames = torch.arange(10)
    m = block_causal_mask(frames, frames, frames_per_block=2, sink=1, window=4)
    # block 4 (frames 8, 9) sees sink frame 0, window frames 4..7, its own block; not 1..3
    assert m[8].tolist() == [True, False, False, False, True, True, True, True, True, True]
    assert not m[1, 2] and m[2, 1] and m[3, 2]  # block-causal, bidirectional inside a block


def test_cached_forward_equals_full_masked_recompute_per_forward():
    model = make_model(slots=1)
    cfg = model.cfg
    model.open("s", seed=3)
    history, hist_actions = [], []
    cross = model.dit.cross_kv(model.prompts(["stone maze"]))
    model.pool.set_cross(["s"], cross)
    model.sessions["s"].prompt = "stone maze"
    worst = 0.0
    mutated = []
    for b in range(BLOCKS):
        x, pos, timesteps, acts = block_inputs(cfg, b)  # at the schedule's step 1: sigma 0.5
        room = cfg.frames_per_block * cfg.tokens_per_frame
        past, key_mask = model.pool.gather(["s"], [b * cfg.frames_per_block], room=room)
        mask = None
        if key_mask is not None:
            new = key_mask.new_ones(1, cfg.frames_per_block * cfg.tokens_per_frame)
            mask = torch.cat([key_mask, new], 1)[:, None, None]
        flow, _ = model.dit(x, pos, timesteps, acts, cross, mask, past)
        cached = x0_from_flow(x, flow, cfg.sigmas[1])
        if history:
            h = torch.cat(history, 1)
            ha = torch.cat(hist_actions, 1)
            hpos = torch.arange(h.shape[1])
        else:
            h = x[:, :0]
            ha = acts[:, :0]
            hpos = torch.arange(0)
        ref = recompute_x0(model.dit, h, hpos, ha, x, b, 1, acts, cross)
        worst = max(worst, float((cached - ref).abs().max()))
        if b >= 3:  # mutation: a reference that evicts one frame too early must disagree
            shrunk = dataclasses.replace(cfg, window_frames=cfg.window_frames - 1)
            model.dit.cfg = shrunk
            try:
                bad = recompute_x0(model.dit, h, hpos, ha, x, b, 1, acts, cross)
            finally:
                model.dit.cfg = cfg
            mutated.append(float((cached - bad).abs().max()))
        x0 = model.generate([WorldTick("s", b, "stone maze", action(b))])
        history.append(x0)
        hist_actions.append(acts)
    assert worst < TOL
    assert min(mutated) > 1e-4


def test_cached_rollout_equals_recompute_rollout():
    model = make_model(slots=1)
    cfg = model.cfg
    model.open("s", seed=11)
    cached = _rollout(model, "s", BLOCKS)
    cross = model.dit.cross_kv(model.prompts(["stone maze"]))
    history = torch.zeros(1, 0, cfg.latent_channels, cfg.latent_height, cfg.latent_width, dtype=torch.float64)
    hist_actions = torch.zeros(1, 0, cfg.action_dim, dtype=torch.float64)
    for b in range(BLOCKS):
        acts = action(b).expand(cfg.frames_per_block, -1).to(torch.float64)
        req = BlockRequest("s", b, 11, acts)
        x0 = recompute_generate(
            model.dit, history, torch.arange(history.shape[1]), hist_actions, [req], cross
        )
        assert float((x0[0] - cached[b]).abs().max()) < TOL, f"block {b}"
        history = torch.cat([history, x0], 1)
        hist_actions = torch.cat([hist_actions, acts[None]], 1)


def test_action_causality_earlier_blocks_bit_identical():
    a, b = make_model(slots=1), make_model(slots=1)
    a.open("s", seed=5)
    b.open("s", seed=5)
    acts = [action(i) for i in range(7)]
    changed = list(acts)
    changed[5] = torch.tensor([0.0, 0.0, 0.0, 1.0, -1.0, 0.5])
    xa = _rollout(a, "s", 7, acts)
    xb = _rollout(b, "s", 7, changed)
    for i in range(5):
        assert torch.equal(xa[i], xb[i]), f"block {i} changed"
    assert float((xa[5] - xb[5]).abs().max()) > 1e-3


def test_reset_then_replay_equals_fresh_session():
    model = make_model(slots=2)
    model.open("fresh", seed=9)
    fresh = _rollout(model, "fresh", 5)
    model.open("s", seed=9)
    _rollout(model, "s", 3, [action(i + 40) for i in range(3)], prompt="ice")
    model.reset("s")
    replay = _rollout(model, "s", 5)
    assert all(torch.equal(x, y) for x, y in zip(fresh, replay, strict=True))
    model.reset("s", seed=10)
    assert not torch.equal(_rollout(model, "s", 1)[0], fresh[0])


def test_interleaved_sessions_equal_sessions_alone():
    alone = {}
    for sid, seed in (("a", 1), ("b", 2)):
        m = make_model(slots=1)
        m.open(sid, seed=seed)
        alone[sid] = _rollout(m, sid, 5, [action(i + seed) for i in range(5)])
    m = make_model(slots=2)
    m.open("a", seed=1)
    m.open("b", seed=2)
    inter = {"a": [], "b": []}
    for i in range(5):
        for sid, seed in (("b", 2), ("a", 1)):
            inter[sid].append(m.generate([tick(m, sid, i, act=action(i + seed))])[0])
    for sid in ("a", "b"):
        assert all(torch.equal(x, y) for x, y in zip(alone[sid], inter[sid], strict=True))


def test_four_sessions_batched_equal_alone_with_different_histories():
    seeds = {"a": 1, "b": 2, "c": 3, "d": 4}
    starts = {"a": 0, "b": 1, "c": 3, "d": 4}  # sessions joined at different blocks
    total = 7

    def act(sid, i):
        return action(i * 3 + seeds[sid])

    alone = {}
    for sid in seeds:
        m = make_model(slots=1)
        m.open(sid, seed=seeds[sid])
        alone[sid] = [m.generate([tick(m, sid, i, act=act(sid, i))])[0] for i in range(total - starts[sid])]
    m = make_model(slots=4)
    batched = {sid: [] for sid in seeds}
    for step in range(total):
        live = [sid for sid in seeds if step >= starts[sid]]
        for sid in live:
            if sid not in m.sessions:
                m.open(sid, seed=seeds[sid])
        ticks = [tick(m, sid, m.next_block(sid), act=act(sid, m.next_block(sid))) for sid in live]
        for sid, x in zip(live, m.generate(ticks), strict=True):
            batched[sid].append(x)
    for sid in seeds:
        for x, y in zip(alone[sid], batched[sid], strict=True):
            assert float((x - y).abs().max()) < TOL


def test_chunked_decode_equals_whole_clip_decode():
    model = make_model(slots=1)
    cfg = model.cfg
    z = torch.randn(1, 6, cfg.latent_channels, cfg.latent_height, cfg.latent_width, dtype=torch.float64)
    whole, _ = model.decoder(z, model.decoder.init_state())
    state, parts = model.decoder.init_state(), []
    for i in range(0, 6, 2):
        frames, state = model.decoder(z[:, i : i + 2], state)
        parts.append(frames)
    assert [p.shape[1] for p in parts] == [5, 8, 8] == [cfg.frames_for_block(i == 0) for i in range(3)]
    assert whole.shape[1] == 1 + 4 * 5
    assert float((torch.cat(parts, 1) - whole).abs().max()) < 1e-12
    # the cache matters: decoding chunk 2 with a fresh (non-first) state gives different frames
    fresh = dataclasses.replace(model.decoder.init_state(), first=False)
    alone, _ = model.decoder(z[:, 2:4], fresh)
    assert float((alone - parts[1]).abs().max()) > 1e-6


def test_decode_frame_counts_per_session_phase():
    model = make_model(slots=2)
    model.open("a", seed=1)
    model.open("b", seed=2)
    first = model.step([tick(model, "a", 0)])
    both = model.step([tick(model, "a", 1), tick(model, "b", 0)])
    h, w = TEST.frame_height, TEST.frame_width
    assert first[0].shape == (5, h, w, 3) and first[0].dtype == torch.uint8
    assert [f.shape[0] for f in both] == [8, 5]


def test_failed_tick_leaves_cache_and_counters_unchanged(monkeypatch):
    model = make_model(slots=1)
    model.open("s", seed=1)
    _rollout(model, "s", 3)
    before = model.pool.snapshot("s")
    decoder_before = [c.clone() for c in model.sessions["s"].decoder.caches]
    calls = {"n": 0}
    real = model.dit.forward

    def exploding(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # second denoise pass of block 3
            raise RuntimeError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(model.dit, "forward", exploding)
    with pytest.raises(RuntimeError, match="injected"):
        model.generate([tick(model, "s", 3, prompt="a new prompt")])
    after = model.pool.snapshot("s")
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    assert model.next_block("s") == 3 and model.sessions["s"].prompt == "stone maze"
    assert all(
        torch.equal(x, y) for x, y in zip(decoder_before, model.sessions["s"].decoder.caches, strict=True)
    )
    with pytest.raises(ValueError, match="expected 3"):
        model.generate([WorldTick("s", 4, None, action(0))])


def test_prompt_change_resets_cross_attention_only():
    model = make_model(slots=1)
    model.open("s", seed=1)
    _rollout(model, "s", 2)
    k, v, ck, cv, pos = model.pool.snapshot("s")
    x_new = model.generate([tick(model, "s", 2, prompt="forest")])
    k2, v2, ck2, cv2, pos2 = model.pool.snapshot("s")
    expected = model.dit.cross_kv(model.prompts(["forest"]))
    assert all(torch.equal(ck2[layer], expected[layer][0][0]) for layer in range(model.cfg.depth))
    assert not torch.equal(ck, ck2)
    # the self-attention history is kept: frames still resident are untouched, block 2 was added
    kept = [
        i for i, (f, f2) in enumerate(zip(pos.tolist(), pos2.tolist(), strict=True)) if f >= 0 and f == f2
    ]
    assert len(kept) == 3 and sorted(pos2.tolist()) == [0, 2, 3, 4, 5]
    tpf = model.cfg.tokens_per_frame
    for i in kept:
        assert torch.equal(k[:, i * tpf : (i + 1) * tpf], k2[:, i * tpf : (i + 1) * tpf])
    assert x_new.shape[1] == model.cfg.frames_per_block


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_resident_memory_flat_over_1000_blocks():
    cfg = dataclasses.replace(
        TEST, latent_height=4, latent_width=4, depth=1, dim=16, ffn_dim=16, sigmas=(1.0,)
    )
    model = make_model(slots=1, dtype=torch.float32, cfg=cfg)
    model.open("s", seed=1)
    ptrs = (model.pool.k.data_ptr(), model.pool.v.data_ptr())
    bytes0 = model.pool.resident_bytes
    for i in range(50):
        model.generate([tick(model, "s", i, act=action(i))])
    rss0 = _rss_bytes()
    for i in range(50, 1000):
        model.generate([tick(model, "s", i, act=action(i))])
    assert model.next_block("s") == 1000
    assert (model.pool.k.data_ptr(), model.pool.v.data_ptr()) == ptrs
    assert model.pool.resident_bytes == bytes0
    resident = sorted(f for f in model.pool.frame_pos[0].tolist() if f >= 0)
    assert resident == [0, 1996, 1997, 1998, 1999]  # sink frame 0 + the 4-frame window
    assert _rss_bytes() - rss0 < 8 * 2**20


def test_failed_decode_in_step_leaves_the_kv_uncommitted(monkeypatch):
    """``step`` (the engine's tick) is one transaction: a decoder failure after the clean pass
    commits nothing, so the block can be generated again."""
    model = make_model(slots=1)
    model.open("s", seed=1)
    model.step([tick(model, "s", 0)])
    before = model.pool.snapshot("s")

    def exploding(*args, **kwargs):
        raise RuntimeError("injected decode failure")

    monkeypatch.setattr(model.decoder, "forward", exploding)
    with pytest.raises(RuntimeError, match="injected"):
        model.step([tick(model, "s", 1)])
    assert all(torch.equal(x, y) for x, y in zip(before, model.pool.snapshot("s"), strict=True))
    assert model.next_block("s") == 1 and model.sessions["s"].decoded_blocks == 1
    monkeypatch.undo()
    assert model.step([tick(model, "s", 1)])[0].shape[0] == 8
