"""The pi0 / pi0.5 robot policy (``models.policy.interface.Policy``): observations in, chunks out.

``Pi0Policy`` wraps the batched model (``models.policy.pi0``) in what openpi's policy does around
it (``models.policy.processing``): per observation it validates the robot's keys
(``presets.canonicalize``), then per batch, on the worker thread, resizes the cameras, normalizes
and tokenizes, runs one forward for the whole batch, and turns each chunk into the robot's actions.

Built from a checkpoint folder (``models.policy.checkpoint``: openpi or LeRobot layout, a fixed
robot) or with random weights (``pi0-tiny``: the embedded default; ``pi0-shaped``: pi0's sizes),
where ``preset=None`` detects the robot per observation and returns its action dims (LIBERO 7,
DROID 8, ALOHA 14, the generic pi0 layout 32).

Device: the weights live and run on ``device``; batches are collated on the host and copied once;
chunks come back as host numpy arrays. On CUDA, unguided batches replay a CUDA graph of the whole
forward (prefix + flow steps) captured per batch-size bucket and camera count at warmup
(``models.cuda_graphs``); RTC-guided batches run eagerly (their vector-Jacobian product needs
autograd). The starting noise is fixed by the seed, so an observation always maps to the same
chunk, whatever else shares its batch (up to rounding).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from models.cuda_graphs import BatchGraphs
from models.policy import presets
from models.policy.checkpoint import Checkpoint, load_weights
from models.policy.interface import ObservationError, PolicySpec
from models.policy.pi0 import PI0, PI0_TINY, Pi0Config, build
from models.policy.processing import OutputMap, Processing, resize_with_pad
from models.policy.rtc import Guide, RTCOptions, RTCState

PROMPT_WIDTH = 16  # the narrowest prompt a batch carries (tokens)

RANDOM_CONFIGS = {"pi0-tiny": PI0_TINY, "pi0-shaped": replace(PI0, vocab_size=257)}
"""Random-weight models (byte prompts): pi0-tiny for CPU serving and tests, pi0-shaped for GPU timing."""


def prompt_widths(max_tokens: int) -> tuple[int, ...]:
    """The prompt widths a batch is cut to: :data:`PROMPT_WIDTH` doubling below ``max_tokens``,
    then ``max_tokens`` (pi0's 48: 16, 32, 48; pi0.5's 200: 16, 32, 64, 128, 200). Each is a set
    of CUDA graphs, so a few widths; a batch's padding is then less than its longest prompt."""
    widths = [PROMPT_WIDTH]
    while widths[-1] * 2 < max_tokens:
        widths.append(widths[-1] * 2)
    return tuple(w for w in widths if w < max_tokens) + (max_tokens,)


@dataclass(frozen=True)
class Pi0Input:
    """One validated observation (cheap to build: images stay the wire's arrays) plus its RTC request."""

    observation: presets.Canonical
    rtc: RTCOptions | None
    action_dim: int  # the robot's output dims


@dataclass(frozen=True)
class Pi0Batch:
    """Model inputs of a batch, built on the worker thread by :meth:`Pi0Policy.collate`."""

    images: torch.Tensor  # [B, C, R, R, 3] uint8 (missing cameras black)
    image_mask: torch.Tensor  # [B, C] bool
    tokens: torch.Tensor  # [B, L] long
    token_mask: torch.Tensor  # [B, L] bool
    state: torch.Tensor  # [B, S] float32, normalized
    outputs: tuple[OutputMap, ...]  # per item: model actions -> the robot's

    def as_args(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        """The model's arguments on ``device`` (one host-to-device copy each; none on the CPU)."""
        tensors = (self.images, self.image_mask, self.tokens, self.token_mask, self.state)
        return tuple(t.to(device, non_blocking=True) for t in tensors)


def lerobot_preset(cameras: Sequence[str], state_dim: int, action_dim: int) -> presets.Preset:
    """A LeRobot checkpoint's observation layout: its camera keys in order (any may be missing:
    masked, at least one present), ``observation.state`` of its feature's length."""
    return presets.Preset(
        "lerobot",
        tuple(presets.Camera(key, slot, False) for slot, key in enumerate(cameras)),
        (presets.StateKey("observation.state", state_dim),),
        action_dim=action_dim,
    )


@dataclass(frozen=True)
class Pi0Front:
    """What of a :class:`Pi0Policy` runs on the session's runner (``Policy.front``): no weights,
    picklable, so a policy built in another process validates observations here the same way."""

    spec: PolicySpec
    preset: presets.Preset | None  # None: detected per observation
    max_cameras: int
    default_prompt: str
    max_prompt_chars: int

    def prepare(self, observation: Mapping[str, Any]) -> Pi0Input:
        """Validate everything :meth:`Pi0Policy.collate` and :meth:`Pi0Policy.infer` read
        (``presets.canonicalize``, ``RTCOptions.parse``), so an accepted observation cannot fail a
        batch it shares; cheap otherwise (no image copies): tensors are built per batch in
        :meth:`Pi0Policy.collate`."""
        preset = self.preset or presets.detect(observation)
        canon = presets.canonicalize(
            preset, observation, self.max_cameras, self.default_prompt, self.max_prompt_chars
        )
        return Pi0Input(canon, RTCOptions.parse(observation.get("rtc")), preset.action_dim)

    def new_state(self) -> Pi0SessionState:
        return Pi0SessionState(self.spec.action_horizon, self.spec.action_dim)


class Pi0Policy:
    """pi0 / pi0.5 serving (see the module docstring). ``preset`` fixes the robot (a
    checkpoint's own when given); ``max_prompt_chars`` bounds a prompt's length; ``attention``
    names the kernel (``Pi0.attention_kernel``)."""

    def __init__(
        self,
        config: Pi0Config = PI0_TINY,
        *,
        checkpoint: Checkpoint | None = None,
        preset: str | None = None,
        default_prompt: str = "",
        device: str = "cpu",
        max_prompt_chars: int = presets.MAX_PROMPT_CHARS,
        cuda_graphs: bool = True,
        compile: bool = False,
        attention: str = "auto",
        name: str = "pi0-tiny",
    ) -> None:
        self.device = device
        self.max_prompt_chars = max_prompt_chars
        self.processing = checkpoint.processing if checkpoint else Processing(max_tokens=config.prompt_len)
        if checkpoint is not None:
            config = replace(checkpoint.model, dtype=config.dtype, seed=config.seed)
            fixed = (
                lerobot_preset(checkpoint.cameras, checkpoint.state_dim, checkpoint.action_dim)
                if checkpoint.layout == "lerobot"
                else presets.PRESETS[checkpoint.preset]
            )
            self.preset: presets.Preset | None = fixed
            default_prompt = default_prompt or checkpoint.default_prompt
        elif preset is not None:
            if preset not in presets.PRESETS:
                raise ValueError(f"unknown observation preset {preset!r} (known: {sorted(presets.PRESETS)})")
            self.preset = presets.PRESETS[preset]
        else:
            self.preset = None
        self.config = config
        self.default_prompt = default_prompt
        self.model = build(config, device)
        if checkpoint is not None:
            load_weights(self.model, checkpoint)
        self.model.attention = attention
        self.model.attention_kernel()  # a kernel named where it cannot run fails the load, saying why
        if compile:
            self.model.compile_layers()
        self.graphs: BatchGraphs | None = None  # captured at warmup (CUDA only)
        self._use_graphs = cuda_graphs and torch.device(device).type == "cuda"
        c = config
        shown = [self.preset] if self.preset else list(presets.PRESETS.values())
        self.spec = PolicySpec(
            name=name,
            action_horizon=c.action_horizon,
            action_dim=self.preset.action_dim if self.preset else c.action_dim,
            action_space="joint_position",
            image_resolution=(c.image_size, c.image_size),
            camera_keys=tuple(cam.key for cam in (self.preset or presets.PRESETS["pi0"]).cameras),
            state_dim=c.state_dim,
            max_cameras=c.max_cameras,
            extra={
                "num_inference_steps": c.num_steps,
                "observation_preset": self.preset.name if self.preset else "auto",
                "observation_presets": {p.name: p.describe() for p in shown},
                "real_time_chunking": True,
                **(dict(self.preset.metadata) if self.preset else {}),
            },
        )
        self._front = Pi0Front(self.spec, self.preset, c.max_cameras, default_prompt, max_prompt_chars)

    def prepare(self, observation: Mapping[str, Any]) -> Pi0Input:
        return self._front.prepare(observation)

    def front(self) -> Pi0Front:
        return self._front

    def collate(self, batch: Sequence[Pi0Input]) -> Pi0Batch:
        """Stack a batch into model tensors: cameras resized with padding (uint8: the model
        scales them), missing ones black and masked; state, prompt and output map per item.

        Camera slots after the last one any item of the batch fills are left out altogether (a
        LIBERO batch carries 2 of the 3), and so is the prompts' padding beyond the
        :func:`prompt_widths` width that holds the batch's longest prompt: masked tokens are
        never attended to and take no position, so computing them only costs time."""
        c, p = self.config, self.processing
        B, R = len(batch), c.image_size
        C = max(
            (j + 1 for item in batch for j, im in enumerate(item.observation.images) if im is not None),
            default=1,
        )
        inputs = [p.model_inputs(item.observation.prompt, item.observation.state) for item in batch]
        longest = max(int(mask.sum()) for _, _, mask in inputs)
        W = next(w for w in prompt_widths(p.max_tokens) if w >= longest)
        pixels = np.zeros((B, C, R, R, 3), np.uint8)
        image_mask = np.zeros((B, C), bool)
        tokens = np.zeros((B, W), np.int64)
        token_mask = np.zeros((B, W), bool)
        state = np.zeros((B, c.state_dim), np.float32)
        outputs = []
        for i, (item, (item_state, item_tokens, item_mask)) in enumerate(zip(batch, inputs, strict=True)):
            obs = item.observation
            for j, image in enumerate(obs.images[:C]):
                if image is not None:
                    pixels[i, j] = resize_with_pad(image, R)
                    image_mask[i, j] = True
            state[i], tokens[i], token_mask[i] = item_state, item_tokens[:W], item_mask[:W]
            outputs.append(p.output_map(obs.state, item.action_dim))
        as_tensor = torch.from_numpy
        return Pi0Batch(
            as_tensor(pixels),
            as_tensor(image_mask),
            as_tensor(tokens),
            as_tensor(token_mask),
            as_tensor(state),
            tuple(outputs),
        )

    def warmup(self, max_batch: int) -> None:
        """Run blank forwards at batch 1 and ``max_batch`` (and capture every CUDA graph: each
        bucket for every camera count and prompt width) so first ticks pay no allocation or
        capture cost."""
        c = self.config
        image = np.zeros((c.image_size, c.image_size, 3), np.uint8)
        state_dim = sum(k.size for k in self.preset.state) if self.preset else c.state_dim
        blank = presets.Canonical(
            (image,) + (None,) * (c.max_cameras - 1), np.zeros(state_dim, np.float32), ""
        )
        dim = self.spec.action_dim
        if self._use_graphs:  # every bucket, for every number of camera slots a batch may carry
            self.graphs = BatchGraphs(self.model, max_batch)
            for cameras in range(1, c.max_cameras + 1):
                example = replace(
                    blank, images=(None,) * (cameras - 1) + (image,) + (None,) * (c.max_cameras - cameras)
                )
                images, image_mask, _, _, state = self.collate([Pi0Input(example, None, dim)]).as_args(
                    self.device
                )
                for width in prompt_widths(self.processing.max_tokens):
                    token_mask = torch.arange(width, device=self.device)[None] < 1
                    tokens = torch.zeros(1, width, dtype=torch.long, device=self.device)
                    with torch.no_grad():
                        self.graphs.capture((images, image_mask, tokens, token_mask, state))
        for n in sorted({1, max_batch}):
            self.infer([Pi0Input(blank, None, dim)] * n, [None] * n)

    def new_state(self) -> Pi0SessionState:
        return self._front.new_state()

    def infer(self, batch: Sequence[Pi0Input], snapshots: Sequence[Guide | None]) -> list[np.ndarray]:
        if not batch:
            return []
        collated = self.collate(batch)
        args = collated.as_args(self.device)
        guide = self._guide(snapshots, collated.outputs)
        with torch.no_grad():
            if guide is None and self.graphs is not None and len(batch) <= self.graphs.max_batch:
                actions = self.graphs(*args)
            else:  # eager; RTC's vector-Jacobian product through uncompiled layers (no backward graphs)
                model = self.model
                with torch.compiler.set_stance("force_eager" if guide is not None else "default"):
                    actions = model.sample(model.prefix_cache(*model.embed_prefix(*args[:4]), args[4]), guide)
        out = []
        for chunk, output, snap in zip(
            actions.float().cpu().numpy(), collated.outputs, snapshots, strict=True
        ):
            chunk = output.apply(chunk)
            if snap is not None:  # frozen actions execute from the previous chunk: make that exact
                chunk[: snap.frozen] = snap.target[: snap.frozen]
            out.append(np.ascontiguousarray(chunk))
        return out

    def _guide(
        self, snapshots: Sequence[Guide | None], outputs: Sequence[OutputMap]
    ) -> tuple[torch.Tensor, ...] | None:
        """RTC guides in model space: each delivered chunk mapped back through its item's output map."""
        if all(s is None for s in snapshots):
            return None
        c = self.config
        B = len(snapshots)
        target = torch.zeros(B, c.action_horizon, c.action_dim)
        weights = torch.zeros(B, c.action_horizon, c.action_dim)
        max_weight = torch.zeros(B)
        for i, (snap, output) in enumerate(zip(snapshots, outputs, strict=True)):
            if snap is not None:
                dims = snap.target.shape[1]
                target[i, :, :dims] = torch.from_numpy(output.to_model(snap.target))
                weights[i, :, :dims] = torch.from_numpy(snap.weights)[:, None]
                max_weight[i] = snap.max_guidance_weight
        return target.to(self.device), weights.to(self.device), max_weight.to(self.device)


class Pi0SessionState(RTCState):
    """A pi0 session's state is its RTC state; a tick's snapshot is its guide (or None)."""

    def snapshot(self, prepared: Pi0Input, now: float) -> Guide | None:
        return self.guide(prepared.rtc, now)


__all__ = [
    "RANDOM_CONFIGS",
    "ObservationError",
    "Pi0Batch",
    "Pi0Front",
    "Pi0Input",
    "Pi0Policy",
    "lerobot_preset",
    "prompt_widths",
]
