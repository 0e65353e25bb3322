"""Prompt conditioning for Wan 2.1 worlds: umT5-XXL encoder embeddings, as Wan computes them.

Wan (``wan/modules/t5.py``, ``T5EncoderModel``; Self-Forcing and CausVid the same) turns a prompt
into the DiT's text context like this, and so does :class:`PromptEmbedder`:

1. clean the prompt (:func:`clean_prompt`: ftfy's ``fix_text``, HTML unescaping, whitespace
   collapsed; Wan's ``clean='whitespace'``);
2. tokenize with the ``google/umt5-xxl`` tokenizer, ``</s>`` appended, truncated to ``text_len``
   (512) tokens;
3. run the umT5-XXL encoder (24 layers, width 4096, 64 heads, per-layer relative position bias,
   gated tanh-GELU feed-forward) with the padding masked out;
4. keep each prompt's own tokens and zero the rest: ``[text_len, 4096]``, zero beyond the prompt.

The encoder is transformers' ``UMT5EncoderModel``: its math is Wan's (proven once against Wan's own
code, ``docs/models-world-vae-t5.md``). It loads from Wan's checkpoint
(``models_t5_umt5-xxl-enc-bf16.pth``, Wan's own key names, mapped by :func:`hf_name`) or from a
Hugging Face umT5 folder (``config.json`` + weights). Padding to the longest prompt of a batch
instead of to 512 changes nothing: masked keys get zero attention weight.

Two sources, one interface (:class:`PromptSource`): :class:`UMT5TextEncoder` (the 11 GB encoder)
and :class:`PrecomputedEmbeddings` (a safetensors file of prompt -> ``[L, 4096]``, written once by
``python -m models.world.text_encoder``), so a server without the encoder serves a fixed set of
prompts. :class:`PromptEmbedder` wraps either with a bounded LRU of embeddings, so a prompt is
encoded once while it stays in use.

Threading contract: everything here is synchronous and may take seconds (a 5.7 B-parameter encoder
forward); call it from a worker thread, never from the event loop. One :class:`PromptEmbedder`
serialises its calls with a lock, so several worker threads may share it.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from models.world.configs import CheckpointError
from models.world.wan_vae import read_state_dict

TEXT_LEN = 512  # Wan's text_len: tokens per prompt, </s> included
UMT5_XXL_DIM = 4096
WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_TOKENIZER_DIR = "google/umt5-xxl"  # where Wan's checkpoint folder keeps the tokenizer
RELATIVE_MAX_DISTANCE = 128  # Wan's T5RelativeEmbedding max_dist (not stored in the checkpoint)
DEFAULT_CACHE_PROMPTS = 64  # embeddings kept; each <= TEXT_LEN x dim elements (4 MiB in bf16)


class UnknownPromptError(ValueError):
    """The prompt has no precomputed embedding (a server without the text encoder serves only the
    prompts of its embeddings file). The message names no server path: it may reach a client."""

    def __init__(self, prompt: str, known: int) -> None:
        super().__init__(f"prompt has no precomputed embedding (this server serves {known} fixed prompts)")
        self.prompt = prompt


def clean_prompt(text: str) -> str:
    """Wan's prompt cleaning (``HuggingfaceTokenizer(clean='whitespace')``): ftfy's ``fix_text``
    (curly quotes, full-width forms, mojibake, control characters), HTML entities unescaped twice,
    runs of whitespace to one space, stripped. Also the key of the caches and embeddings files."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    # Wan uses the `regex` module's \s; Python's differs only on U+001C..U+001F, which ftfy removed
    return re.sub(r"\s+", " ", text).strip()


class PromptSource(Protocol):
    """Where embeddings come from: ``encode`` maps cleaned prompts to ``[L_i, dim]`` tensors (the
    prompt's own tokens, ``L_i <= text_len``) on ``device`` in ``dtype``."""

    dim: int
    device: torch.device
    dtype: torch.dtype

    def encode(self, prompts: list[str]) -> list[Tensor]: ...


# Wan's T5Encoder names -> transformers' UMT5EncoderModel names (block i keeps its index).
_HF_NAMES = [
    (r"^token_embedding\.", "shared."),
    (r"^norm\.", "encoder.final_layer_norm."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.block.\1.layer.0.layer_norm."),
    (r"^blocks\.(\d+)\.attn\.", r"encoder.block.\1.layer.0.SelfAttention."),
    (
        r"^blocks\.(\d+)\.pos_embedding\.embedding\.",
        r"encoder.block.\1.layer.0.SelfAttention.relative_attention_bias.",
    ),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.block.\1.layer.1.layer_norm."),
    (r"^blocks\.(\d+)\.ffn\.gate\.0\.", r"encoder.block.\1.layer.1.DenseReluDense.wi_0."),  # gelu(x W0) ...
    (r"^blocks\.(\d+)\.ffn\.fc1\.", r"encoder.block.\1.layer.1.DenseReluDense.wi_1."),  # ... * (x W1)
    (r"^blocks\.(\d+)\.ffn\.fc2\.", r"encoder.block.\1.layer.1.DenseReluDense.wo."),
]


_WAN_BLOCK_KEYS = (
    "norm1.weight",
    "attn.q.weight",
    "attn.k.weight",
    "attn.v.weight",
    "attn.o.weight",
    "pos_embedding.embedding.weight",
    "norm2.weight",
    "ffn.gate.0.weight",
    "ffn.fc1.weight",
    "ffn.fc2.weight",
)


def hf_name(wan_key: str) -> str | None:
    """transformers' name for a key of Wan's umT5 encoder checkpoint (None: not an encoder key)."""
    for pattern, repl in _HF_NAMES:
        if re.match(pattern, wan_key):
            return re.sub(pattern, repl, wan_key)
    return None


def _umt5_config(path: Path, tensors: dict[str, Tensor]):
    """The UMT5Config of a Wan-layout encoder, read off its tensor shapes."""
    from transformers import UMT5Config

    def shape(key: str) -> tuple[int, ...]:
        if key not in tensors:
            raise CheckpointError(path, f"missing tensor {key!r} (not a Wan umT5 encoder checkpoint?)")
        return tuple(tensors[key].shape)

    vocab, dim = shape("token_embedding.weight")
    buckets, heads = shape("blocks.0.pos_embedding.embedding.weight")
    inner, _ = shape("blocks.0.attn.q.weight")
    d_ff, _ = shape("blocks.0.ffn.fc1.weight")
    layers = 1 + max(int(k.split(".")[1]) for k in tensors if re.match(r"^blocks\.\d+\.", k))
    if inner % heads:
        raise CheckpointError(path, f"attention width {inner} does not split into {heads} heads")
    return UMT5Config(
        vocab_size=vocab,
        d_model=dim,
        d_kv=inner // heads,
        d_ff=d_ff,
        num_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=buckets,
        relative_attention_max_distance=RELATIVE_MAX_DISTANCE,
        feed_forward_proj="gated-gelu",  # Wan's GELU is the tanh approximation: transformers' gelu_new
        layer_norm_epsilon=1e-6,
        is_encoder_decoder=False,
        use_cache=False,
    )


def _load_wan_layout(path: Path):
    """A UMT5EncoderModel (CPU, the checkpoint's dtype) from Wan's encoder checkpoint."""
    from transformers import UMT5EncoderModel

    tensors = read_state_dict(path)
    config = _umt5_config(path, tensors)
    with torch.device("meta"):
        model = UMT5EncoderModel(config)
    expected = model.state_dict()
    wan_keys = [f"blocks.{i}.{k}" for i in range(config.num_layers) for k in _WAN_BLOCK_KEYS]
    for key in ["token_embedding.weight", *wan_keys, "norm.weight"]:
        if key not in tensors:
            raise CheckpointError(path, f"missing tensor {key!r} (a truncated checkpoint?)")
    state: dict[str, Tensor] = {}
    for key, tensor in tensors.items():
        name = hf_name(key)
        if name is None or name not in expected:
            raise CheckpointError(path, f"unexpected tensor {key!r} (another text encoder architecture?)")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                path,
                f"tensor {key!r} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}",
            )
        state[name] = tensor
    state["encoder.embed_tokens.weight"] = state["shared.weight"]  # one embedding, tied
    model.load_state_dict(state, assign=True)
    model.set_input_embeddings(model.shared)  # one tensor again (assign made two Parameters of it)
    return model


def _load_hf_folder(path: Path, dtype: torch.dtype):
    from transformers import AutoConfig, UMT5EncoderModel

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        if config.model_type != "umt5":
            raise CheckpointError(path, f"config.json has model_type {config.model_type!r}, expected 'umt5'")
        return UMT5EncoderModel.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any load failure is one malformed-folder error
        raise CheckpointError(
            path, f"cannot load a umT5 encoder ({type(exc).__name__}: {_first_line(exc)})"
        ) from None


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not path.is_dir():
        raise CheckpointError(path, "no tokenizer folder (google/umt5-xxl's tokenizer.json or spiece.model)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any load failure is one malformed-folder error
        raise CheckpointError(
            path, f"cannot load the tokenizer ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise CheckpointError(path, "tokenizer has no </s> or <pad> token (not the umT5 tokenizer?)")
    return tokenizer


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def resolve_text_encoder(path: Path, tokenizer: Path | None = None) -> tuple[Path, Path]:
    """``(weights, tokenizer folder)`` for ``path``: Wan's encoder ``.pth`` (its tokenizer at
    ``../google/umt5-xxl`` unless given), Wan's checkpoint folder (``models_t5_umt5-xxl-enc-bf16.pth``
    and ``google/umt5-xxl/``), or a Hugging Face umT5 folder (``config.json``; its own tokenizer)."""
    path = Path(path)
    if path.is_file():
        return path, Path(tokenizer) if tokenizer else path.parent / WAN_TOKENIZER_DIR
    if (path / "config.json").is_file():
        return path, Path(tokenizer) if tokenizer else path
    if (path / WAN_T5_FILE).is_file():
        return path / WAN_T5_FILE, Path(tokenizer) if tokenizer else path / WAN_TOKENIZER_DIR
    if not path.exists():
        raise CheckpointError(path, "no such file or folder")
    raise CheckpointError(
        path,
        f"not a umT5 encoder: expected Wan's {WAN_T5_FILE}, a folder holding it, or a folder with config.json",
    )


class UMT5TextEncoder:
    """umT5 encoder + tokenizer: cleaned prompts -> their tokens' embeddings ``[L_i, dim]``."""

    def __init__(self, model, tokenizer, text_len: int = TEXT_LEN) -> None:
        self.model, self.tokenizer, self.text_len = model, tokenizer, text_len
        p = next(model.parameters())
        self.dim: int = model.config.d_model
        self.device: torch.device = p.device
        self.dtype: torch.dtype = p.dtype

    @classmethod
    def load(
        cls,
        path: Path,
        tokenizer: Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        text_len: int = TEXT_LEN,
    ) -> UMT5TextEncoder:
        """From any layout :func:`resolve_text_encoder` accepts; :class:`CheckpointError` names the
        file and the problem if a file is missing or malformed (checked before the device copy)."""
        weights, tokenizer_dir = resolve_text_encoder(Path(path), tokenizer)
        tok = _load_tokenizer(tokenizer_dir)
        model = _load_hf_folder(weights, dtype) if weights.is_dir() else _load_wan_layout(weights)
        if len(tok) > model.config.vocab_size:
            raise CheckpointError(
                tokenizer_dir,
                f"tokenizer has {len(tok)} tokens, the encoder embeds {model.config.vocab_size}",
            )
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        return cls(model, tok, text_len)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[Tensor]:
        batch = self.tokenizer(
            prompts,
            padding="longest",
            truncation=True,
            max_length=self.text_len,
            add_special_tokens=True,
            return_tensors="pt",
        )
        ids, mask = batch.input_ids.to(self.device), batch.attention_mask.to(self.device)
        out = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return [o[:n] for o, n in zip(out, batch.attention_mask.sum(1).tolist(), strict=True)]


class PrecomputedEmbeddings:
    """Embeddings read from a safetensors file: key = prompt (cleaned on load), value ``[L, dim]``
    with ``1 <= L <= text_len`` (a ``[text_len, dim]`` zero-padded tensor is fine). Tensors are read
    on demand, so the file may hold many prompts; :class:`PromptEmbedder` caches the ones in use."""

    def __init__(self, path: Path, dim: int, device: torch.device, dtype: torch.dtype, text_len: int) -> None:
        from safetensors import safe_open

        self.path, self.dim, self.device, self.dtype = path, dim, torch.device(device), dtype
        if not path.is_file():
            raise CheckpointError(path, "no such file" if not path.exists() else "not a file")
        try:
            self._file = safe_open(str(path), "pt", device="cpu")
        except Exception as exc:  # noqa: BLE001 - any parse failure is one malformed-file error
            raise CheckpointError(
                path, f"not a safetensors file ({type(exc).__name__}: {_first_line(exc)})"
            ) from None
        self._keys: dict[str, str] = {}
        for key in self._file.keys():
            piece = self._file.get_slice(key)
            shape, dtype_name = tuple(piece.get_shape()), piece.get_dtype()
            if len(shape) != 2 or shape[1] != dim or not 1 <= shape[0] <= text_len:
                raise CheckpointError(
                    path, f"prompt {key[:60]!r}: shape {shape}, expected [1..{text_len}, {dim}]"
                )
            if dtype_name not in ("F64", "F32", "F16", "BF16"):
                raise CheckpointError(path, f"prompt {key[:60]!r}: dtype {dtype_name}, expected a float type")
            cleaned = clean_prompt(key)
            if cleaned in self._keys:
                raise CheckpointError(
                    path, f"prompts {self._keys[cleaned][:60]!r} and {key[:60]!r} clean to the same"
                )
            self._keys[cleaned] = key
        if not self._keys:
            raise CheckpointError(path, "holds no prompts")

    @classmethod
    def load(
        cls,
        path: Path,
        dim: int = UMT5_XXL_DIM,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        text_len: int = TEXT_LEN,
    ) -> PrecomputedEmbeddings:
        return cls(Path(path), dim, torch.device(device), dtype, text_len)

    def __len__(self) -> int:
        return len(self._keys)

    def encode(self, prompts: list[str]) -> list[Tensor]:
        for p in prompts:
            if p not in self._keys:
                raise UnknownPromptError(p, len(self._keys))
        return [
            self._file.get_tensor(self._keys[p]).to(device=self.device, dtype=self.dtype) for p in prompts
        ]


class PromptEmbedder:
    """Prompts -> the DiT's text context ``[B, text_len, dim]``, zero beyond each prompt's tokens.

    Keeps the embeddings of the ``cache_prompts`` most recently used prompts (cleaned text as the
    key; each at most ``text_len x dim`` elements on the source's device: 4 MiB for umT5-XXL in
    bf16, so 256 MiB at the default 64), so a prompt is encoded once while it stays in use.
    Synchronous and thread-safe (one lock); call it from a worker thread."""

    def __init__(
        self, source: PromptSource, text_len: int = TEXT_LEN, cache_prompts: int = DEFAULT_CACHE_PROMPTS
    ):
        if cache_prompts < 0:
            raise ValueError("cache_prompts must be >= 0")
        self.source, self.text_len, self.cache_prompts = source, text_len, cache_prompts
        self._cache: OrderedDict[str, Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0  # prompts the source has encoded (cache misses), for tests and stats

    @property
    def dim(self) -> int:
        return self.source.dim

    def __call__(self, prompts: Sequence[str | None]) -> Tensor:
        """``None`` is the empty prompt (``</s>`` alone). Raises :class:`UnknownPromptError` (a
        precomputed source without the prompt)."""
        keys = [clean_prompt(p or "") for p in prompts]
        with self._lock:
            found = {k: self._cache[k] for k in keys if k in self._cache}
            misses = list(dict.fromkeys(k for k in keys if k not in found))
            if misses:
                found.update(zip(misses, self.source.encode(misses), strict=True))
                self.encoded += len(misses)
            for k in keys:  # most recently used last; the least recently used leave first
                self._cache[k] = found[k]
                self._cache.move_to_end(k)
            while len(self._cache) > self.cache_prompts:
                self._cache.popitem(last=False)
        out = torch.zeros(
            len(keys), self.text_len, self.dim, device=self.source.device, dtype=self.source.dtype
        )
        for i, k in enumerate(keys):
            out[i, : found[k].shape[0]] = found[k]
        return out


def save_prompt_embeddings(
    path: Path, prompts: Sequence[str], embedder: PromptEmbedder, batch: int = 8
) -> None:
    """Write ``prompts``' embeddings (their own tokens only, ``[L, dim]``; keyed by the cleaned
    prompt) as a safetensors file :class:`PrecomputedEmbeddings` reads; ``batch`` prompts per forward.
    The empty prompt is always included: a session without a prompt conditions on it."""
    from safetensors.torch import save_file

    keys = list(dict.fromkeys(["", *(clean_prompt(p) for p in prompts)]))
    tensors: dict[str, Tensor] = {}
    for i in range(0, len(keys), batch):
        chunk = keys[i : i + batch]
        tensors.update(
            (k, e.contiguous().cpu()) for k, e in zip(chunk, embedder.source.encode(chunk), strict=True)
        )
    save_file(tensors, str(path), {"text_len": str(embedder.text_len), "dim": str(embedder.dim)})


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m models.world.text_encoder --text-encoder PATH --out FILE PROMPT...``: encode the
    prompts once (on a GPU if there is one) into an embeddings file a server without the encoder
    serves (``PrecomputedEmbeddings``)."""
    ap = argparse.ArgumentParser(prog="python -m models.world.text_encoder", description=main.__doc__)
    ap.add_argument(
        "--text-encoder", type=Path, required=True, help="Wan's umT5 .pth, Wan's folder, or an HF folder"
    )
    ap.add_argument(
        "--tokenizer", type=Path, help="the google/umt5-xxl tokenizer folder (default: beside it)"
    )
    ap.add_argument("--out", type=Path, required=True, help="the .safetensors file to write")
    ap.add_argument("--prompts-file", type=Path, help="one prompt per line (added to PROMPT...)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("prompts", nargs="*", metavar="PROMPT")
    args = ap.parse_args(argv)
    prompts = list(args.prompts)
    if args.prompts_file:
        prompts += [line for line in args.prompts_file.read_text().splitlines() if line.strip()]
    if not prompts:
        ap.error("no prompts")
    try:
        encoder = UMT5TextEncoder.load(args.text_encoder, args.tokenizer, device=args.device)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    save_prompt_embeddings(args.out, prompts, PromptEmbedder(encoder, cache_prompts=0))
    print(
        f"wrote {len({'', *map(clean_prompt, prompts)})} prompt embeddings (the empty one included) to {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
