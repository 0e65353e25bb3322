"""Whisper in plain torch, any size, from a Hugging Face Whisper folder; batched greedy decoding.

The folder is what ``WhisperForConditionalGeneration.save_pretrained`` writes plus the tokenizer
(``openai/whisper-large-v3-turbo`` saved locally loads unchanged)::

    config.json               model_type "whisper"; every dimension is read from it
    model.safetensors         HF's key names: model.encoder.*, model.decoder.* (proj_out.weight, if
                              present, is the token embedding again: the logits are tied to it)
    tokenizer.json            special ids are looked up by their strings, never assumed
    generation_config.json    optional: suppress_tokens, begin_suppress_tokens
    preprocessor_config.json  optional: the log-Mel settings (``models.voice.asr_torch``)

The model: an encoder (two convolutions with GELU, the checkpoint's positional rows ``[:T]`` for a
window of ``T`` frames, pre-LN blocks, a final LayerNorm) and a decoder (token + learned
positional embedding, blocks of causal self-attention with a KV cache and cross-attention over the
encoder output, a final LayerNorm, logits from the token embedding). Windows of a batch may differ
in length: the mel frames are zero-padded and masked out of every attention, so each window's
result is what it would be alone (the convolutions never reach the padding: windows have an even
number of frames).

:func:`inspect_folder` checks a folder from its JSON files and the safetensors header only (the
parameter shapes come from the model built on the meta device): no weights read, no device memory.
:func:`load_model` then reads the weights onto a device in a dtype. :func:`greedy` decodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.checkpoint_files import CheckpointError, read_json

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
GENERATION = "generation_config.json"
PREPROCESSOR = "preprocessor_config.json"
TIED = "proj_out.weight"  # the token embedding again
_LANGUAGE = re.compile(r"<\|([a-z]{2,3})\|>")  # <|en|>, <|haw|>, <|yue|>
MULTILINGUAL_VOCAB = 51865  # smaller vocabularies are English-only models (openai-whisper's rule)


@dataclass(frozen=True, slots=True)
class WhisperDims:
    """A Whisper's geometry, read from its ``config.json`` (HF ``WhisperConfig`` field names)."""

    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_layers: int
    decoder_attention_heads: int
    decoder_ffn_dim: int
    vocab_size: int
    max_source_positions: int  # encoder frames (after the stride-2 convolution): 1500 = 30 s
    max_target_positions: int  # decoder positions: 448

    @classmethod
    def from_config(cls, config: Mapping[str, Any], path: Path) -> WhisperDims:
        values = {}
        for name in cls.__dataclass_fields__:
            value = config.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CheckpointError(path, f"{name} must be a positive integer, got {value!r}")
            values[name] = value
        for kind in ("encoder", "decoder"):
            if values["d_model"] % values[f"{kind}_attention_heads"]:
                raise CheckpointError(path, f"d_model is not a multiple of {kind}_attention_heads")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SpecialTokens:
    """The tokenizer's special ids. ``languages`` maps a code ("en") to its token's id; it is
    empty for English-only models (:data:`MULTILINGUAL_VOCAB`), whose prompt has no language and
    task."""

    eot: int
    sot: int
    transcribe: int
    no_timestamps: int
    no_speech: int  # <|nospeech|>, or <|nocaptions|> in older vocabularies
    languages: Mapping[str, int]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, path: Path, vocab_size: int) -> SpecialTokens:
        def find(*names: str) -> int:
            for name in names:
                found = tokenizer.token_to_id(name)
                if found is not None:
                    if found >= vocab_size:
                        raise CheckpointError(
                            path, f"{name} is id {found}, past the model's vocab_size {vocab_size}"
                        )
                    return found
            raise CheckpointError(path, f"not a Whisper tokenizer: no {' or '.join(names)}")

        added = tokenizer.get_added_tokens_decoder()
        languages = {
            m.group(1): i
            for i, t in sorted(added.items())
            if (m := _LANGUAGE.fullmatch(t.content)) and i < vocab_size and vocab_size >= MULTILINGUAL_VOCAB
        }
        return cls(
            eot=find("<|endoftext|>"),
            sot=find("<|startoftranscript|>"),
            transcribe=find("<|transcribe|>"),
            no_timestamps=find("<|notimestamps|>"),
            no_speech=find("<|nospeech|>", "<|nocaptions|>"),
            languages=languages,
        )

    @property
    def prompt_length(self) -> int:
        return 4 if self.languages else 2

    def prompt(self, language: int | None) -> list[int]:
        """``<|startoftranscript|><|lang|><|transcribe|><|notimestamps|>`` with the language token
        ``language``; ``None`` (English-only models): ``<|startoftranscript|><|notimestamps|>``."""
        if language is None:
            return [self.sot, self.no_timestamps]
        return [self.sot, language, self.transcribe, self.no_timestamps]


@dataclass(frozen=True, slots=True)
class Suppression:
    """Tokens never generated, and tokens not generated first: ``suppress_tokens`` and
    ``begin_suppress_tokens`` of the folder's ``generation_config.json`` where the file exists,
    else of ``config.json`` (CTranslate2's converter reads them so, and its Whisper suppresses
    exactly these by default); a missing or null list suppresses nothing."""

    tokens: tuple[int, ...] = ()
    at_begin: tuple[int, ...] = ()

    @classmethod
    def from_folder(cls, folder: Path, config: Mapping[str, Any], vocab_size: int) -> Suppression:
        source, settings = folder / CONFIG, config
        if (folder / GENERATION).exists():
            source, settings = folder / GENERATION, read_json(folder / GENERATION)
        lists = []
        for key in ("suppress_tokens", "begin_suppress_tokens"):
            ids = settings.get(key) or ()
            if not isinstance(ids, list | tuple) or not all(
                isinstance(i, int) and 0 <= i < vocab_size for i in ids
            ):
                raise CheckpointError(source, f"{key} must be a list of token ids below {vocab_size}")
            lists.append(tuple(ids))
        return cls(*lists)


@dataclass(frozen=True, slots=True)
class WhisperFolder:
    """A checked Hugging Face Whisper folder (:func:`inspect_folder`)."""

    path: Path
    dims: WhisperDims
    tokens: SpecialTokens
    suppression: Suppression


def inspect_folder(folder: str | Path) -> WhisperFolder:
    """Check a Hugging Face Whisper folder without reading its weights; every problem raises
    :class:`CheckpointError`, one line naming the file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(folder, "no such folder" if not folder.exists() else "not a folder")
    config = read_json(folder / CONFIG)
    dims = _check_config(config, folder / CONFIG)
    _check_weights(folder / WEIGHTS, dims)
    tokens = _special_tokens(folder / TOKENIZER, dims)
    if (folder / PREPROCESSOR).exists():
        features = read_json(folder / PREPROCESSOR).get("feature_size", dims.num_mel_bins)
        if features != dims.num_mel_bins:
            raise CheckpointError(
                folder / PREPROCESSOR,
                f"feature_size {features!r} but the model has {dims.num_mel_bins} mel bins",
            )
    return WhisperFolder(folder, dims, tokens, Suppression.from_folder(folder, config, dims.vocab_size))


def _check_config(config: Mapping[str, Any], path: Path) -> WhisperDims:
    if config.get("model_type") != "whisper":
        raise CheckpointError(path, f"model_type is {config.get('model_type')!r}, not 'whisper'")
    if config.get("activation_function", "gelu") != "gelu":
        raise CheckpointError(
            path, f"activation_function {config['activation_function']!r} (Whisper's is gelu)"
        )
    if config.get("tie_word_embeddings", True) is not True:
        raise CheckpointError(
            path, "tie_word_embeddings is not true (Whisper's logits use the token embedding)"
        )
    return WhisperDims.from_config(config, path)


def _check_weights(weights: Path, dims: WhisperDims) -> None:
    """Every tensor of ``dims`` present with its shape and a float dtype, nothing else (the tied
    ``proj_out`` aside), from the header alone."""
    from safetensors import SafetensorError, safe_open

    if not weights.is_file():
        raise CheckpointError(weights, "file not found")
    try:
        with safe_open(weights, "numpy") as f:
            found = {name: f.get_slice(name) for name in f.keys()}
            shapes = {name: tuple(t.get_shape()) for name, t in found.items()}
            dtypes = {name: t.get_dtype() for name, t in found.items()}
    except SafetensorError as exc:
        raise CheckpointError(weights, f"not a safetensors file ({exc})") from None
    expected = {**parameter_shapes(dims), TIED: (dims.vocab_size, dims.d_model)}
    for name, shape in expected.items():
        if name not in shapes and name != TIED:
            raise CheckpointError(weights, f"missing tensor {name!r}")
        if shapes.get(name, shape) != shape:
            raise CheckpointError(
                weights, f"tensor {name!r} has shape {list(shapes[name])}, expected {list(shape)}"
            )
    extra = sorted(set(shapes) - set(expected))
    if extra:
        raise CheckpointError(weights, f"unexpected tensor {extra[0]!r} (not a Whisper of this config?)")
    odd = sorted(name for name, dtype in dtypes.items() if dtype not in ("F32", "F16", "BF16"))
    if odd:
        raise CheckpointError(weights, f"tensor {odd[0]!r} is {dtypes[odd[0]]}, not F32, F16 or BF16")


def _special_tokens(path: Path, dims: WhisperDims) -> SpecialTokens:
    from tokenizers import Tokenizer

    if not path.is_file():
        raise CheckpointError(path, "file not found")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 (tokenizers raises a bare Exception)
        raise CheckpointError(path, f"not a tokenizer ({exc})") from None
    return SpecialTokens.from_tokenizer(tokenizer, path, dims.vocab_size)


# ------------------------------------------------------------------------------------- model


class Attention(nn.Module):
    """Multi-head attention of queries from ``x`` over given keys and values (no bias on k_proj)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:
        """``[B, T, D]`` -> ``[B, heads, T, D / heads]``."""
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def forward(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False
    ) -> Tensor:
        out = F.scaled_dot_product_attention(
            self.split(self.q_proj(x)), k, v, attn_mask=mask, is_causal=causal
        )
        return self.out_proj(out.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """What both kinds of block end with: the pre-LN feed-forward and its residual."""

    def __init__(self, d_model: int, ffn: int) -> None:
        super().__init__()
        self.final_layer_norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn)
        self.fc2 = nn.Linear(ffn, d_model)

    def feed_forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class EncoderLayer(Block):
    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__(d_model, ffn)
        self.self_attn_layer_norm = nn.LayerNorm(d_model)
        self.self_attn = Attention(d_model, heads)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        h = self.self_attn_layer_norm(x)
        return self.feed_forward(x + self.self_attn(h, *self.self_attn.keys_values(h), mask))


@dataclass(slots=True)
class LayerCache:
    """One decoder layer's state for a batch: self-attention keys/values ``[B, H, L, Dh]`` filled
    up to the current position, and the encoder output's keys/values, computed once."""

    k: Tensor
    v: Tensor
    memory_k: Tensor
    memory_v: Tensor


class DecoderLayer(Block):
    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__(d_model, ffn)
        self.self_attn_layer_norm = nn.LayerNorm(d_model)
        self.self_attn = Attention(d_model, heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d_model)
        self.encoder_attn = Attention(d_model, heads)

    def forward(self, x: Tensor, cache: LayerCache, pos: int, memory_mask: Tensor | None) -> Tensor:
        n = x.shape[1]
        h = self.self_attn_layer_norm(x)
        cache.k[:, :, pos : pos + n], cache.v[:, :, pos : pos + n] = self.self_attn.keys_values(h)
        end = pos + n  # several tokens at once only from position 0 (the prompt): causal is exact
        x = x + self.self_attn(h, cache.k[:, :, :end], cache.v[:, :, :end], causal=n > 1)
        h = self.encoder_attn_layer_norm(x)
        return self.feed_forward(x + self.encoder_attn(h, cache.memory_k, cache.memory_v, memory_mask))


class Encoder(nn.Module):
    def __init__(self, dims: WhisperDims) -> None:
        super().__init__()
        d = dims.d_model
        self.conv1 = nn.Conv1d(dims.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(dims.max_source_positions, d)
        self.layers = nn.ModuleList(
            EncoderLayer(d, dims.encoder_attention_heads, dims.encoder_ffn_dim)
            for _ in range(dims.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, mel: Tensor, frames: Sequence[int]) -> tuple[Tensor, Tensor | None]:
        """Encode ``mel`` ``[B, mel bins, F]`` (F even, at most twice ``max_source_positions``) of
        which window ``b`` holds ``frames[b]`` (even) and zeros after: the encoder output
        ``[B, F / 2, D]`` and the key mask of its real frames (``None``: all are real)."""
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        t = x.shape[1]
        if t > self.embed_positions.num_embeddings:
            raise ValueError(
                f"{t} encoder frames, more than the model's {self.embed_positions.num_embeddings}"
            )
        x = x + self.embed_positions.weight[:t]
        mask = None
        if any(f // 2 != t for f in frames):
            lengths = torch.tensor([f // 2 for f in frames], device=x.device)
            mask = (torch.arange(t, device=x.device) < lengths[:, None])[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return self.layer_norm(x), mask


class Decoder(nn.Module):
    def __init__(self, dims: WhisperDims) -> None:
        super().__init__()
        d = dims.d_model
        self.embed_tokens = nn.Embedding(dims.vocab_size, d)
        self.embed_positions = nn.Embedding(dims.max_target_positions, d)
        self.layers = nn.ModuleList(
            DecoderLayer(d, dims.decoder_attention_heads, dims.decoder_ffn_dim)
            for _ in range(dims.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(d)

    def start(self, memory: Tensor, length: int) -> list[LayerCache]:
        """Each layer's cache for decoding ``length`` positions over the encoder output ``memory``."""
        caches = []
        for layer in self.layers:
            k, v = layer.encoder_attn.keys_values(memory)
            shape = (memory.shape[0], k.shape[1], length, k.shape[-1])
            caches.append(LayerCache(k.new_empty(shape), v.new_empty(shape), k, v))
        return caches

    def forward(
        self, tokens: Tensor, pos: int, caches: list[LayerCache], memory_mask: Tensor | None
    ) -> Tensor:
        """The logits ``[B, n, vocab]`` of ``tokens`` ``[B, n]`` at positions ``pos..pos+n-1``."""
        x = self.embed_tokens(tokens) + self.embed_positions.weight[pos : pos + tokens.shape[1]]
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, cache, pos, memory_mask)
        return F.linear(self.layer_norm(x), self.embed_tokens.weight)


class Whisper(nn.Module):
    """The encoder-decoder; parameter names are HF's without the leading ``model.``."""

    def __init__(self, dims: WhisperDims) -> None:
        super().__init__()
        self.dims = dims
        self.encoder = Encoder(dims)
        self.decoder = Decoder(dims)


def parameter_shapes(dims: WhisperDims) -> dict[str, tuple[int, ...]]:
    """Every tensor a folder of ``dims`` must hold, under HF's names (the tied ``proj_out`` aside)."""
    with torch.device("meta"):
        model = Whisper(dims)
    return {f"model.{name}": tuple(p.shape) for name, p in model.state_dict().items()}


def load_model(folder: WhisperFolder, device: str | torch.device, dtype: torch.dtype) -> Whisper:
    """The folder's weights on ``device`` in ``dtype``, in eval mode, without gradients."""
    from safetensors.torch import load_file

    with torch.device("meta"):
        model = Whisper(folder.dims)
    tensors = load_file(folder.path / WEIGHTS, device=str(device))
    state = {name.removeprefix("model."): t.to(dtype) for name, t in tensors.items() if name != TIED}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


# ------------------------------------------------------------------------------------- decoding


@dataclass(frozen=True, slots=True)
class Decoded:
    """One window's greedy decode: the tokens before end-of-text (none of the prompt), the sum of
    the log-probabilities of every generated token (end-of-text included) and the probability of
    ``<|nospeech|>`` at the start-of-transcript position (before any suppression)."""

    tokens: list[int]
    sum_logprob: float
    no_speech_prob: float

    @property
    def avg_logprob(self) -> float:
        """Whisper's: the sum over the text tokens + end-of-text, divided by their count."""
        return self.sum_logprob / (len(self.tokens) + 1)


def detect_languages(
    model: Whisper, caches: list[LayerCache], memory_mask: Tensor | None, tokens: SpecialTokens
) -> list[int]:
    """Each window's most likely language token: one decoder step on ``<|startoftranscript|>``
    over the language tokens (it writes position 0 of ``caches``, which the prompt rewrites)."""
    ids = torch.tensor(list(tokens.languages.values()), device=caches[0].k.device)
    sot = torch.full((caches[0].k.shape[0], 1), tokens.sot, device=ids.device)
    logits = model.decoder(sot, 0, caches, memory_mask)[:, -1]
    return ids[logits[:, ids].argmax(-1)].tolist()


def greedy(
    model: Whisper,
    caches: list[LayerCache],
    memory_mask: Tensor | None,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    tokens: SpecialTokens,
    suppression: Suppression,
    sync_every: int = 1,
) -> list[Decoded]:
    """Greedy decoding of a batch from its prompts (of one length, starting with
    ``<|startoftranscript|>``) in lock step: window ``b`` stops at end-of-text or after
    ``max_new_tokens[b]`` tokens. ``caches`` (:meth:`Decoder.start`) must hold the prompt plus the
    largest ``max_new_tokens``. A step runs on the device without a host sync; the host reads
    whether every window is finished once every ``sync_every`` steps (a finished window's later
    steps are computed and discarded)."""
    device = caches[0].k.device
    prompt = torch.tensor(prompts, device=device)
    steps = max(max_new_tokens)
    vocab = model.dims.vocab_size
    never = torch.zeros(vocab, dtype=torch.bool, device=device)
    never[list(suppression.tokens)] = True
    first = never.clone()
    first[list(suppression.at_begin)] = True
    limit = torch.tensor(max_new_tokens, device=device)
    out = torch.full((len(prompts), steps), tokens.eot, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    total = torch.zeros(len(prompts), device=device)

    logits = model.decoder(prompt, 0, caches, memory_mask)
    no_speech = logits[:, 0].float().softmax(-1)[:, tokens.no_speech]
    last = logits[:, -1]
    for step in range(steps):
        scores = last.float().masked_fill(first if step == 0 else never, -torch.inf).log_softmax(-1)
        chosen = scores.argmax(-1)
        total += scores.gather(-1, chosen[:, None])[:, 0].masked_fill(done, 0.0)
        chosen = chosen.masked_fill(done, tokens.eot)
        out[:, step] = chosen
        done |= (chosen == tokens.eot) | (limit <= step + 1)
        if step + 1 == steps or ((step + 1) % sync_every == 0 and bool(done.all())):
            break
        last = model.decoder(chosen[:, None], prompt.shape[1] + step, caches, memory_mask)[:, -1]

    results = []
    for row, logprob, p in zip(out.tolist(), total.tolist(), no_speech.tolist(), strict=True):
        text = row[: row.index(tokens.eot)] if tokens.eot in row else row
        results.append(Decoded(text, logprob, p))
    return results
