"""What openpi's policy does around the network, per robot (``src/openpi/policies/*_policy.py``,
``transforms.py``, ``training/config.py``), and LeRobot's equivalents for its checkpoints.

Inputs, per observation (``presets.Canonical`` -> model inputs):
    state: ALOHA's ``adapt_to_pi`` decode (joint flips, gripper to angular), then normalization
           with the checkpoint's statistics (z-score for pi0, quantiles for pi0.5), zero-padded
           to 32 (pi0: the model's state input) or discretized into 256 bins and written into the
           prompt (pi0.5 with discrete state: ``Task: ..., State: 12 200 ...;\\nAction: ``);
    prompt: openpi's PaliGemma formatting (cleaned, BOS, pi0's trailing "\\n" token), at most
           ``max_tokens`` tokens, zero-padded and masked;
    images: resized with padding to 224 exactly as ``openpi_client.image_tools.resize_with_pad``
           (PIL bilinear, black borders); cameras mapped to the model's slots by ``presets``.
Outputs, per chunk: un-normalization, delta -> absolute actions for the dims openpi's config
marks, ALOHA's encode (flips, gripper from angular), the robot's slice (LIBERO 7, DROID 8,
ALOHA 14). Every output step is affine per dimension, so :class:`OutputMap` holds one
``scale``/``offset`` pair per observation: it post-processes a chunk and maps a delivered chunk
back into model space (real-time chunking guides in model space).

Without a checkpoint (pi0-tiny, pi0-shaped) statistics are identity and the prompt is UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Norm = Literal["identity", "zscore", "quantile"]


def make_bool_mask(*dims: int) -> tuple[bool, ...]:
    """openpi's ``make_bool_mask``: ``(6, -1)`` -> six True then one False."""
    return tuple(flag for d in dims for flag in [d > 0] * abs(d))


@dataclass(frozen=True)
class Recipe:
    """The inference facts of one openpi training config (``training/config.py``)."""

    name: str
    pi05: bool
    preset: str  # the robot: libero, droid, aloha (observation keys and output slice)
    asset_id: str  # assets/<asset_id>/norm_stats.json
    delta_mask: tuple[bool, ...] = ()  # action dims predicted relative to the state
    discrete_state: bool = False  # pi0.5: the state as text tokens in the prompt
    adapt_to_pi: bool = False  # ALOHA: joint flips and gripper conversions
    default_prompt: str = ""


_ALOHA_DELTA = make_bool_mask(6, -1, 6, -1)
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("pi0_libero", False, "libero", "physical-intelligence/libero", make_bool_mask(6, -1)),
        Recipe("pi05_libero", True, "libero", "physical-intelligence/libero"),
        Recipe("pi0_droid", False, "droid", "droid"),
        Recipe("pi05_droid", True, "droid", "droid", discrete_state=True),
        Recipe("pi0_aloha", False, "aloha", "trossen", _ALOHA_DELTA, adapt_to_pi=True),
        Recipe("pi05_aloha", True, "aloha", "trossen", _ALOHA_DELTA, True, True),
        Recipe(
            "pi0_aloha_towel",
            False,
            "aloha",
            "trossen",
            _ALOHA_DELTA,
            adapt_to_pi=True,
            default_prompt="fold the towel",
        ),
        Recipe(
            "pi0_aloha_tupperware",
            False,
            "aloha",
            "trossen",
            _ALOHA_DELTA,
            adapt_to_pi=True,
            default_prompt="open the tupperware and put the food on the plate",
        ),
        Recipe(
            "pi0_aloha_pen_uncap",
            False,
            "aloha",
            "trossen",
            _ALOHA_DELTA,
            adapt_to_pi=True,
            default_prompt="uncap the pen",
        ),
        Recipe("pi05_aloha_pen_uncap", True, "aloha", "trossen", _ALOHA_DELTA, True, True, "uncap the pen"),
        Recipe(
            "pi0_aloha_sim",
            False,
            "aloha",
            "lerobot/aloha_sim_transfer_cube_human",
            adapt_to_pi=True,
            default_prompt="Transfer cube",
        ),
    )
}


# --- ALOHA's conversions (openpi ``aloha_policy.py``) -------------------------------------------

ALOHA_FLIPS = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1], np.float64)
ALOHA_GRIPPERS = (6, 13)
_GRIPPER_JOINT_OPEN, _GRIPPER_JOINT_CLOSE = -0.6213, 1.4910  # PUPPET_GRIPPER_JOINT_*
_GRIPPER_ANGLE_OFFSET = 0.5476


def gripper_to_angular(value: np.ndarray) -> np.ndarray:
    """ALOHA's linear gripper position -> pi0's normalized angular one."""
    value = value * (0.05800 - 0.01844) + 0.01844  # PUPPET_GRIPPER_POSITION_OPEN/CLOSED
    arm, horn = 0.036, 0.022  # Interbotix constants
    value = np.arcsin(np.clip((horn**2 + value**2 - arm**2) / (2 * horn * value), -1.0, 1.0))
    return (value - _GRIPPER_ANGLE_OFFSET) / (1.6296 - _GRIPPER_ANGLE_OFFSET)


def aloha_decode_state(state: np.ndarray) -> np.ndarray:
    state = ALOHA_FLIPS * state
    state[list(ALOHA_GRIPPERS)] = gripper_to_angular(state[list(ALOHA_GRIPPERS)])
    return state


# --- normalization --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """One key's statistics and how to apply them. ``eps`` and ``unnorm_eps`` are the epsilons
    added to the normalization's and its inverse's spans (openpi: 1e-6 both; LeRobot: 1e-8 for a
    z-score's std, else none)."""

    mode: Norm
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None
    eps: float = 1e-6
    unnorm_eps: float = 1e-6

    def normalize(self, x: np.ndarray) -> np.ndarray:
        n = x.shape[-1]
        if self.mode == "zscore":
            return (x - self.mean[:n]) / (self.std[:n] + self.eps)
        if self.mode == "quantile":
            q01, span = self.q01[:n], self.q99[:n] - self.q01[:n] + self.eps
            return (x - q01) / np.where(span == 0, 1e-8, span) * 2.0 - 1.0  # LeRobot's guard
        return x

    def unnormalize_affine(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, offset)`` over ``dim`` dims: ``raw = model * scale + offset``; dims past the
        statistics pass through (openpi pads z-score stats with mean 0, std 1)."""
        scale, offset = np.ones(dim), np.zeros(dim)
        if self.mode == "zscore":
            n = min(dim, self.mean.shape[0])
            scale[:n] = self.std[:n] + self.unnorm_eps
            offset[:n] = self.mean[:n]
            scale[n:] = 1.0 + self.unnorm_eps
        elif self.mode == "quantile":
            n = min(dim, self.q01.shape[0])
            half = (self.q99[:n] - self.q01[:n] + self.unnorm_eps) / 2.0
            scale[:n], offset[:n] = half, self.q01[:n] + half
        return scale, offset


IDENTITY = Stats("identity")


# --- prompts --------------------------------------------------------------------------------------


class ByteTokenizer:
    """UTF-8 bytes as token ids (pi0-tiny's 257-token vocabulary: no tokenizer file)."""

    pad_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_with_bos(self, text: str) -> list[int]:
        return self.encode(text)


class PaligemmaTokenizer:
    """PaliGemma's sentencepiece model, read from a local file (openpi downloads
    ``paligemma_tokenizer.model`` separately from checkpoints)."""

    pad_id = 0

    def __init__(self, model_file: str) -> None:
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_with_bos(self, text: str) -> list[int]:
        return self.sp.encode(text, add_bos=True)


def discretize_state(state: np.ndarray) -> np.ndarray:
    """openpi's 256 bins over [-1, 1] of a normalized state (pi0.5's state tokens)."""
    return np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1


def prompt_tokens(
    tokenizer: ByteTokenizer | PaligemmaTokenizer,
    prompt: str,
    state: np.ndarray | None,
    style: Literal["openpi", "lerobot", "bytes"],
) -> list[int]:
    """The prompt's token ids (not yet padded or truncated). ``state``: the normalized state for
    pi0.5's discrete-state prompt, None otherwise. ``lerobot``: pi0's task ends in one "\\n" and is
    tokenized whole (LeRobot's ``Pi0NewLineProcessor``); pi0.5 prompts are openpi's."""
    if style == "bytes":
        return tokenizer.encode(prompt)
    cleaned = prompt.strip().replace("_", " ").replace("\n", " ")
    if state is not None:
        states = " ".join(map(str, discretize_state(state)))
        return tokenizer.encode_with_bos(f"Task: {cleaned}, State: {states};\nAction: ")
    if style == "lerobot":
        return tokenizer.encode_with_bos(prompt if prompt.endswith("\n") else prompt + "\n")
    return tokenizer.encode_with_bos(cleaned) + tokenizer.encode("\n")


# --- images ---------------------------------------------------------------------------------------


def resize_with_pad(image: np.ndarray, size: int) -> np.ndarray:
    """uint8 HWC of any size -> uint8 ``[size, size, 3]``: openpi-client's ``resize_with_pad``
    (PIL bilinear to the longer side, truncated sizes, centred on black); a side that would
    truncate to 0 (a 1x4096 image) keeps 1 pixel, where openpi-client would raise."""
    h, w = image.shape[:2]
    if (h, w) == (size, size):
        return image
    from PIL import Image  # only for images that need resizing (GPU benches send 224x224)

    ratio = max(w / size, h / size)
    rh, rw = max(1, int(h / ratio)), max(1, int(w / ratio))
    resized = Image.fromarray(np.ascontiguousarray(image)).resize((rw, rh), resample=Image.BILINEAR)
    out = np.zeros((size, size, 3), np.uint8)
    top, left = max(0, int((size - rh) / 2)), max(0, int((size - rw) / 2))
    out[top : top + rh, left : left + rw] = np.asarray(resized)
    return out


# --- the whole pipeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputMap:
    """One observation's output transform: ``actions = model[:, :dim] * scale + offset``."""

    scale: np.ndarray  # [dim]
    offset: np.ndarray  # [dim]

    def apply(self, chunk: np.ndarray) -> np.ndarray:
        dim = self.scale.shape[0]
        return (chunk[:, :dim] * self.scale + self.offset).astype(np.float32)

    def to_model(self, actions: np.ndarray) -> np.ndarray:
        """The inverse (for guiding the next chunk toward a delivered one); a dimension whose
        statistics collapse it to a constant (LeRobot's std 0) maps to 0."""
        scale = np.broadcast_to(self.scale, actions.shape)
        out = np.divide(actions - self.offset, scale, out=np.zeros(actions.shape), where=scale != 0)
        return out.astype(np.float32)


@dataclass(frozen=True)
class Processing:
    """Everything around the network for one served checkpoint (see the module docstring)."""

    state_stats: Stats = IDENTITY
    action_stats: Stats = IDENTITY
    tokenizer: ByteTokenizer | PaligemmaTokenizer = field(default_factory=ByteTokenizer)
    prompt_style: Literal["openpi", "lerobot", "bytes"] = "bytes"
    max_tokens: int = 48
    discrete_state: bool = False
    delta_mask: tuple[bool, ...] = ()
    adapt_to_pi: bool = False
    model_state_dim: int = 32

    def state(self, raw: np.ndarray) -> np.ndarray:
        """The robot's state after ALOHA's decode (what delta actions are relative to), float64."""
        state = np.asarray(raw, np.float64)
        return aloha_decode_state(state) if self.adapt_to_pi else state

    def model_inputs(self, prompt: str, raw_state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(state [model_state_dim] float32, tokens [max_tokens] int64, token mask)``."""
        normalized = self.state_stats.normalize(self.state(raw_state))
        ids = prompt_tokens(
            self.tokenizer, prompt, normalized if self.discrete_state else None, self.prompt_style
        )
        ids = ids[: self.max_tokens]
        tokens = np.full(self.max_tokens, self.tokenizer.pad_id, np.int64)
        tokens[: len(ids)] = ids
        state = np.zeros(self.model_state_dim, np.float32)
        n = min(self.model_state_dim, normalized.shape[0])
        state[:n] = normalized[:n]
        return state, tokens, np.arange(self.max_tokens) < len(ids)

    def output_map(self, raw_state: np.ndarray, dim: int) -> OutputMap:
        """The affine output transform of one observation, for ``dim`` output dims."""
        scale, offset = self.action_stats.unnormalize_affine(dim)
        state = self.state(raw_state)
        for j, relative in enumerate(self.delta_mask[:dim]):
            if relative:
                offset[j] += state[j]
        if self.adapt_to_pi:  # openpi _encode_actions: flips, then grippers from angular
            flips = np.ones(dim)
            flips[: min(dim, 14)] = ALOHA_FLIPS[: min(dim, 14)]
            scale, offset = scale * flips, offset * flips
            span = _GRIPPER_JOINT_CLOSE - _GRIPPER_JOINT_OPEN
            for g in ALOHA_GRIPPERS:
                if g < dim:
                    scale[g] /= span
                    offset[g] = (offset[g] + _GRIPPER_ANGLE_OFFSET - _GRIPPER_JOINT_OPEN) / span
        return OutputMap(scale, offset)


def stats_from_openpi(entry: Mapping[str, Any], mode: Norm) -> Stats:
    """A ``norm_stats.json`` entry (``{"mean": [...], "std": [...], "q01": ..., "q99": ...}``)."""
    arrays = {
        k: np.asarray(entry[k], np.float64) for k in ("mean", "std", "q01", "q99") if entry.get(k) is not None
    }
    return Stats(mode, **arrays)
