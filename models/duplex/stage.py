"""The duplex model as one batched, stateful stage of the stage engine (``models/stage.py``).

One engine step = one 80 ms frame of every item's session: the user's input frame in, the model's
output frame, text piece and listen/speak decision out. The engine's frame clock (not input
arrival) drives the steps; a session with no input steps on :meth:`DuplexStage.silence`.

Contract of :meth:`DuplexStage.forward`:

- ``items[i].payload`` is a :class:`DuplexInput`, ``items[i].slot`` the session's slot (the
  engine's slot table owns the indices); sessions may sit at any positions in their streams.
- It returns one entry per item: a :class:`DuplexOutput`, or a :class:`DuplexError` instance that
  fails only that item (:class:`DuplexInputError` for a bad frame, :class:`ContextExhausted` when
  a session under policy ``"end"`` has used its whole context).
- It is transactional per call: if it raises, no session's state changed; per-session state
  (positions, previous tokens, codec buffers) is committed only at the end.
- ``DuplexOutput.step`` is the 0-based index of the frame in the session's stream: output
  ``step`` covers ``[step * 80, (step + 1) * 80)`` ms of the session.
- Context restore (a session resumed from a checkpoint, ``models/duplex/context.py``): an input
  whose ``restore`` is set first rebuilds its slot's context from that snapshot (the stage's
  ``context_log()`` made it), then steps; a restore that fails leaves the slot empty and answers
  :class:`ContextRestoreFailed` for that item alone.

Context policy (``context_policy``): ``"roll"`` keeps stepping past the context length with a
sink + window KV (``rolled`` is True on every step that evicted a frame, so the first True marks
the crossing); ``"end"`` answers every step at or beyond the context length with
:class:`ContextExhausted`, leaving the session's state untouched.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.duplex.codec import CodecStatePool, StreamingCodec
from models.duplex.configs import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, ContextPolicy, DuplexModelConfig
from models.duplex.context import FrameTokens, TokenContext, TokenLog
from models.duplex.graphs import BucketedStep, StepMode
from models.duplex.kv_cache import KVGeometry, SlotKV, StepRows
from models.duplex.lm import BOS, PAD, DuplexLM, text_piece
from models.stage import StageItem

__all__ = [
    "FRAME_MS",
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "SILENCE",
    "ContextExhausted",
    "ContextRestoreFailed",
    "DuplexError",
    "DuplexInput",
    "DuplexInputError",
    "DuplexOutput",
    "DuplexStage",
    "DuplexStepFailed",
    "StepMode",
    "build_duplex_stage",
    "measure_step_seconds",
]


class DuplexError(Exception):
    """A duplex step failed for one session (returned in its output slot, never raised)."""

    code = "duplex_error"


class DuplexInputError(DuplexError):
    """The input frame is not ``float32 (FRAME_SAMPLES,)`` of finite samples."""

    code = "invalid_audio_frame"


class DuplexStepFailed(DuplexError):
    """The model's step failed for this session (adapters whose state cannot be rolled back
    reset the session's row and return this instead of raising)."""

    code = "duplex_step_failed"


class ContextRestoreFailed(DuplexError):
    """A resumed session's context could not be rebuilt from its checkpoint (a malformed snapshot,
    a model that restores nothing, a failed recompute); its slot is left empty."""

    code = "context_restore_failed"


class ContextExhausted(DuplexError):
    """The session reached the context length under policy ``"end"``; it cannot step further."""

    code = "context_exhausted"

    def __init__(self, context: int) -> None:
        super().__init__(f"the session used its whole context of {context} frames ({context * FRAME_MS} ms)")
        self.context = context


@dataclass(frozen=True, slots=True)
class DuplexInput:
    pcm: np.ndarray  # float32 (FRAME_SAMPLES,): the user's audio for this frame
    silent: bool = False  # True when the server filled the frame with silence (client gap)
    restore: Any = None  # a ContextLog snapshot: rebuild the slot's context before this step


@dataclass(frozen=True, slots=True)
class DuplexOutput:
    pcm: np.ndarray  # float32 (FRAME_SAMPLES,): the model's audio for this frame
    text: str  # text piece produced this step ("" if none)
    speaking: bool  # the model's listen/speak decision for this frame
    step: int  # 0-based index of this frame in the session's stream
    rolled: bool = False  # the KV rolled (sink + window) at this step
    context: Any = None  # this step's share of the model's context, for the session's ContextLog


log = logging.getLogger(__name__)

_ZEROS = np.zeros(FRAME_SAMPLES, dtype=np.float32)
_ZEROS.flags.writeable = False
SILENCE = DuplexInput(_ZEROS, silent=True)  # the frame a session with no input steps on (read-only)


def check_frame(pcm: Any) -> DuplexInputError | None:
    """None if ``pcm`` is a usable input frame, else the typed error."""
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.float32 or pcm.shape != (FRAME_SAMPLES,):
        shape = getattr(pcm, "shape", None)
        dtype = getattr(pcm, "dtype", type(pcm).__name__)
        return DuplexInputError(f"audio frame must be float32 ({FRAME_SAMPLES},), got {dtype} {shape}")
    if not np.isfinite(pcm).all():
        return DuplexInputError("audio frame holds non-finite samples")
    return None


def restored(item: StageItem, restore: Callable[[int, Any], None] | None) -> ContextRestoreFailed | None:
    """Rebuild the item's slot context from its input's ``restore`` snapshot, if it has one
    (``restore(slot, snapshot)``, None: the model restores nothing); its typed error if that fails."""
    context = getattr(item.payload, "restore", None)
    if context is None:
        return None
    if restore is None:
        return ContextRestoreFailed("this model does not restore its context")
    try:
        restore(item.slot, context)  # type: ignore[arg-type]
    except Exception as exc:
        log.exception("duplex context restore failed")
        return ContextRestoreFailed(f"{type(exc).__name__}: {exc}")
    return None


def step_ready(
    items: Sequence[StageItem],
    exhausted: Callable[[int], ContextExhausted | None],
    step: Callable[[Sequence[StageItem]], list[DuplexOutput | Exception]],
    restore: Callable[[int, Any], None] | None = None,
) -> list[DuplexOutput | Exception]:
    """The forward skeleton every duplex stage shares: items with a bad frame, a context restore
    that failed (:func:`restored`) or an exhausted context (``exhausted(slot)``) get their typed
    error; the rest run in one ``step``."""
    results: list[DuplexOutput | Exception | None] = []
    for item in items:
        pcm = getattr(item.payload, "pcm", None)
        results.append(check_frame(pcm) or restored(item, restore) or exhausted(item.slot))  # type: ignore[arg-type]
    ready = [i for i, r in enumerate(results) if r is None]
    if ready:
        for i, out in zip(ready, step([items[i] for i in ready]), strict=True):
            results[i] = out
    return results  # type: ignore[return-value]  # every None was filled by step


class DuplexStage:
    """The embedded duplex model (codec + speech LM) over per-slot pools (see the module docstring).

    Per slot: the temporal KV (:class:`SlotKV`), the codec's encoder (user audio) and decoder
    (model audio) buffers (:class:`CodecStatePool`), the previous step's text and audio tokens,
    the sampling seed and the position. ``state_bytes`` counts all of them.

    Context for checkpoints (``models/duplex/context.py``): each output carries its step's
    :class:`FrameTokens`; a restore rebuilds the slot's KV, previous tokens and position from a
    :class:`TokenContext` in one batched prefill of the kept frames (:meth:`DuplexLM.prefill`);
    the codec's buffers start fresh (its first frames after a restore start from silence).

    ``step_mode`` (``models/duplex/graphs.py``): ``"eager"`` steps the batch's rows;
    ``"buckets"`` the bucketed form eagerly; ``"cuda_graphs"`` (CUDA only) replays the bucketed
    form from CUDA graphs captured here. A capture or replay that fails is logged with its
    exception and the stage steps eagerly from then on (``step_mode`` says which mode runs,
    ``graph_error`` why graphs do not).
    """

    name = "duplex"
    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES

    def __init__(
        self,
        config: DuplexModelConfig,
        codec: StreamingCodec,
        lm: DuplexLM,
        device: str,
        slot_capacity: int,
        seed: int = 0,
        step_mode: StepMode = "eager",
        kv_fp8: bool = False,
    ) -> None:
        config.validate()
        if slot_capacity < 1:
            raise ValueError("slot_capacity must be >= 1")
        if step_mode == "cuda_graphs" and torch.device(device).type != "cuda":
            raise ValueError(f"step_mode 'cuda_graphs' needs a CUDA device, got {device!r}")
        self.config, self.codec, self.lm = config, codec, lm
        self.device, self.slot_capacity, self.seed = device, slot_capacity, seed
        dtype = getattr(torch, config.dtype)
        self.dtype = dtype
        geometry = KVGeometry.of(config, dtype, fp8=kv_fp8)
        self.kv = SlotKV(geometry, slot_capacity, dtype, device, config.rope_theta)
        self.codec_state = CodecStatePool(codec, slot_capacity, dtype, device)
        self.prev_text = torch.full((slot_capacity,), BOS, dtype=torch.long, device=device)
        self.prev_audio = torch.full(
            (slot_capacity, config.n_q), lm.start_audio, dtype=torch.long, device=device
        )
        self.seeds = torch.zeros(slot_capacity, dtype=torch.long, device=device)
        self.steps = np.zeros(slot_capacity, dtype=np.int64)  # host copy: policy decisions, no sync
        self.step_mode: StepMode = "eager"
        self.graph_error: str | None = None
        self.bucketed: BucketedStep | None = None
        if step_mode != "eager":
            try:
                self.bucketed = BucketedStep(lm, self.kv, slot_capacity, device, step_mode == "cuda_graphs")
                self.step_mode = step_mode
            except Exception as e:  # a capture that fails must not take the stage down
                self._graphs_failed("capture", e)

    @property
    def context_policy(self) -> ContextPolicy:
        return self.config.context_policy

    def state_bytes(self) -> int:
        """KV row + codec buffers + previous tokens, seed and position of one slot."""
        tokens = (1 + self.config.n_q + 1) * 8 + self.steps.itemsize
        return self.kv.geometry.bytes_per_session + self.codec_state.bytes_per_slot + tokens

    def silence(self) -> DuplexInput:
        return SILENCE

    def open_state(self, session_id: str, slot: int) -> str:
        """A fresh stream in ``slot``: empty KV, zero codec buffers, start tokens, step 0; the
        sampling seed derives from the stage seed and ``session_id`` (same id, same stream)."""
        self._clear(slot)
        self.seeds[slot] = zlib.crc32(f"{self.seed}:{session_id}".encode())
        return session_id

    def _clear(self, slot: int) -> None:
        self.kv.reset(slot)
        self.codec_state.reset(slot)
        self.prev_text[slot] = BOS
        self.prev_audio[slot] = self.lm.start_audio
        self.steps[slot] = 0

    def context_log(self) -> TokenLog:
        """A session's log of the token rows its KV can see (sink + window)."""
        cfg = self.config
        return TokenLog(cfg.sink, cfg.window, 1 + 2 * cfg.n_q)

    def release_state(self, session_id: str, slot: int, state: Any) -> None:
        self.steps[slot] = 0  # the row's content is dead; open_state clears it for the next user

    def forward(self, items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        return step_ready(items, self._exhausted, self._step, self._restore)

    def _restore(self, slot: int, context: TokenContext) -> None:
        """The slot continues the stream ``context`` was logged from: its KV rebuilt from the
        kept frames' tokens in one prefill, its previous tokens and position restored, its codec
        buffers fresh (the seed is the session id's already). All or nothing: a failure leaves
        the slot cleared and raises."""
        self._check(context)
        try:
            self._clear(slot)
            frames = torch.from_numpy(context.frames).to(self.device)
            shift = max(0, context.steps - self.config.context)  # the sink as the newest step sees it
            positions = torch.where(frames < context.head, frames + shift, frames)
            with torch.inference_mode():
                if len(frames):
                    inputs = torch.from_numpy(context.inputs).to(self.device, torch.long)
                    self.lm.prefill(self.kv, slot, inputs, frames, positions)
                outputs = torch.from_numpy(context.outputs).to(self.device, torch.long)
                self.prev_text[slot] = outputs[0]
                self.prev_audio[slot] = outputs[1:]
            self.steps[slot] = context.steps
        except Exception:
            self._clear(slot)
            raise

    def _check(self, context: Any) -> None:
        """Raise ``ValueError`` unless ``context`` is a :class:`TokenContext` this model can load:
        its shapes, the sink rows then at most ``window`` newest ones, token ids in range."""
        cfg = self.config
        if not isinstance(context, TokenContext):
            raise ValueError(f"expected a TokenContext, got {type(context).__name__}")
        n, head, steps = len(context.inputs), context.head, context.steps
        if context.inputs.shape != (n, 1 + 2 * cfg.n_q) or context.outputs.shape != (1 + cfg.n_q,):
            raise ValueError(f"token rows of shape {context.inputs.shape} do not fit n_q {cfg.n_q}")
        if head != min(cfg.sink, steps) or not 0 <= n - head <= min(cfg.window, steps - head):
            raise ValueError(f"{n} rows ({head} sink) of {steps} steps do not fit sink {cfg.sink} + window")
        high = np.array([cfg.text_vocab] + [cfg.codebook_size + 1] * cfg.n_q + [cfg.codebook_size] * cfg.n_q)
        for tokens, bound in ((context.inputs, high), (context.outputs, high[: 1 + cfg.n_q])):
            if (tokens < 0).any() or (tokens >= bound).any():
                raise ValueError("token ids out of the model's vocabularies")

    def _exhausted(self, slot: int) -> ContextExhausted | None:
        cfg = self.config
        if cfg.context_policy == "end" and self.steps[slot] >= cfg.context:
            return ContextExhausted(cfg.context)
        return None

    def _step(self, items: Sequence[StageItem]) -> list[DuplexOutput | Exception]:
        """One batched frame: encode inputs, temporal + depth step, decode outputs, then commit.

        Rows run in slot order, so a batch of consecutive slots reads the KV pool as views."""
        order = sorted(range(len(items)), key=lambda i: items[i].slot)  # type: ignore[arg-type, return-value]
        slot_list: list[int] = [items[i].slot for i in order]  # type: ignore[misc]
        steps = self.steps[slot_list]
        rows = StepRows.of(slot_list, steps.tolist(), self.config.context, self.device)
        slots = rows.slots
        pcm = np.stack([items[i].payload.pcm for i in order])
        with torch.inference_mode():
            state = self.codec_state.gather(slots)
            user, encoder = self.codec.encode(torch.from_numpy(pcm).to(self.device, self.dtype), state)
            codes = user[:, :, 0]
            text_tokens, audio_tokens = self._lm_step(slot_list, steps, rows, codes)
            audio, decoder = self.codec.decode(audio_tokens[:, :, None], state)
            audio_np = audio.float().cpu().numpy()
            tokens = torch.cat(
                [
                    self.prev_text[slots][:, None],
                    self.prev_audio[slots],
                    codes,
                    text_tokens[:, None],
                    audio_tokens,
                ],
                dim=1,
            )
            tokens_np = tokens.to(torch.int32).cpu().numpy()  # one host copy: the texts and the context
            # commit: everything above succeeded
            self.codec_state.commit(slots, encoder, decoder)
            self.prev_text[slots] = text_tokens
            self.prev_audio[slots] = audio_tokens
        self.steps[slot_list] = steps + 1
        split = 1 + 2 * self.config.n_q  # a row: the step's temporal inputs, then its outputs
        outputs: list[DuplexOutput | Exception] = [None] * len(items)  # type: ignore[list-item]
        for row, i in enumerate(order):
            tok, step = int(tokens_np[row, split]), int(steps[row])
            rolled = step >= self.config.context
            frame = FrameTokens(tokens_np[row, :split], tokens_np[row, split:])
            outputs[i] = DuplexOutput(audio_np[row], text_piece(tok), tok != PAD, step, rolled, frame)
        return outputs

    def _lm_step(
        self, slot_list: list[int], steps: np.ndarray, rows: StepRows, user: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM's text ``[B]`` and audio ``[B, n_q]`` tokens of the batch (rows in slot order)."""
        if self.bucketed is not None:
            try:
                return self.bucketed(
                    slot_list, steps, rows.slots, user, self.prev_text, self.prev_audio, self.seeds
                )
            except Exception as e:
                if self.step_mode != "cuda_graphs":
                    raise
                # nothing was committed: the eager step below rewrites the same KV columns
                self._graphs_failed("replay", e)
        slots = rows.slots
        out = self.lm.step(
            self.kv, rows, self.prev_text[slots], self.prev_audio[slots], user, self.seeds[slots]
        )
        return out.text, out.audio

    def _graphs_failed(self, phase: str, error: Exception) -> None:
        self.graph_error = f"{phase}: {type(error).__name__}: {error}"
        log.exception("duplex CUDA-graph %s failed; stepping eagerly from now on", phase)
        self.bucketed, self.step_mode = None, "eager"


def build_duplex_stage(
    config: DuplexModelConfig,
    device: str,
    slot_capacity: int,
    seed: int = 0,
    step_mode: StepMode | None = None,
    kv_fp8: bool = False,
) -> DuplexStage:
    """The embedded duplex model with random weights drawn from ``seed``, ``slot_capacity`` slots;
    ``step_mode`` None: ``"cuda_graphs"`` on CUDA, ``"eager"`` elsewhere; ``kv_fp8``: the
    temporal KV stored in FP8 with a scale per vector (``models/duplex/kv_fp8.py``).

    ``device="meta"`` builds the shapes without memory (capacity planning of large configs:
    ``state_bytes`` is exact there; ``forward`` cannot run).
    """
    config.validate()
    dtype = getattr(torch, config.dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        codec, lm = StreamingCodec(config), DuplexLM(config)
        if device != "meta":
            codec.normalise_output()  # random weights: noise around zero, not a DC level
    codec = codec.to(dtype=dtype).eval().requires_grad_(False)
    lm = lm.to(dtype=dtype).eval().requires_grad_(False)
    if step_mode is None:
        step_mode = "cuda_graphs" if torch.device(device).type == "cuda" else "eager"
    return DuplexStage(config, codec, lm, device, slot_capacity, seed, step_mode, kv_fp8)


def measure_step_seconds(stage: Any, max_batch: int, reps: int = 3) -> dict[int, float]:
    """Seconds of one steady step of a duplex stage (embedded or Moshi) at batch 1, 2, 4, ... up
    to ``max_batch`` (and the slots): the compute side of admission. Runs before the engine owns
    the slots (it opens and releases slots ``0 .. b - 1`` itself); also warms the model up."""
    sizes = sorted({min(b, max_batch, stage.slot_capacity) for b in (1, 2, 4, 8, 16, 32, 64, max_batch)})
    seconds: dict[int, float] = {}
    for b in sizes:
        items = [StageItem(f"probe-{i}", 0, stage.silence(), slot=i) for i in range(b)]
        for item in items:
            stage.open_state(item.session_id, item.slot)  # type: ignore[arg-type]
        try:
            times = []
            for _ in range(1 + reps):  # the first step warms up
                t0 = time.perf_counter()
                stage.forward(items)
                times.append(time.perf_counter() - t0)
            seconds[b] = min(times[1:])
        finally:
            for item in items:
                stage.release_state(item.session_id, item.slot, None)  # type: ignore[arg-type]
    return seconds
