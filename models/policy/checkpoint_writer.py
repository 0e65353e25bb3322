"""Write pi0 / pi0.5 checkpoint folders in openpi's layout (``models.policy.checkpoint`` reads them).

``realtime bench robot --write-checkpoint`` writes a random-weight one at the real size
(:func:`write_random_openpi`): the files a user of openpi's converter has (``model.safetensors``
under ``PI0Pytorch``'s names, ``config.json``, ``assets/<asset_id>/norm_stats.json``), with a small
stand-in sentencepiece tokenizer (PaliGemma's is not redistributable here; prompts are padded to a
fixed length, so the cost does not depend on it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from models.policy.checkpoint import OUTPUT_DIMS, STATE_DIMS, TOKENIZER_FILE
from models.policy.processing import RECIPES


def openpi_state_dict(model: Any) -> dict[str, Any]:
    """``model``'s parameters under openpi's names (the inverse of ``checkpoint.load_weights``), plus
    the parameters ``PI0Pytorch`` holds that inference never reads, zero-filled: a file openpi
    itself loads strictly."""
    import torch

    from models.policy.pi0 import openpi_names, openpi_unused

    c = model.config
    params = dict(model.named_parameters())
    out: dict[str, Any] = {}
    sizes = {"q": c.n_head * c.head_dim, "k": c.n_kv_head * c.head_dim, "v": c.n_kv_head * c.head_dim}
    for ours, sources in openpi_names(c):
        tensor = params[ours].detach()
        if len(sources) == 1:
            out[sources[0]] = tensor.contiguous()
            continue
        if sources[0].endswith(".q_proj.weight") and "vision" not in sources[0]:
            split = [sizes["q"], sizes["k"], sizes["v"]]
        else:
            split = [tensor.shape[0] // len(sources)] * len(sources)
        for source, part in zip(sources, torch.split(tensor, split, dim=0), strict=True):
            out[source] = part.contiguous()
    dtype = model.dtype
    for name, shape in openpi_unused(c).items():
        out[name] = torch.zeros(shape, dtype=dtype)
    return out


def write_openpi(
    folder: str | Path,
    model: Any,
    norm_stats: Mapping[str, Any],
    asset_id: str,
    tokenizer_file: str | Path | None = None,
) -> Path:
    """Write ``model`` as an openpi checkpoint folder: ``model.safetensors``, ``config.json``,
    ``assets/<asset_id>/norm_stats.json`` (and a copy of ``tokenizer_file`` when given)."""
    import shutil

    from safetensors.torch import save_file

    folder = Path(folder)
    (folder / "assets" / asset_id).mkdir(parents=True, exist_ok=True)
    tensors = {k: v.cpu() for k, v in openpi_state_dict(model).items()}
    save_file(tensors, str(folder / "model.safetensors"))
    c = model.config
    meta = {
        "action_dim": c.action_dim,
        "action_horizon": c.action_horizon,
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "precision": str(model.dtype).removeprefix("torch."),
    }
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    (folder / "assets" / asset_id / "norm_stats.json").write_text(
        json.dumps({"norm_stats": norm_stats}, indent=2)
    )
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, folder / TOKENIZER_FILE)
    return folder


_TOKENIZER_CORPUS = (
    "put the bowl on the plate. open the drawer. transfer the cube. pick up the red block and "
    "place it in the bin. fold the towel. uncap the pen. Task: , State: 0 1 2 3 4 5 6 7 8 9;\nAction: "
)


def write_tokenizer(path: str | Path, vocab_size: int = 320) -> Path:
    """A small sentencepiece model (byte fallback: any text encodes) standing in for PaliGemma's
    in random checkpoints: token ids differ, the padded prompt length and so the cost do not."""
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_TOKENIZER_CORPUS.split(". ") * 20),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        num_threads=1,
        bos_id=2,
        eos_id=1,
        pad_id=0,
        unk_id=3,
        minloglevel=2,
    )
    Path(path).write_bytes(model.getvalue())
    return Path(path)


def random_norm_stats(preset: str) -> dict[str, dict[str, list[float]]]:
    """Plausible statistics for a robot: z-score (mean 0.1, std 2) and quantiles (-2, 2) of its
    state and action dims."""
    dims = {"state": STATE_DIMS[preset], "actions": OUTPUT_DIMS[preset]}
    return {
        key: {"mean": [0.1] * n, "std": [2.0] * n, "q01": [-2.0] * n, "q99": [2.0] * n}
        for key, n in dims.items()
    }


def write_random_openpi(
    folder: str | Path, model_config: Any, preset: str = "libero", device: str = "cpu"
) -> Path:
    """A random-weight checkpoint folder in openpi's layout, with a stand-in tokenizer, for
    ``preset``'s robot (``realtime bench robot --write-checkpoint``): the files a user of a
    converted openpi checkpoint has, at ``model_config``'s sizes (pi0 or pi0.5 by its ``pi05``)."""
    from models.policy.pi0 import build

    recipe = RECIPES[f"{'pi05' if model_config.pi05 else 'pi0'}_{preset}"]
    model = build(model_config, device)
    write_openpi(folder, model, random_norm_stats(preset), recipe.asset_id)
    write_tokenizer(Path(folder) / TOKENIZER_FILE)
    return Path(folder)
