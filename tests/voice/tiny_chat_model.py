"""A tiny random-weight Qwen2 chat model built locally (no hub): what the vLLM stage tests serve.

:func:`build_tiny_chat_model` trains a byte-level BPE tokenizer (vocab 1000, the ChatML specials)
on this repository's own text, wraps it with a ChatML ``chat_template`` and saves it beside a
random ``Qwen2Config`` model (2 layers, hidden 128, 427k parameters, float32, ~2 MB) whose EOS is
``<|im_end|>``; its greedy replies are varied nonsense text (words, spaces, punctuation).
Deterministic: the same repository text and seed give the same directory.
"""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
REPO = Path(__file__).resolve().parents[2]


def _training_text() -> list[str]:
    files = sorted(p for d in ("models", "docs") for p in (REPO / d).rglob("*") if p.suffix in (".py", ".md"))
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def build_tiny_chat_model(out: Path) -> Path:
    """Write the tokenizer and model into ``out`` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_training_text(), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.2,  # the default 0.02 decodes only newlines; this gives varied text
        eos_token_id=im_end,
        bos_token_id=im_end,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = im_end
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
