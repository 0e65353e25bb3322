"""Random-weight Qwen2 chat models built locally (no hub), at a chosen shape.

:func:`build_random_chat_model` trains a byte-level BPE tokenizer (:data:`TOKENIZER_VOCAB`
tokens, the ChatML specials) on this repository's own text, wraps it with a ChatML
``chat_template`` and saves it beside a random ``Qwen2ForCausalLM`` of the given
:class:`ChatModelShape` whose EOS is ``<|im_end|>``. What serves it: the vLLM stage's tests
(:data:`TINY`, ``tests/voice/tiny_chat_model.py``) and ``realtime bench llm`` (real shapes such as
:data:`QWEN25_05B`: random weights at a real shape give real timings).

``text_only`` zeroes the tied embedding rows of every id that is not a plain ASCII text token
(the specials, ``<``-bearing and partial-byte tokens, the ids past the tokenizer's vocab), so
their logits are exactly 0 while the text tokens' are random: greedy decoding then never emits
EOS and every token detokenises to one non-empty piece (equal reply lengths, one streamed piece
per token; what a benchmark needs). Deterministic: the same repository text, shape, seed and
``device`` give the same directory (the weights are drawn on ``device``: a GPU draws a 0.5B model's
in well under a second where one CPU thread takes ~10 s; the two draw different values).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 1000
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class ChatModelShape:
    """A Qwen2 decoder's geometry, fields named as ``Qwen2Config``'s (``vocab_size`` may exceed
    the tokenizer's vocab)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    initializer_range: float = 0.02


# 2 layers, hidden 128, 427k parameters (~2 MB in float32); init 0.2: the default 0.02 decodes
# only newlines at this size, 0.2 gives varied text.
TINY = ChatModelShape("tiny", 128, 2, 4, 2, 256, 1024, 2048, initializer_range=0.2)
# Qwen2.5-0.5B-Instruct's published config (494M parameters, tied embeddings).
QWEN25_05B = ChatModelShape("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, 32768)
# Qwen2.5-7B-Instruct's published config (7.6B parameters; its embeddings are untied, these tied:
# the same FLOPs per token, 1.1 GB less to write); the voice bench's real-shape LLM.
QWEN25_7B = ChatModelShape("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, 32768)
SHAPES = {s.name: s for s in (TINY, QWEN25_05B, QWEN25_7B)}


def _training_text() -> list[str]:
    files = sorted(p for d in ("models", "docs") for p in (REPO / d).rglob("*") if p.suffix in (".py", ".md"))
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_training_text(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )


def text_token_ids(tokenizer) -> list[int]:
    """The ids whose text alone is non-empty printable ASCII without ``<`` (no markup, no specials)."""
    special = set(tokenizer.all_special_ids)
    out = []
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if i not in special and text and text.isascii() and text.isprintable() and "<" not in text:
            out.append(i)
    return out


def build_random_chat_model(
    out: Path,
    shape: ChatModelShape = TINY,
    *,
    dtype: torch.dtype = torch.float32,
    text_only: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Path:
    """Write the tokenizer and a random model of ``shape`` (saved as ``dtype``) into ``out``
    (created) and return it. ``text_only`` and ``device``: see the module docstring."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tokenizer()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    geometry = {f.name: getattr(shape, f.name) for f in fields(shape) if f.name != "name"}
    config = Qwen2Config(
        **geometry,
        tie_word_embeddings=True,
        eos_token_id=im_end,
        bos_token_id=im_end,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = im_end
    if text_only:
        embeddings = model.get_input_embeddings().weight
        keep = torch.zeros(shape.vocab_size, dtype=torch.bool, device=embeddings.device)
        keep[text_token_ids(tokenizer)] = True
        with torch.no_grad():
            embeddings[~keep] = 0.0
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
