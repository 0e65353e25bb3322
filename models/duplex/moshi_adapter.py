"""``MoshiDuplexStage``: Kyutai's Moshi (``moshi`` package: ``LMGen`` + Mimi) behind the duplex stage
interface of :mod:`models.duplex.stage`.

Batched across sessions: one ``LMGen`` and one Mimi stream with batch ``slot_capacity``, row
``i`` = slot ``i``. Moshi's streaming modules keep per-row offsets and honour an ``exec_mask``
(rows outside it keep their state untouched) and per-row ``reset_streaming(mask)``, so sessions
at different positions step together. Each forward computes every row of the pool (masked rows
are computed and discarded): its cost follows ``slot_capacity``, not the batch.

Differences from the embedded stage, all Moshi's own behaviour:

- The context policy is ``"roll"``: Moshi's KV is a ring of ``context`` frames (no sink).
- Moshi delays its acoustic codebooks (``delays``), so the first ``max_delay + 1`` output frames
  of a session have no tokens yet: they are silence, listening, no text (as in Moshi's server).
- Sampling uses torch's global RNG (``LMGen``'s top-k sampling): not reproducible per session.
- Not transactional: Moshi's state advances in place. A step that raises resets the rows of the
  batch and returns :class:`DuplexStepFailed` for each of its items (those sessions fail) instead
  of raising, so the engine never re-runs a half-advanced batch.
- Speaking = the text token is a word (not Moshi's PAD ``3`` / end-of-padding ``0``).
- No context restore: a session resumed on another replica starts with an empty context
  (:meth:`MoshiDuplexStage.context_log` is None, so its checkpoints hold no model context, and an
  input carrying one fails with ``ContextRestoreFailed``). Rebuilding ``LMGen``'s state would need
  its delayed-codebook token cache and each streaming module's per-row offsets set from outside
  the package; the embedded Moshi-shaped stage (``stage.py``) restores its KV from tokens.

``torch.compile`` (which ``moshi`` applies lazily to a few functions) is disabled during steps
unless ``compile=True``: on the CPU the first compiled step costs tens of seconds.

Loading real Moshi weights from a local folder (for example a download of
``kyutai/moshiko-pytorch-bf16``; nothing is fetched here)::

    stage = MoshiDuplexStage.from_config(
        device="cuda", slot_capacity=8, dtype=torch.bfloat16,
        lm_weights=folder / "model.safetensors",  # lm_kwargs=None: Moshi-7B's shapes
        mimi_weights=folder / "tokenizer-e351c8d8-checkpoint125.safetensors",
        tokenizer=folder / "tokenizer_spm_32k_3.model",
    )

Without weight files the same call builds random weights (``SMALL_LM_KWARGS`` /
``SMALL_MIMI_CONFIG`` give a 0.3 M-parameter LM and a 0.5 M-parameter Mimi for tests).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.duplex.stage import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    SILENCE,
    DuplexInput,
    DuplexOutput,
    DuplexStepFailed,
    step_ready,
)
from models.stage import StageItem

MOSHI_PADS = (0, 3)  # end-of-padding and PAD in Moshi's text vocabulary

# A tiny random Moshi LM (Moshi's layout kept: text + 8 model + 8 user codebooks, delays as released).
SMALL_LM_KWARGS: dict[str, Any] = {
    "dim": 64,
    "num_heads": 4,
    "num_layers": 2,
    "text_card": 128,
    "card": 64,
    "context": 64,
    "depformer_dim": 32,
    "depformer_dim_feedforward": 64,
    "depformer_num_heads": 2,
    "depformer_num_layers": 1,
}
# Overrides of Mimi's config (SEANet, RVQ, transformer) for a tiny random codec.
SMALL_MIMI_CONFIG: dict[str, dict[str, Any]] = {
    "seanet": {"n_filters": 8, "dimension": 64},
    "quantizer": {"dimension": 16, "bins": 64, "input_dimension": 64, "output_dimension": 64},
    "transformer": {
        "d_model": 64,
        "num_heads": 2,
        "num_layers": 1,
        "dim_feedforward": 128,
        "input_dimension": 64,
        "output_dimensions": [64],
    },
}


def _tensors(obj: Any, seen: set[int], depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor reachable from a streaming state (dataclass fields, nested caches)."""
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list | tuple):
        for x in obj:
            yield from _tensors(x, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for x in vars(obj).values():
            yield from _tensors(x, seen, depth + 1)


class MoshiDuplexStage:
    name = "duplex"
    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES
    context_policy = "roll"

    def __init__(
        self,
        lm_gen: Any,
        mimi: Any,
        device: str,
        slot_capacity: int,
        tokenizer: Any = None,
        compile: bool = False,
    ) -> None:
        if mimi.frame_size != FRAME_SAMPLES or int(mimi.sample_rate) != SAMPLE_RATE:
            raise ValueError(f"Mimi frames must be {FRAME_SAMPLES} samples at {SAMPLE_RATE} Hz")
        self.lm_gen, self.mimi, self.tokenizer = lm_gen, mimi, tokenizer
        self.device, self.slot_capacity, self.compile = device, slot_capacity, compile
        self.context = int(lm_gen.lm_model.context)
        lm_gen.streaming_forever(slot_capacity)
        mimi.streaming_forever(slot_capacity)
        self.steps = np.zeros(slot_capacity, dtype=np.int64)
        self._state_bytes = self._measure_state_bytes()

    @classmethod
    def from_config(
        cls,
        device: str = "cpu",
        slot_capacity: int = 4,
        lm_kwargs: dict[str, Any] | None = None,
        mimi_config: dict[str, dict[str, Any]] | None = None,
        lm_weights: Path | None = None,
        mimi_weights: Path | None = None,
        tokenizer: Path | None = None,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        compile: bool = False,
        **sampling: Any,
    ) -> MoshiDuplexStage:
        """Build Moshi from ``moshi.models.loaders``: ``lm_kwargs`` / ``mimi_config`` override Moshi's
        own configs (None: Moshi-7B / Mimi as released), weights from local files or random from
        ``seed``. ``sampling`` goes to ``LMGen`` (``temp``, ``temp_text``, ``top_k``, ``top_k_text``)."""
        from moshi.models import LMGen, loaders

        torch.manual_seed(seed)
        lm_config = None if lm_kwargs is None else {**loaders._lm_kwargs, **lm_kwargs}
        lm = loaders.get_moshi_lm(lm_weights, lm_kwargs=lm_config, device=device, dtype=dtype)
        mimi_cfg = copy.deepcopy(loaders._mimi_config)
        for part, overrides in (mimi_config or {}).items():
            mimi_cfg[part].update(overrides)
        num_codebooks = lm.dep_q
        mimi = loaders.get_mimi(mimi_weights, mimi_cfg, device=device, num_codebooks=num_codebooks)
        text = None
        if tokenizer is not None:
            import sentencepiece

            text = sentencepiece.SentencePieceProcessor(str(tokenizer))  # type: ignore[call-arg]
        return cls(
            LMGen(lm, support_out_of_sync=True, **sampling), mimi, device, slot_capacity, text, compile
        )

    def _measure_state_bytes(self) -> int:
        seen: set[int] = set()
        states = [*self.lm_gen.get_streaming_state().values(), *self.mimi.get_streaming_state().values()]
        total = sum(t.numel() * t.element_size() for s in states for t in _tensors(s, seen))
        return total // self.slot_capacity + self.steps.itemsize

    def state_bytes(self) -> int:
        """Resident bytes of one row: every tensor of Moshi's and Mimi's streaming states (KV
        rings, conv buffers, token caches) over the pool's rows."""
        return self._state_bytes

    def silence(self) -> DuplexInput:
        return SILENCE

    def context_log(self) -> None:
        """None: this adapter keeps no context for checkpoints (module docstring)."""
        return None

    def _reset(self, slots: Sequence[int]) -> None:
        mask = torch.zeros(self.slot_capacity, dtype=torch.bool)
        mask[list(slots)] = True
        self.lm_gen.reset_streaming(mask)
        self.mimi.reset_streaming(mask)
        self.steps[list(slots)] = 0

    def open_state(self, session_id: str, slot: int) -> str:
        self._reset([slot])
        return session_id

    def release_state(self, session_id: str, slot: int, state: Any) -> None:
        self._reset([slot])

    def forward(self, items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        return step_ready(items, lambda slot: None, self._guarded_step)

    def _guarded_step(self, items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        slots = [item.slot for item in items]
        try:
            return self._step(slots, items)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - Moshi's state is half-advanced: fail these rows
            self._reset(slots)  # type: ignore[arg-type]
            failed = DuplexStepFailed(f"moshi step failed: {type(exc).__name__}")
            return [failed] * len(items)

    def _step(self, slots: list[int], items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        from moshi.utils.compile import no_compile

        pcm = torch.zeros(self.slot_capacity, 1, FRAME_SAMPLES)
        pcm[slots, 0] = torch.from_numpy(np.stack([item.payload.pcm for item in items]))
        mask = torch.zeros(self.slot_capacity, dtype=torch.bool)
        mask[slots] = True
        with torch.no_grad(), nullcontext() if self.compile else no_compile():
            self.mimi.set_exec_mask(mask)
            self.lm_gen.set_exec_mask(mask)
            codes = self.mimi.encode(pcm.to(self.device, next(self.mimi.parameters()).dtype))
            tokens = self.lm_gen.step(codes)[:, :, 0]  # [slots, 1 + dep_q]; < 0 = not generated yet
            audio = self.mimi.decode(tokens[:, 1:, None].clamp(min=0))[:, 0]
        rows = tokens[slots].cpu()
        audio_np = audio[slots].float().cpu().numpy()
        steps = self.steps[slots].copy()
        self.steps[slots] = steps + 1
        out: list[DuplexOutput | Exception] = []
        for b, step in enumerate(steps):
            text_token, generated = int(rows[b, 0]), bool((rows[b] >= 0).all())
            speaking = generated and text_token not in MOSHI_PADS
            pcm_out = audio_np[b] if generated else np.zeros(FRAME_SAMPLES, dtype=np.float32)
            text = self._piece(text_token) if speaking else ""
            out.append(DuplexOutput(pcm_out, text, speaking, int(step), bool(step >= self.context)))
        return out

    def _piece(self, token: int) -> str:
        if self.tokenizer is None:
            return f" <{token}>"  # random weights, no vocabulary: the id itself
        return self.tokenizer.id_to_piece(token).replace("\u2581", " ")
