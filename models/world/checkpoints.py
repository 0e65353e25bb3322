"""Self-Forcing and CausVid checkpoints of the causal Wan 2.1 DiT: reading, checking, key mapping.

The files (``docs/models.md``, "World"):

- Self-Forcing (``huggingface.co/gdhe17/Self-Forcing``, ``checkpoints/self_forcing_dmd.pt``): a
  torch pickle ``{"generator": ..., "generator_ema": ..., ["critic": ...]}`` whose state dicts are
  its ``WanDiffusionWrapper``'s: Wan's ``CausalWanModel`` keys under ``model.``. Its demo and README
  serve the EMA weights (``inference.py --use_ema``), so ``generator_ema`` is taken when present;
- CausVid (``huggingface.co/tianweiy/CausVid``, ``autoregressive_checkpoint/model.pt``):
  ``{"generator": ...}``, the same layout;
- also a bare state dict (with or without ``model.``), and a safetensors file of either.

Pickles are read with ``torch.load(weights_only=True)``: tensors and plain containers only, never
code. Key mapping: our parameter names are Wan's (``models/world/dit.py``), so a key maps by dropping
the wrapper's ``model.`` and training-wrapper segments (``_fsdp_wrapped_module.``,
``_checkpoint_wrapped_module.``, ``_orig_mod.``). Every DiT tensor must be present with its shape and
nothing else may be (a checkpoint of another architecture fails on the first odd key), each problem
a :class:`~models.world.configs.CheckpointError` of one line naming the file. :func:`inspect_files`
runs those checks (and the decoder's and text encoder's) on headers alone (memory-mapped: no weights
read, no GPU memory), so the config load refuses a bad file before anything is allocated.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import Tensor

from models.world.configs import CheckpointError, WorldModelConfig
from models.world.dit import CausalDiT

GENERATORS = ("generator_ema", "generator")  # preferred first
WRAPPER_SEGMENTS = re.compile(r"(^|\.)(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\.")


def our_name(key: str) -> str:
    """The DiT parameter a checkpoint key holds: training-wrapper segments and ``model.`` dropped."""
    key = WRAPPER_SEGMENTS.sub(r"\1", key)
    return key.removeprefix("model.")


def peer_layout(dit_state: dict[str, Tensor], ema: bool = True) -> dict[str, dict[str, Tensor]]:
    """``dit_state`` (our names) as Self-Forcing saves it: ``{"generator": {"model." + key: ...}}``,
    and the same tensors as ``generator_ema`` with ``ema`` (``self_forcing_dmd.pt``'s keys)."""
    wrapped = {f"model.{k}": v for k, v in dit_state.items()}
    return {"generator": wrapped, **({"generator_ema": dict(wrapped)} if ema else {})}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _load(path: Path) -> object:
    if not path.is_file():
        raise CheckpointError(path, "no such file" if not path.exists() else "not a file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        try:  # memory-mapped: tensors are read on demand (a zip-format pickle, torch.save's default)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to parse is one malformed-file error
        raise CheckpointError(path, f"cannot read ({type(exc).__name__}: {_first_line(exc)})") from None


def read_checkpoint(path: Path) -> dict[str, Tensor]:
    """The generator's tensors of a checkpoint file, under our names (not checked against a model)."""
    path = Path(path)
    raw = _load(path)
    if not isinstance(raw, dict):
        raise CheckpointError(path, f"not a checkpoint (a {type(raw).__name__}, expected a dict)")
    state = next((raw[k] for k in GENERATORS if k in raw), raw)
    if not isinstance(state, dict) or not state:
        raise CheckpointError(path, "the generator is not a state dict")
    tensors: dict[str, Tensor] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise CheckpointError(path, f"entry {str(key)[:80]!r} is not a named tensor (not a state dict?)")
        tensors[our_name(key)] = value
    return tensors


def dit_state_dict(path: Path, cfg: WorldModelConfig) -> dict[str, Tensor]:
    """The checkpoint's DiT tensors, checked against ``cfg``'s DiT: every one present with its
    shape, none left over; :class:`CheckpointError` names the file and the first problem."""
    path = Path(path)
    tensors = read_checkpoint(path)
    with torch.device("meta"):
        expected = CausalDiT(cfg).state_dict()
    for name, param in expected.items():
        if name not in tensors:
            raise CheckpointError(path, f"missing tensor {'model.' + name!r} (not a {cfg.name} checkpoint?)")
        if tuple(tensors[name].shape) != tuple(param.shape):
            raise CheckpointError(
                path,
                f"tensor {'model.' + name!r} has shape {tuple(tensors[name].shape)}, expected "
                f"{tuple(param.shape)} ({cfg.name}: Wan-2.1-T2V-1.3B)",
            )
        if not tensors[name].is_floating_point():
            raise CheckpointError(
                path, f"tensor {'model.' + name!r} is {tensors[name].dtype}, not a float type"
            )
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(path, f"unexpected tensor {'model.' + extra[0]!r} (another architecture?)")
    return {name: tensors[name] for name in expected}


def inspect_files(
    cfg: WorldModelConfig, checkpoint: str, vae: str, text_encoder: str = "", prompt_embeddings: str = ""
) -> None:
    """Check every file a checkpoint model loads, from headers and memory-mapped tensors only (no
    weights read, no device memory): the DiT checkpoint against ``cfg`` (:func:`dit_state_dict`),
    the decoder's tensors (Wan's VAE, or TAEHV's where ``cfg.vae`` is ``taehv``), the text encoder's
    layout and tokenizer, or the embeddings file's prompts. Raises the first :class:`CheckpointError`, its ``field`` set to the config field
    (``checkpoint``, ``vae``, ``text_encoder``, ``prompt_embeddings``)."""
    from models.world.decoders import load_decoder
    from models.world.text_encoder import PrecomputedEmbeddings, resolve_text_encoder

    checks = {
        "checkpoint": lambda p: dit_state_dict(p, cfg),
        "vae": lambda p: load_decoder(cfg, p, device="meta"),
        "text_encoder": lambda p: _tokenizer_present(*resolve_text_encoder(p)),
        "prompt_embeddings": lambda p: PrecomputedEmbeddings.load(p, dim=cfg.text_dim, text_len=cfg.text_len),
    }
    given = {
        "checkpoint": checkpoint,
        "vae": vae,
        "text_encoder": text_encoder,
        "prompt_embeddings": prompt_embeddings,
    }
    for field, path in given.items():
        if not path:
            continue
        try:
            checks[field](Path(path))
        except CheckpointError as exc:
            exc.field = field  # type: ignore[attr-defined]
            raise


def _tokenizer_present(weights: Path, tokenizer: Path) -> None:
    if not weights.exists():
        raise CheckpointError(weights, "no such file or folder")
    if not tokenizer.is_dir():
        raise CheckpointError(tokenizer, "no tokenizer folder (umT5's: tokenizer.json or spiece.model)")
