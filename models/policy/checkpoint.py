"""pi0 / pi0.5 checkpoint folders on disk: check, describe, load, and write (random, for benches).

Two layouts (``docs/models.md``):

openpi (``examples/convert_jax_model_to_pytorch.py``)::

    model.safetensors              PI0Pytorch's parameters (paligemma_with_expert.*, *_proj.*)
    config.json                    optional: action_horizon (default 50), action_dim
    assets/<asset_id>/norm_stats.json   {"norm_stats": {"state": {...}, "actions": {...}}}

LeRobot (``PI0Policy`` / ``PI05Policy.save_pretrained``)::

    config.json                    "type": "pi0" | "pi05", chunk_size, tokenizer_max_length,
                                   input_features (camera order), output_features, normalization_mapping
    model.safetensors              the same parameters under "model."
    policy_preprocessor.json       + its normalizer step's .safetensors (observation.state.*, action.*)

The PaliGemma tokenizer (``paligemma_tokenizer.model``, sentencepiece) is a separate file.

:func:`inspect` reads headers and small files only (no tensors), so a deploy config is checked
before any GPU memory is taken; every problem raises :class:`CheckpointError`, one line naming the
file. :func:`load_weights` then fills a :class:`models.policy.pi0.Pi0`. Writing folders (benches,
tests) is ``models.policy.checkpoint_writer``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.checkpoint_files import CheckpointError, read_json
from models.policy.processing import RECIPES, Processing, Recipe, Stats, stats_from_openpi

TOKENIZER_FILE = "paligemma_tokenizer.model"
SIGLIP_HEAD_DIM = 72  # So400m: 16 heads of 72
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class Checkpoint:
    """What :func:`inspect` found: everything needed to build and feed the model."""

    folder: Path
    layout: str  # "openpi" | "lerobot"
    shapes: Mapping[str, tuple[int, ...]]  # normalized parameter name -> shape
    model: Any  # models.policy.pi0.Pi0Config (dtype and seed left to the caller)
    processing: Processing
    preset: str  # the observation preset: libero, droid, aloha, or "lerobot"
    action_dim: int  # the robot's output dims
    cameras: tuple[str, ...] = ()  # LeRobot: the checkpoint's camera keys, in model slot order
    default_prompt: str = ""
    state_dim: int = 0  # LeRobot: observation.state's length


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """A safetensors file's tensor table (name -> dtype, shape, data_offsets), checked against
    the file's size, without reading any tensor."""
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(path, "not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            raise CheckpointError(
                path, f"not a safetensors file (header length {n} for a file of {size} bytes)"
            )
        try:
            table = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError(path, "not a safetensors file (its header is not JSON)") from None
    if not isinstance(table, dict):
        raise CheckpointError(path, "not a safetensors file (its header is not a JSON object)")
    table.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in table.values()), default=0)
    if 8 + n + end > size:
        raise CheckpointError(path, f"truncated: its tensors need {8 + n + end} bytes, the file has {size}")
    return table


def normalize_name(name: str) -> str:
    """openpi's parameter name for a LeRobot or newer-transformers one (``model.`` prefix,
    SigLIP without ``vision_model``)."""
    if name.startswith("model.paligemma_with_expert.") or name.startswith("model.action_"):
        name = name[len("model.") :]
    elif name.startswith("model.") and name[6:].split(".")[0] in (
        "state_proj",
        "time_mlp_in",
        "time_mlp_out",
    ):
        name = name[len("model.") :]
    if ".vision_tower." in name and ".vision_tower.vision_model." not in name:
        name = name.replace(".vision_tower.", ".vision_tower.vision_model.")
    return name


def _shape(shapes: Mapping[str, tuple[int, ...]], name: str, file: Path) -> tuple[int, ...]:
    if name not in shapes:
        raise CheckpointError(file, f"missing parameter {name!r}")
    return shapes[name]


def model_config(shapes: Mapping[str, tuple[int, ...]], pi05: bool, file: Path, **fields: Any) -> Any:
    """The :class:`~models.policy.pi0.Pi0Config` the parameter shapes spell (openpi's Gemmas
    have one K/V head; SigLIP heads are 72 wide), every parameter checked."""
    from models.policy.pi0 import Pi0Config

    V = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
    L = "paligemma_with_expert.paligemma.model.language_model."
    X = "paligemma_with_expert.gemma_expert.model."
    has_time_mlp = "time_mlp_in.weight" in shapes
    if has_time_mlp != pi05:
        held, wanted = ("pi0.5", "pi0") if has_time_mlp else ("pi0", "pi0.5")
        raise CheckpointError(file, f"holds a {held} model, not {wanted} (set robot.policy: {held})")
    vw, _, patch, _ = _shape(shapes, V + "embeddings.patch_embedding.weight", file)
    positions = _shape(shapes, V + "embeddings.position_embedding.weight", file)[0]
    if vw % SIGLIP_HEAD_DIM:
        raise CheckpointError(
            file, f"SigLIP width {vw} is not a multiple of its {SIGLIP_HEAD_DIM}-wide heads"
        )
    head_dim, width = _shape(shapes, L + "layers.0.self_attn.k_proj.weight", file)
    embedding = shapes.get(L + "embed_tokens.weight") or _shape(
        shapes, "paligemma_with_expert.paligemma.lm_head.weight", file
    )
    side = math.isqrt(positions)
    config = Pi0Config(
        pi05=pi05,
        image_size=side * patch,
        patch_size=patch,
        vision_width=vw,
        vision_depth=sum(
            1 for n in shapes if n.startswith(V + "encoder.layers.") and n.endswith(".layer_norm1.weight")
        ),
        vision_heads=vw // SIGLIP_HEAD_DIM,
        vision_mlp_width=shapes.get(V + "encoder.layers.0.mlp.fc1.weight", (4304,))[0],
        vocab_size=embedding[0],
        width=width,
        mlp_width=_shape(shapes, L + "layers.0.mlp.gate_proj.weight", file)[0],
        expert_width=_shape(shapes, X + "layers.0.self_attn.o_proj.weight", file)[0],
        expert_mlp_width=_shape(shapes, X + "layers.0.mlp.gate_proj.weight", file)[0],
        depth=sum(
            1 for n in shapes if n.startswith(L + "layers.") and n.endswith(".self_attn.q_proj.weight")
        ),
        n_head=_shape(shapes, L + "layers.0.self_attn.q_proj.weight", file)[0] // head_dim,
        n_kv_head=1,
        head_dim=head_dim,
        action_dim=_shape(shapes, "action_in_proj.weight", file)[1],
        state_dim=32 if pi05 else _shape(shapes, "state_proj.weight", file)[1],
        **{"prompt_len": 200 if pi05 else 48, **fields},
    )
    if side * side != positions:
        raise CheckpointError(file, f"SigLIP has {positions} position embeddings, not a square grid")
    shapes = dict(shapes)  # tied weights are saved once: the embedding may be under lm_head's name
    shapes.setdefault(L + "embed_tokens.weight", embedding)
    for name, shape in expected_shapes(config).items():
        if name not in shapes:
            raise CheckpointError(
                file,
                f"missing parameter {name!r} (a {'pi0.5' if pi05 else 'pi0'} model of these sizes needs it)",
            )
        if tuple(shapes[name]) != shape:
            raise CheckpointError(
                file, f"parameter {name!r} has shape {list(shapes[name])}, expected {list(shape)}"
            )
    return config


def expected_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """openpi's name -> shape of every parameter inference reads, for ``config``."""
    import torch

    from models.policy.pi0 import Pi0, openpi_names

    with torch.device("meta"):
        ours = {n: tuple(p.shape) for n, p in Pi0(config).named_parameters()}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, sources in openpi_names(config):
        rows = ours[name][0] // len(sources) if len(sources) > 1 else None
        for source in sources:
            shapes[source] = ours[name] if rows is None else (rows, *ours[name][1:])
    head = config.head_dim * config.n_kv_head
    for i in range(config.depth):  # q, k, v differ in size (multi-query attention)
        for prefix, width in (
            ("paligemma_with_expert.paligemma.model.language_model", config.width),
            ("paligemma_with_expert.gemma_expert.model", config.expert_width),
        ):
            shapes[f"{prefix}.layers.{i}.self_attn.q_proj.weight"] = (config.n_head * config.head_dim, width)
            shapes[f"{prefix}.layers.{i}.self_attn.k_proj.weight"] = (head, width)
            shapes[f"{prefix}.layers.{i}.self_attn.v_proj.weight"] = (head, width)
    return shapes


def _stats_arrays(entry: Any, mode: str, file: Path, key: str) -> None:
    """Check one statistics entry: the arrays ``mode`` needs, 1-D, finite, of one length."""
    needed = ("q01", "q99") if mode == "quantile" else ("mean", "std")
    if not isinstance(entry, Mapping):
        raise CheckpointError(file, f"{key!r} must be an object of arrays")
    lengths = set()
    for name in needed:
        value = entry.get(name)
        why = "quantiles" if mode == "quantile" else "z-score"
        if value is None:
            raise CheckpointError(file, f"{key}.{name} is missing (this policy normalizes with {why})")
        try:
            array = np.asarray(value, np.float64)
        except (TypeError, ValueError):
            raise CheckpointError(file, f"{key}.{name} must be a list of numbers") from None
        if array.ndim != 1 or array.size == 0 or not np.isfinite(array).all():
            raise CheckpointError(file, f"{key}.{name} must be a non-empty list of finite numbers")
        lengths.add(array.size)
    if len(lengths) > 1:
        raise CheckpointError(file, f"{key}: {' and '.join(needed)} differ in length")


def _check_state_stats(stats: Stats, dims: int, file: Path, who: str) -> None:
    """The state statistics must cover every value the robot sends."""
    held = next((a.shape[0] for a in (stats.mean, stats.q01) if a is not None), None)
    if held is not None and held < dims:
        raise CheckpointError(file, f"the state statistics have {held} values, {who} {dims}")


def find_norm_stats(folder: Path, asset_id: str) -> Path:
    """``assets/<asset_id>/norm_stats.json``; an empty ``asset_id`` takes the only one there is."""
    assets = folder / "assets"
    if asset_id:
        return assets / asset_id / "norm_stats.json"
    found = sorted(assets.rglob("norm_stats.json")) if assets.is_dir() else []
    if len(found) != 1:
        where = ", ".join(str(p.relative_to(assets).parent) for p in found) or "none"
        raise CheckpointError(
            assets / "<asset_id>" / "norm_stats.json",
            f"expected exactly one norm_stats.json under assets/ (found: {where}); set robot.asset_id",
        )
    return found[0]


def openpi_norm_stats(path: Path, mode: str) -> tuple[Stats, Stats]:
    data = read_json(path).get("norm_stats")
    if not isinstance(data, Mapping):
        raise CheckpointError(path, 'must hold {"norm_stats": {"state": ..., "actions": ...}}')
    for key in ("state", "actions"):
        if key not in data:
            raise CheckpointError(path, f"norm_stats.{key} is missing")
        _stats_arrays(data[key], mode, path, f"norm_stats.{key}")
    return stats_from_openpi(data["state"], mode), stats_from_openpi(data["actions"], mode)


def recipe_for(pi05: bool, preset: str, openpi_config: str, asset_dir: str) -> Recipe:
    """openpi's training config for this checkpoint: named, or ``{pi0|pi05}_{robot}`` with the
    robot from ``preset`` or, when that is ``auto``, from the asset folder's name."""
    family = "pi05" if pi05 else "pi0"
    if openpi_config:
        recipe = RECIPES[openpi_config]
        if recipe.pi05 != pi05:
            raise ValueError(
                f"robot.openpi_config {openpi_config!r} is a {'pi0.5' if recipe.pi05 else 'pi0'} config"
            )
        if preset not in ("auto", recipe.preset):
            raise ValueError(
                f"robot.openpi_config {openpi_config!r} serves {recipe.preset}, not preset {preset!r}"
            )
        return recipe
    if preset == "auto":
        guesses = [
            robot
            for robot, words in (
                ("libero", ("libero",)),
                ("droid", ("droid",)),
                ("aloha", ("aloha", "trossen")),
            )
            if any(w in asset_dir.lower() for w in words)
        ]
        if len(guesses) != 1:
            raise ValueError(
                f"cannot tell the robot from the asset folder {asset_dir!r}: set robot.observation_preset (libero, droid or aloha)"
            )
        preset = guesses[0]
    if preset not in ("libero", "droid", "aloha"):
        raise ValueError(f"an openpi checkpoint serves libero, droid or aloha observations, not {preset!r}")
    return RECIPES[f"{family}_{preset}"]


def _tokenizer(path: Path, vocab_size: int) -> Any:
    """The sentencepiece tokenizer, whose ids must index the model's ``vocab_size`` embeddings."""
    from models.policy.processing import PaligemmaTokenizer

    if not path.is_file():
        why = "file not found (the PaliGemma sentencepiece tokenizer, paligemma_tokenizer.model)"
        raise CheckpointError(path, why)
    try:
        tokenizer = PaligemmaTokenizer(str(path))
    except (OSError, RuntimeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(path, f"not a sentencepiece model ({first})") from None
    pieces = tokenizer.sp.get_piece_size()
    if pieces > vocab_size:
        raise CheckpointError(
            path, f"has {pieces} pieces, more than the model's {vocab_size} token embeddings"
        )
    return tokenizer


OUTPUT_DIMS = {"libero": 7, "droid": 8, "aloha": 14}  # openpi's *Outputs slices
STATE_DIMS = {"libero": 8, "droid": 8, "aloha": 14}  # what each robot sends


def inspect(
    folder: str | Path,
    pi05: bool,
    tokenizer: str | Path = "",
    preset: str = "auto",
    openpi_config: str = "",
    asset_id: str = "",
) -> Checkpoint:
    """Check a checkpoint folder and describe it (see the module docstring). Raises
    :class:`CheckpointError` (a file's problem) or ValueError (a setting that does not fit)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(folder, "not a folder (robot.checkpoint names a checkpoint folder)")
    weights = folder / "model.safetensors"
    table = read_safetensors_header(weights)
    shapes = {normalize_name(n): tuple(int(d) for d in t["shape"]) for n, t in table.items()}
    config_file = folder / "config.json"
    config = read_json(config_file) if config_file.is_file() else {}
    tokenizer_path = Path(tokenizer) if tokenizer else folder / TOKENIZER_FILE
    if config.get("type") in ("pi0", "pi05"):
        return _inspect_lerobot(folder, config, shapes, pi05, tokenizer_path)
    horizon = config.get("action_horizon", 50)
    if not isinstance(horizon, int) or isinstance(horizon, bool) or not 1 <= horizon <= 1000:
        raise CheckpointError(config_file, f"action_horizon must be an integer in 1..1000, got {horizon!r}")
    model = model_config(shapes, pi05, weights, action_horizon=horizon)
    stats_path = find_norm_stats(folder, asset_id)
    asset_dir = str(stats_path.parent.relative_to(folder / "assets"))
    recipe = recipe_for(pi05, preset, openpi_config, asset_dir)
    state_stats, action_stats = openpi_norm_stats(stats_path, "quantile" if pi05 else "zscore")
    _check_state_stats(state_stats, STATE_DIMS[recipe.preset], stats_path, f"the {recipe.preset} robot sends")
    processing = Processing(
        state_stats=state_stats,
        action_stats=action_stats,
        tokenizer=_tokenizer(tokenizer_path, model.vocab_size),
        prompt_style="openpi",
        max_tokens=model.prompt_len,
        discrete_state=recipe.discrete_state,
        delta_mask=recipe.delta_mask,
        adapt_to_pi=recipe.adapt_to_pi,
        model_state_dim=model.state_dim,
    )
    return Checkpoint(
        folder,
        "openpi",
        shapes,
        model,
        processing,
        recipe.preset,
        OUTPUT_DIMS[recipe.preset],
        default_prompt=recipe.default_prompt,
    )


_LEROBOT_MODES = {"MEAN_STD": "zscore", "QUANTILES": "quantile", "IDENTITY": "identity"}


def _inspect_lerobot(
    folder: Path, config: dict[str, Any], shapes: Mapping[str, tuple[int, ...]], pi05: bool, tokenizer: Path
) -> Checkpoint:
    config_file = folder / "config.json"
    if (config["type"] == "pi05") != pi05:
        held = "pi0.5" if config["type"] == "pi05" else "pi0"
        raise CheckpointError(
            config_file,
            f"holds a LeRobot {held} policy, not {'pi0.5' if pi05 else 'pi0'} (set robot.policy: {held})",
        )
    if config.get("use_relative_actions"):
        raise CheckpointError(config_file, "use_relative_actions is not supported")
    features = config.get("input_features") or {}
    cameras = tuple(k for k, f in features.items() if isinstance(f, Mapping) and f.get("type") == "VISUAL")
    if not 1 <= len(cameras) <= 3:
        raise CheckpointError(
            config_file, f"input_features must name 1 to 3 VISUAL cameras, got {len(cameras)}"
        )
    action = (config.get("output_features") or {}).get("action", {})
    try:
        action_dim = int(action["shape"][0])
        horizon, max_tokens = (
            int(config.get("chunk_size", 50)),
            int(config.get("tokenizer_max_length", 200 if pi05 else 48)),
        )
    except (KeyError, IndexError, TypeError, ValueError):
        raise CheckpointError(
            config_file, "output_features.action.shape, chunk_size and tokenizer_max_length must be integers"
        ) from None
    model = model_config(
        shapes,
        pi05,
        folder / "model.safetensors",
        action_horizon=horizon,
        prompt_len=max_tokens,
        max_cameras=len(cameras),
    )
    modes = config.get("normalization_mapping") or {}
    state_mode = _LEROBOT_MODES.get(modes.get("STATE", "QUANTILES" if pi05 else "MEAN_STD"))
    action_mode = _LEROBOT_MODES.get(modes.get("ACTION", "QUANTILES" if pi05 else "MEAN_STD"))
    if state_mode is None or action_mode is None:
        raise CheckpointError(
            config_file,
            f"normalization_mapping {modes!r}: STATE and ACTION must be MEAN_STD, QUANTILES or IDENTITY",
        )
    state_stats, action_stats = _lerobot_stats(folder, state_mode, action_mode)
    try:
        state_dim = int(features["observation.state"]["shape"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        raise CheckpointError(config_file, "input_features must give observation.state a shape") from None
    if not 1 <= state_dim <= model.state_dim:
        raise CheckpointError(
            config_file, f"observation.state has {state_dim} values, the model takes 1..{model.state_dim}"
        )
    _check_state_stats(state_stats, state_dim, folder / "policy_preprocessor.json", "observation.state has")
    processing = Processing(
        state_stats=state_stats,
        action_stats=action_stats,
        tokenizer=_tokenizer(tokenizer, model.vocab_size),
        prompt_style="lerobot",
        max_tokens=max_tokens,
        discrete_state=pi05,
        model_state_dim=model.state_dim,
    )
    return Checkpoint(
        folder, "lerobot", shapes, model, processing, "lerobot", action_dim, cameras, state_dim=state_dim
    )


def _lerobot_stats(folder: Path, state_mode: str, action_mode: str) -> tuple[Stats, Stats]:
    """The normalizer step's statistics from ``policy_preprocessor.json`` and its safetensors."""
    from safetensors.numpy import load_file

    pipeline_file = folder / "policy_preprocessor.json"
    pipeline = read_json(pipeline_file)
    steps = [
        s
        for s in pipeline.get("steps", [])
        if isinstance(s, Mapping) and s.get("registry_name") == "normalizer_processor"
    ]
    if len(steps) != 1 or not isinstance(steps[0].get("state_file"), str):
        raise CheckpointError(pipeline_file, "expected one normalizer_processor step with a state_file")
    eps = float((steps[0].get("config") or {}).get("eps", 1e-8))
    stats_file = folder / steps[0]["state_file"]
    read_safetensors_header(stats_file)
    arrays = load_file(str(stats_file))
    stats = []
    for key, mode in (("observation.state", state_mode), ("action", action_mode)):
        entry = {
            name.rsplit(".", 1)[1]: value for name, value in arrays.items() if name.rsplit(".", 1)[0] == key
        }
        if mode != "identity":
            _stats_arrays(entry, mode, stats_file, key)
        arrays_64 = {
            k: np.asarray(v, np.float64) for k, v in entry.items() if k in ("mean", "std", "q01", "q99")
        }
        stats.append(Stats(mode, **arrays_64, eps=eps if mode == "zscore" else 0.0, unnorm_eps=0.0))
    return stats[0], stats[1]


def load_weights(model: Any, checkpoint: Checkpoint) -> None:
    """Copy the checkpoint's parameters into ``model`` (a :class:`~models.policy.pi0.Pi0` built
    from ``checkpoint.model``), converting dtypes; the file is memory-mapped, read once."""
    import torch
    from safetensors import safe_open

    from models.policy.pi0 import openpi_names

    file = checkpoint.folder / "model.safetensors"
    with safe_open(str(file), framework="pt") as f:
        names = {normalize_name(n): n for n in f.keys()}
        params = dict(model.named_parameters())
        for ours, sources in openpi_names(model.config):
            source = sources[0]
            if source.endswith("language_model.embed_tokens.weight") and source not in names:
                source = "paligemma_with_expert.paligemma.lm_head.weight"  # tied weights saved once
            parts = [f.get_tensor(names[source if i == 0 else s]) for i, s in enumerate(sources)]
            tensor = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
            target = params[ours]
            with torch.no_grad():
                target.copy_(tensor.reshape(target.shape).to(target.dtype))
