"""``WorldModel``: resident world sessions over one DiT, one pooled KV cache and one decoder.

The interface the runtime drives (through the stage engine, on a worker thread):

- ``open(session_id, seed, slot)`` / ``release(session_id)`` / ``reset(session_id)``: per-session slot
  (rolling self-attention KV + prompt cross-attention KV in the pool, decoder temporal cache,
  seed, next block index);
- ``generate(ticks)``: one latent block for each of several sessions in one batched forward
  (staged denoise passes + committing clean pass; with start frames in the weights, a session's
  first block begins from the one its prompt and seed choose, ``start_frames.py``);
  ``decode(session_ids, latents)``: their frames (``uint8 [frames, H, W, 3]``; a session's first
  block gives ``1 + 4(n-1)`` frames, then ``4n``).

Both are transactional per call, and so is ``step`` (``generate`` + ``decode``, the engine's tick):
nothing of a session (KV, cross KV, prompt, block counter, decoder cache) changes unless the whole
call succeeds. A tick must name the session's next block
(``WorldTick.block``), so a replayed or skipped tick is an error, never silent corruption.

Prompt-change policy (``cross_attention_reset``): when a tick carries a prompt different from the
session's, that session's cross-attention K/V are recomputed from the new prompt; the rolling
self-attention KV (the visual history) is kept, so the world continues under the new prompt
(the Self-Forcing / SGLang policy). ``reset`` clears everything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from models.transfer import to_device
from models.world.attention import resolve_kernel
from models.world.checkpoints import dit_state_dict
from models.world.configs import WorldModelConfig, load_model_weights, read_config
from models.world.decoders import Decoder, build_decoder, load_decoder
from models.world.dit import CausalDiT
from models.world.graphs import DiTGraphs
from models.world.kv_cache import KVGeometry, KVPool
from models.world.memory import decoder_state_bytes
from models.world.profiling import OFF, Profiler
from models.world.prompts import PromptContext, WordEmbedding, tokenize
from models.world.sampler import BlockRequest, FlowSampler
from models.world.start_frames import StartFrames, load_start_frames
from models.world.taehv import TAEHVDecoder
from models.world.vae import DecoderState, split_state, stack_states


@dataclass(frozen=True)
class WorldTick:
    """Model input of one session's tick: the block to generate, prompt and the block's action."""

    session_id: str
    block: int
    prompt: str | None
    action: Tensor  # [action_dim], held for the whole block


@dataclass(frozen=True)
class HeldBlock:
    """One block of a session's resident KV as a restore needs it (:meth:`WorldModel.restore`):
    its clean latent ``[frames_per_block, C, h, w]`` as its tick made it, the action it was
    generated under and its prompt. Host tensors: what a checkpoint keeps."""

    block: int
    latent: Tensor
    action: Tensor
    prompt: str | None


def restorable(cfg: WorldModelConfig, held: Sequence[HeldBlock]) -> bool:
    """Whether ``held`` can rebuild a session of a model of ``cfg`` (a replica serving another
    model shape could have written them): the resident blocks of the block after the last, each
    latent of ``cfg``'s block shape."""
    shape = (cfg.frames_per_block, cfg.latent_channels, cfg.latent_height, cfg.latent_width)
    blocks = tuple(h.block for h in held)
    return (
        bool(held)
        and blocks == resident_blocks(cfg, blocks[-1] + 1)
        and all(tuple(h.latent.shape) == shape for h in held)
    )


def resident_blocks(cfg: WorldModelConfig, next_block: int) -> tuple[int, ...]:
    """The blocks with frames in a session's KV before block ``next_block`` (``kv_cache``'s sink
    and window), in order: what a restore rebuilds it from."""
    fpb = cfg.frames_per_block
    sink = range(min(next_block, -(-cfg.sink_frames // fpb)))
    window = range(max(0, (next_block * fpb - cfg.window_frames) // fpb), next_block)
    return tuple(sorted({*sink, *window}))


@dataclass
class _Session:
    seed: int
    decoder: DecoderState
    prompt: str | None = None
    next_block: int = 0
    decoded_blocks: int = 0


@dataclass
class WorldModel:
    cfg: WorldModelConfig
    dit: CausalDiT
    decoder: Decoder
    pool: KVPool
    prompts: PromptContext  # prompts -> text context [B, text_len, text_dim] (models.world.prompts)
    starts: StartFrames | None = None  # a session's first block begins from one (start_frames.py)
    sessions: dict[str, _Session] = field(default_factory=dict)
    graphs: DiTGraphs | None = None  # capture_graphs: CUDA graphs of the DiT's steady and first passes
    profiler: Profiler = OFF  # stage timing (models.world.profiling): the sampler marks the DiT passes

    @classmethod
    def build(
        cls,
        cfg: WorldModelConfig,
        slots: int,
        weights: Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        attention: str = "sdpa",
        profiler: Profiler = OFF,
        checkpoint: Path | None = None,
        vae: Path | None = None,
        prompts: PromptContext | None = None,
    ) -> WorldModel:
        """Random init from ``seed``, eval mode, a pool of ``slots`` sessions; then the weights:

        - ``weights``: a model file of our layout (``dit.*``, ``decoder.*``, ``text.*``, start frames);
        - ``checkpoint``: a Self-Forcing / CausVid DiT checkpoint (``models.world.checkpoints``);
        - ``vae``: the decoder's file (``models.world.decoders``): Wan 2.1's ``Wan2.1_VAE.pth``
          (``cfg.vae`` ``wan2.1``), TAEHV's ``taew2_1.pth`` (``taehv``); without it, random;
        - ``prompts``: the text context of prompts (umT5 embeddings), required where ``cfg`` has no
          word vocabulary of its own (``models.world.prompts``).

        ``attention``: the DiT's attention kernel, ``auto`` or one of ``Kernel``
        (``models.world.attention.resolve_kernel``). ``profiler``: stage timing
        (``models.world.profiling``; off by default)."""
        if prompts is None and not cfg.text_vocab:
            raise ValueError(f"{cfg.name} takes umT5 prompt embeddings: a text encoder or an embeddings file")
        torch.manual_seed(seed)
        with torch.device(device):  # init where the model runs: no host copy of a 2 B-param DiT
            dit = CausalDiT(cfg)
            words = WordEmbedding(cfg) if prompts is None else None
            decoder = build_decoder(cfg)
        if weights is not None:
            load_model_weights(dit, weights, "dit.")
            load_model_weights(decoder, weights, "decoder.")
            if words is not None:
                load_model_weights(words, weights, "text.")
        if checkpoint is not None:
            dit.load_state_dict(dit_state_dict(checkpoint, cfg))
        if vae is not None:
            decoder = load_decoder(cfg, vae, device=device, dtype=dtype)
        dit = dit.to(device=device, dtype=dtype).eval().requires_grad_(False)
        dit.attention = resolve_kernel(attention, device, dtype)
        decoder = decoder.to(device=device, dtype=dtype).eval().requires_grad_(False)
        if words is not None:
            prompts = words.to(device=device, dtype=dtype).eval().requires_grad_(False)
        assert prompts is not None
        pool = KVPool(KVGeometry.of(cfg, dtype), slots, dtype, device)
        starts = load_start_frames(weights) if weights is not None else None
        return cls(
            cfg, dit, decoder, pool, prompts, starts.to(device, dtype) if starts else None, profiler=profiler
        )

    @classmethod
    def from_weights(cls, path: Path, slots: int, **kw) -> WorldModel:
        return cls.build(read_config(path), slots, weights=path, **kw)

    def compile_decoder(self, backend: str | Callable = "inductor") -> None:
        """``torch.compile`` the decoder where that was measured to pay (``world.compile``): TAEHV's,
        whose convolutions then run with their concatenations, activations and layout changes
        fused around them (one steady block, 3 latents to 12 frames at 480x832 in bf16 on an H100:
        12.5 -> 6.9 ms). Wan's VAE decoder and the small causal one stay eager. Batch sizes from 2
        on share one graph (dynamo's automatic dynamic shapes), so the load's warm-up
        (``measure_step_seconds``, which decodes every probe's blocks) compiles them all.
        ``backend``: ``torch.compile``'s (tests count compilations)."""
        if isinstance(self.decoder, TAEHVDecoder):
            self.decoder.compile(backend=backend)

    def capture_graphs(self, max_batch: int) -> None:
        """Replay the DiT's steady and first-block passes from CUDA graphs for batches of up to
        ``max_batch`` sessions (capped at the pool's slots; ``models.world.graphs``). Raises,
        leaving the model as it was but for the pool's gather scratch, if a capture fails or
        mismatches."""
        graphs = DiTGraphs(self.dit, self.pool, min(max_batch, self.pool.slots))
        graphs.capture()
        self.graphs = graphs

    @property
    def decoder_state_bytes(self) -> int:
        return decoder_state_bytes(self.cfg, self.pool.k.dtype)

    @property
    def bytes_per_session(self) -> int:
        """Resident bytes one session holds: KV slot (self + cross) plus decoder temporal cache."""
        return self.pool.geometry.bytes_per_session + self.decoder_state_bytes

    def open(self, session_id: str, seed: int, slot: int | None = None) -> None:
        """Give the session a pool slot (``slot``: the runtime slot table's index) and fresh state."""
        self.pool.open(session_id, slot)
        self.sessions[session_id] = _Session(seed=seed, decoder=self.decoder.init_state())

    def release(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        self.pool.release(session_id)

    def reset(self, session_id: str, seed: int | None = None) -> None:
        old = self.sessions[session_id]
        self.pool.clear(session_id)
        self.sessions[session_id] = _Session(
            seed=old.seed if seed is None else seed, decoder=self.decoder.init_state()
        )

    def next_block(self, session_id: str) -> int:
        return self.sessions[session_id].next_block

    def init_decoder_state(self) -> DecoderState:
        return self.decoder.init_state()

    def generate(self, ticks: Sequence[WorldTick]) -> Tensor:
        """One latent block per tick in one batched forward; returns x0 ``[B, fpb, C, h, w]``."""
        self.profiler.mark("begin")
        x0, commit = self._generate(ticks)
        commit()
        self.profiler.mark("committed")
        return x0

    def decode(self, session_ids: Sequence[str], latents: Tensor) -> list[Tensor]:
        """Frames ``uint8 [T, H, W, 3]`` (CPU) of each session's block; sessions batch by phase."""
        frames, commit = self._decode(session_ids, latents)
        commit()
        return frames

    def step(self, ticks: Sequence[WorldTick]) -> list[Tensor]:
        """``generate`` then ``decode`` as one transaction: frames for each tick."""
        x0, commit_blocks = self._generate(ticks)
        frames, commit_decoder = self._decode([t.session_id for t in ticks], x0)
        commit_blocks()  # commit point: nothing of any session changed before this line
        commit_decoder()
        return frames

    def restore(self, session_id: str, seed: int, held: Sequence[HeldBlock]) -> None:
        """Rebuild the state of a session moved here from another replica from the blocks its KV
        held there (``held``: :func:`resident_blocks`' blocks, in order): each block's clean pass,
        against the blocks restored before it and under its own prompt and action, writes its K/V
        as its tick did; the session goes on at the block after the last, under the last prompt.

        Exact while no frame had left the window (each block then sees what it saw when it was
        made); later, a block's K/V lack the frames that had already left when it was made. Costs
        one DiT pass per held block (a tick costs ``len(cfg.sigmas) + 1``). Not transactional: a
        restore that raises leaves the session to be reset. The decoder's cache is its stage's
        (``models.world.stage``)."""
        self.reset(session_id, seed)
        session = self.sessions[session_id]
        for h in held:
            session.next_block = h.block
            tick = WorldTick(session_id, h.block, h.prompt, h.action)
            latent = to_device(h.latent, self.pool.k)[None]
            _, commit = self._generate([tick], clean=latent)
            commit()

    @torch.no_grad()
    def _generate(
        self, ticks: Sequence[WorldTick], clean: Tensor | None = None
    ) -> tuple[Tensor, Callable[[], None]]:
        """x0 of each tick's block and the commit that writes its KV (nothing written before);
        with ``clean`` (the blocks' x0, ``[B, fpb, C, h, w]``) no denoising: only the clean pass."""
        cfg = self.cfg
        states = [self.sessions[t.session_id] for t in ticks]
        for t, s in zip(ticks, states, strict=True):
            if t.block != s.next_block:
                raise ValueError(f"session {t.session_id}: tick for block {t.block}, expected {s.next_block}")
        ids = [t.session_id for t in ticks]
        reqs = [
            BlockRequest(
                t.session_id,
                t.block,
                s.seed,
                # a model without actions (text-to-video: Self-Forcing, CausVid) takes none of them
                t.action.reshape(1, -1)[:, : cfg.action_dim].expand(cfg.frames_per_block, -1),
                self.starts.choose(tokenize(t.prompt, cfg), s.seed) if self.starts and t.block == 0 else None,
            )
            for t, s in zip(ticks, states, strict=True)
        ]
        cross = self.pool.cross(ids)
        changed = [i for i, (t, s) in enumerate(zip(ticks, states, strict=True)) if t.prompt != s.prompt]
        if changed:
            context = self.prompts([ticks[i].prompt for i in changed]).to(self.pool.k)
            fresh = self.dit.cross_kv(context)
            index = to_device(torch.tensor(changed), self.pool.k, torch.long)
            cross = [
                (k.index_copy(0, index, fk), v.index_copy(0, index, fv))
                for (k, v), (fk, fv) in zip(cross, fresh, strict=True)
            ]
        sampler = FlowSampler(self.dit, self.pool, self.graphs, self.profiler)
        past, mask = sampler.past(reqs)
        x0 = sampler.denoise(reqs, cross, past, mask) if clean is None else clean
        kv = sampler.clean_pass(reqs, x0, past, mask, cross)

        def commit() -> None:
            self.pool.commit(ids, [r.block * cfg.frames_per_block for r in reqs], kv)
            if changed:
                self.pool.set_cross([ids[i] for i in changed], [(k[index], v[index]) for k, v in cross])
            for t, s in zip(ticks, states, strict=True):
                s.prompt = t.prompt
                s.next_block += 1

        return x0, commit

    @torch.no_grad()
    def decode_blocks(
        self, latents: Tensor, states: Sequence[DecoderState], host: bool = True
    ) -> tuple[list[Tensor], list[DecoderState]]:
        """Pure: frames ``uint8 [T, H, W, 3]`` of each block and each decoder state after it; on
        the CPU, or with ``host=False`` left on the model's device (the decoder stage copies them
        itself, into pinned memory without a wait per session).

        Sessions batch by phase (a first block decodes to fewer frames). Nothing is stored: the
        caller owns the decoder states (``step`` keeps them per session; the decoder stage per slot).
        """
        out: list[Tensor | None] = [None] * len(states)
        after: list[DecoderState | None] = [None] * len(states)
        for first in (True, False):
            group = [i for i, st in enumerate(states) if st.first == first]
            if not group:
                continue
            frames, state = self.decoder(latents[group], stack_states([states[i] for i in group]))
            for j, (i, st) in enumerate(zip(group, split_state(state, len(group)), strict=True)):
                pixels = (frames[j] * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
                out[i] = pixels.cpu() if host else pixels
                after[i] = st
        return out, after  # type: ignore[return-value]

    def _decode(self, session_ids: Sequence[str], latents: Tensor) -> tuple[list[Tensor], Callable[[], None]]:
        """Each session's frames and the commit that advances its decoder cache."""
        frames, after = self.decode_blocks(latents, [self.sessions[s].decoder for s in session_ids])

        def commit() -> None:
            for sid, st in zip(session_ids, after, strict=True):
                self.sessions[sid].decoder = st
                self.sessions[sid].decoded_blocks += 1

        return frames, commit
