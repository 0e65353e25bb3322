"""Whisper on torch for the voice kind: any Hugging Face Whisper folder, CPU or GPU, batched.

:class:`TorchWhisperAsr` is the :class:`~models.voice.asr.ShortWindowAsr` contract over
``models/voice/whisper.py``: each window's log-Mel features (``transformers``'
``WhisperFeatureExtractor``, the folder's ``preprocessor_config.json`` or one built from the
model's mel bins) over the window alone (the utterance + ``pad_seconds`` of silence, never 30 s),
one encoder batch, one batched greedy decode. Windows of different lengths are masked, not padded
with silence, and each gets its own budget, so batching does not change a window's result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models.voice.asr import SAMPLE_RATE, SHORT_WINDOW_SECONDS, ShortWindowAsr, WindowText
from models.voice.whisper import (
    PREPROCESSOR,
    TOKENIZER,
    Decoded,
    detect_languages,
    greedy,
    inspect_folder,
    load_model,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere; otherwise the named dtype."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


class TorchWhisperAsr(ShortWindowAsr):
    """A Hugging Face Whisper folder (:func:`models.voice.whisper.inspect_folder` checks it first)
    on ``device`` in ``dtype`` (see :func:`resolve_dtype`). The host reads whether every window
    has finished once per decode step on the CPU and once every 4 steps on a GPU (where a sync per
    step would stall the queue of launched kernels); nothing else syncs inside the decode loop."""

    def __init__(
        self,
        folder: Path | str,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        language: str | None = "en",
        pad_seconds: float = 0.5,
        tokens_per_second: float = 12.0,
    ) -> None:
        from tokenizers import Tokenizer
        from transformers import WhisperFeatureExtractor

        super().__init__(language=language, pad_seconds=pad_seconds, tokens_per_second=tokens_per_second)
        if not 0 <= pad_seconds <= 30 - SHORT_WINDOW_SECONDS:
            raise ValueError(f"pad_seconds must be in [0, {30 - SHORT_WINDOW_SECONDS}], got {pad_seconds}")
        self.checked = inspect_folder(folder)
        self.tokens = self.checked.tokens
        if language is not None and self.tokens.languages and language not in self.tokens.languages:
            raise ValueError(f"language {language!r} has no token in {self.checked.path / TOKENIZER}")
        self.torch_device = torch.device(device)
        self.device = str(self.torch_device)
        self.dtype = resolve_dtype(dtype, self.torch_device)
        self.model = load_model(self.checked, self.torch_device, self.dtype)
        self._tokenizer = Tokenizer.from_file(str(self.checked.path / TOKENIZER))
        if (self.checked.path / PREPROCESSOR).exists():
            self._features = WhisperFeatureExtractor.from_pretrained(self.checked.path)
        else:
            self._features = WhisperFeatureExtractor(feature_size=self.checked.dims.num_mel_bins)
        self.sync_every = 1 if self.torch_device.type == "cpu" else 4

    def mel(self, audio: np.ndarray) -> np.ndarray:
        """The log-Mel features ``[mel bins, frames]`` of ``audio`` followed by ``pad_seconds`` of
        silence, cut to an even number of frames (the second convolution has stride 2)."""
        padded = np.concatenate([audio, np.zeros(int(self.pad_seconds * SAMPLE_RATE), np.float32)])
        mel = self._features(
            padded, sampling_rate=SAMPLE_RATE, padding="do_not_pad", truncation=False, return_tensors="np"
        ).input_features[0]
        return mel[:, : mel.shape[-1] // 2 * 2]

    def decode(self, windows: list[np.ndarray]) -> tuple[list[int | None], list[Decoded]]:
        """Each window's language token (``None``: an English-only model) and greedy decode."""
        mels = [self.mel(w) for w in windows]
        frames = [m.shape[-1] for m in mels]
        batch = np.zeros((len(mels), mels[0].shape[0], max(frames)), np.float32)
        for row, m in zip(batch, mels, strict=True):
            row[:, : m.shape[-1]] = m
        tokens = self.tokens
        budgets = [  # CTranslate2 generates at most half its max_length
            min(
                self.max_length(len(w) / SAMPLE_RATE) // 2,
                self.checked.dims.max_target_positions - tokens.prompt_length,
            )
            for w in windows
        ]
        with torch.inference_mode():
            mel = torch.from_numpy(batch).to(self.torch_device, self.dtype)
            memory, mask = self.model.encoder(mel, frames)
            caches = self.model.decoder.start(memory, tokens.prompt_length + max(budgets))
            languages: list[int | None]
            if not tokens.languages:
                languages = [None] * len(windows)
            elif self.language is None:
                languages = list(detect_languages(self.model, caches, mask, tokens))
            else:
                languages = [tokens.languages[self.language]] * len(windows)
            prompts = [tokens.prompt(lang) for lang in languages]
            decoded = greedy(
                self.model, caches, mask, prompts, budgets, tokens, self.checked.suppression, self.sync_every
            )
        return languages, decoded

    def _decode(self, windows: list[np.ndarray]) -> list[WindowText]:
        languages, decoded = self.decode(windows)
        codes = {i: code for code, i in self.tokens.languages.items()}
        eot = self.tokens.eot
        return [
            WindowText(
                self._tokenizer.decode([t for t in d.tokens if t < eot]).strip(),
                codes.get(lang, "en"),
                d.no_speech_prob,
                d.avg_logprob,
            )
            for lang, d in zip(languages, decoded, strict=True)
        ]
