"""umT5 prompt conditioning (models/world/text_encoder.py) on a tiny encoder in Wan's layout.

``write_wan_t5_folder`` lays out a Wan checkpoint folder the way Wan ships it
(``models_t5_umt5-xxl-enc-bf16.pth`` with Wan's own key names, bf16, and ``google/umt5-xxl/`` with
the tokenizer): random weights at a tiny size, and a tokenizer trained here on a few sentences (no
download). ``wan_reference`` restates Wan's encoder math (``wan/modules/t5.py``) so CI notices if
transformers' UMT5 ever drifts from it; the one-off run against Wan's own code is recorded in
docs/models-world-vae-t5.md.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from models.world.configs import CheckpointError
from models.world.text_encoder import (
    TEXT_LEN,
    WAN_T5_FILE,
    PrecomputedEmbeddings,
    PromptEmbedder,
    UMT5TextEncoder,
    UnknownPromptError,
    clean_prompt,
    main,
    save_prompt_embeddings,
)

TINY = dict(vocab=128, dim=32, heads=4, ffn=64, layers=2, buckets=32)
CORPUS = [
    "a red car drives through a rainy city at night",
    "a cat sleeps on a warm windowsill",
    "waves crash against the rocky shore",
    "a small robot explores a dusty maze",
    "snow falls over a quiet forest",
]


def build_tokenizer(folder: Path) -> Path:
    """A tiny umT5-style tokenizer (sentencepiece unigram; <pad> 0, </s> 1, <unk> 2; </s> appended)."""
    from tokenizers.implementations import SentencePieceUnigramTokenizer
    from transformers import T5TokenizerFast

    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(
        CORPUS * 10,
        vocab_size=100,
        special_tokens=["<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        show_progress=False,
    )
    fast = T5TokenizerFast(
        tokenizer_object=tok._tokenizer, eos_token="</s>", pad_token="<pad>", unk_token="<unk>", extra_ids=0
    )
    fast.save_pretrained(str(folder))
    return folder


def wan_t5_tensors(seed: int = 0, **size) -> dict[str, torch.Tensor]:
    """Random tensors under Wan's T5Encoder names (``umt5_xxl(encoder_only=True)``'s state dict)."""
    s = {**TINY, **size}
    g = torch.Generator().manual_seed(seed)
    d, f = s["dim"], s["ffn"]

    def rnd(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    out = {"token_embedding.weight": rnd(s["vocab"], d, std=1.0)}
    for i in range(s["layers"]):
        b = f"blocks.{i}."
        out[b + "norm1.weight"] = 0.5 + torch.rand(d, generator=g)
        for name in "qkv":
            out[b + f"attn.{name}.weight"] = rnd(d, d, std=d**-0.5)
        out[b + "attn.o.weight"] = rnd(d, d, std=d**-0.5)
        out[b + "norm2.weight"] = 0.5 + torch.rand(d, generator=g)
        out[b + "ffn.gate.0.weight"] = rnd(f, d, std=d**-0.5)
        out[b + "ffn.fc1.weight"] = rnd(f, d, std=d**-0.5)
        out[b + "ffn.fc2.weight"] = rnd(d, f, std=f**-0.5)
        out[b + "pos_embedding.embedding.weight"] = rnd(s["buckets"], s["heads"], std=1.0)
    out["norm.weight"] = 0.5 + torch.rand(d, generator=g)
    return out


def write_wan_t5_folder(folder: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Wan's checkpoint folder: the encoder .pth (bf16, as shipped) and google/umt5-xxl/."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = wan_t5_tensors() if tensors is None else tensors
    torch.save({k: v.to(torch.bfloat16) for k, v in tensors.items()}, folder / WAN_T5_FILE)
    build_tokenizer(folder / "google" / "umt5-xxl")
    return folder


def wan_reference(tensors: dict[str, torch.Tensor], ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Wan's T5Encoder.forward restated (float64): per-layer bidirectional relative position bias
    (32 buckets, max distance 128), no attention scaling, tanh-GELU gate, RMS norms (eps 1e-6)."""
    t = {k: v.double() for k, v in tensors.items()}
    heads, n = t["blocks.0.pos_embedding.embedding.weight"].shape[1], ids.shape[1]

    def norm(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # key - query
    buckets = (rel > 0).long() * 16
    rel = rel.abs()
    large = 8 + (torch.log(rel.double() / 8) / math.log(128 / 8) * 8).long()
    buckets = buckets + torch.where(rel < 8, rel, large.clamp(max=15))
    x = t["token_embedding.weight"][ids]
    b, layers = x.shape[0], 1 + max(int(k.split(".")[1]) for k in t if k.startswith("blocks."))
    for i in range(layers):
        p = f"blocks.{i}."
        h = norm(x, t[p + "norm1.weight"])
        q, k, v = (h @ t[p + f"attn.{c}.weight"].T for c in "qkv")
        q, k, v = (y.view(b, n, heads, -1) for y in (q, k, v))
        bias = t[p + "pos_embedding.embedding.weight"][buckets].permute(2, 0, 1)[None]
        bias = bias.masked_fill(mask.view(b, 1, 1, n) == 0, torch.finfo(torch.float64).min)
        attn = F.softmax(torch.einsum("binc,bjnc->bnij", q, k) + bias, dim=-1)
        x = x + torch.einsum("bnij,bjnc->binc", attn, v).reshape(b, n, -1) @ t[p + "attn.o.weight"].T
        h = norm(x, t[p + "norm2.weight"])
        gate = F.gelu(h @ t[p + "ffn.gate.0.weight"].T, approximate="tanh")
        x = x + (h @ t[p + "ffn.fc1.weight"].T * gate) @ t[p + "ffn.fc2.weight"].T
    return norm(x, t["norm.weight"])


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory) -> Path:
    return write_wan_t5_folder(tmp_path_factory.mktemp("wan-t5") / "Wan2.1-T2V-1.3B")


@pytest.fixture(scope="module")
def encoder(wan_folder) -> UMT5TextEncoder:
    return UMT5TextEncoder.load(wan_folder, dtype=torch.float64)


def test_embeddings_follow_wans_math(wan_folder, encoder):
    prompts = ["a red car drives through a rainy city at night", "a cat sleeps"]
    batch = encoder.tokenizer(prompts, padding="longest", return_tensors="pt")
    tensors = {k: v.float() for k, v in torch.load(wan_folder / WAN_T5_FILE, weights_only=True).items()}
    ref = wan_reference(tensors, batch.input_ids, batch.attention_mask)
    out = PromptEmbedder(encoder)(prompts)
    for i, n in enumerate(batch.attention_mask.sum(1).tolist()):
        # both norms take the mean square in float32 (Wan's T5LayerNorm and transformers' alike)
        torch.testing.assert_close(out[i, :n], ref[i, :n], rtol=1e-5, atol=1e-5)


def test_output_is_zero_beyond_each_prompt(encoder):
    long = "snow " * 600  # more than TEXT_LEN tokens: truncated, </s> kept
    out = PromptEmbedder(encoder)(["a cat", "", long])
    lengths = [len(encoder.tokenizer(p).input_ids) for p in ("a cat", "")]
    assert out.shape == (3, TEXT_LEN, TINY["dim"]) and out.dtype == torch.float64
    for i, n in enumerate(lengths):
        assert out[i, :n].abs().min() > 0 and (out[i, n:] == 0).all()
    assert lengths[1] == 1  # an empty prompt is </s> alone
    assert (out[2].abs().sum(-1) > 0).all()
    ids = encoder.tokenizer([long], truncation=True, max_length=TEXT_LEN).input_ids[0]
    assert len(ids) == TEXT_LEN and ids[-1] == encoder.tokenizer.eos_token_id


def test_a_prompt_embeds_the_same_alone_or_batched(encoder):
    embed = PromptEmbedder(encoder, cache_prompts=0)
    alone = embed(["a cat sleeps"])[0]
    batched = embed(["waves crash against the rocky shore at night", "a cat sleeps"])[1]
    torch.testing.assert_close(alone, batched, rtol=0, atol=1e-12)


def test_prompts_are_cleaned_as_wan_does():
    assert (
        clean_prompt("  it’s a “quoted”\t\tscene &amp;amp; ＡＢＣ，ok \n")
        == 'it\'s a "quoted" scene & ABC,ok'
    )
    assert clean_prompt("a\x1ccat") == "acat"  # ftfy drops controls that re's \s and regex's disagree on


def test_cache_is_a_bounded_lru(encoder):
    embed = PromptEmbedder(encoder, cache_prompts=2)
    a = embed(["a cat", "a  cat "])  # one prompt after cleaning: encoded once
    assert embed.encoded == 1
    torch.testing.assert_close(a[0], a[1], rtol=0, atol=0)
    embed(["a dog"])
    embed(["a cat"])  # hit: "a dog" is now the least recently used
    assert embed.encoded == 2
    embed(["snow falls"])  # evicts "a dog"
    embed(["a cat"])
    assert embed.encoded == 3
    embed(["a dog"])
    assert embed.encoded == 4
    uncached = PromptEmbedder(encoder, cache_prompts=0)
    uncached(["a cat"])
    uncached(["a cat"])
    assert uncached.encoded == 2


def test_concurrent_callers_get_consistent_embeddings(encoder):
    embed = PromptEmbedder(encoder, cache_prompts=8)
    prompts = ["a cat", "a dog", "snow falls", "waves crash"]
    results: list[torch.Tensor] = []

    def work() -> None:
        results.append(embed(prompts))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert embed.encoded == len(prompts)
    for r in results[1:]:
        torch.testing.assert_close(r, results[0], rtol=0, atol=0)


def test_precomputed_embeddings_serve_without_the_encoder(tmp_path, encoder):
    prompts = ["a red car drives through a rainy city at night", "a cat sleeps"]
    path = tmp_path / "prompts.safetensors"
    save_prompt_embeddings(path, prompts, PromptEmbedder(encoder), batch=1)
    pre = PrecomputedEmbeddings.load(path, dim=TINY["dim"], dtype=torch.float64)
    assert len(pre) == 3  # and the empty prompt, for sessions without one
    served = PromptEmbedder(pre)
    asked = [*prompts, "  a cat  sleeps", None]
    torch.testing.assert_close(served(asked), PromptEmbedder(encoder)([*prompts, "a cat sleeps", ""]))
    with pytest.raises(UnknownPromptError, match="serves 3 fixed prompts") as err:
        served(["a dog"])
    assert str(tmp_path) not in str(err.value) and isinstance(err.value, ValueError)


def test_precomputed_file_may_hold_raw_keys_and_padded_tensors(tmp_path, encoder):
    """Keys are cleaned on load; a [512, dim] zero-padded tensor (Self-Forcing's form) is accepted."""
    padded = PromptEmbedder(encoder)(["a cat sleeps"])[0]
    path = tmp_path / "padded.safetensors"
    save_file({"  a “cat”   sleeps ": padded.float().contiguous()}, str(path))
    served = PromptEmbedder(PrecomputedEmbeddings.load(path, dim=TINY["dim"], dtype=torch.float64))
    torch.testing.assert_close(served(['a "cat" sleeps'])[0], padded, rtol=0, atol=1e-6)


def _embeddings_file(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent.safetensors", "no such file"),
        (
            lambda d: (d / "junk.safetensors").write_bytes(b"\x00" * 20) and d / "junk.safetensors",
            "not a safetensors",
        ),
        (
            lambda d: _embeddings_file(d, {"a cat": torch.zeros(3, 16)}),
            r"shape \(3, 16\), expected \[1..512, 32\]",
        ),
        (lambda d: _embeddings_file(d, {"a cat": torch.zeros(1, 3, 32)}), "shape"),
        (lambda d: _embeddings_file(d, {"a cat": torch.zeros(513, 32)}), "shape"),
        (lambda d: _embeddings_file(d, {"a cat": torch.zeros(0, 32)}), "shape"),
        (lambda d: _embeddings_file(d, {"a cat": torch.zeros(3, 32, dtype=torch.int32)}), "dtype I32"),
        (
            lambda d: _embeddings_file(d, {"a cat": torch.zeros(3, 32), "a  cat": torch.zeros(3, 32)}),
            "clean to the same",
        ),
        (lambda d: _embeddings_file(d, {}), "holds no prompts"),
    ],
)
def test_malformed_embeddings_files_raise_one_clear_error(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as err:
        PrecomputedEmbeddings.load(path, dim=TINY["dim"])
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_every_layout_loads_the_same_encoder(tmp_path, wan_folder, encoder):
    prompts = ["a cat sleeps", "snow falls over a quiet forest"]
    want = PromptEmbedder(encoder)(prompts)
    by_file = UMT5TextEncoder.load(wan_folder / WAN_T5_FILE, dtype=torch.float64)  # tokenizer beside it
    hf = tmp_path / "umt5-hf"
    encoder.model.save_pretrained(str(hf))
    encoder.tokenizer.save_pretrained(str(hf))
    by_hf = UMT5TextEncoder.load(hf, dtype=torch.float64)
    explicit = UMT5TextEncoder.load(hf, tokenizer=wan_folder / "google" / "umt5-xxl", dtype=torch.float64)
    for other in (by_file, by_hf, explicit):
        torch.testing.assert_close(PromptEmbedder(other)(prompts), want, rtol=0, atol=1e-12)
    assert by_hf.model.encoder.embed_tokens.weight is by_hf.model.shared.weight
    assert encoder.model.encoder.embed_tokens.weight is encoder.model.shared.weight  # one tensor


def _broken_folder(tmp_path: Path, edit) -> Path:
    tensors = wan_t5_tensors()
    edit(tensors)
    return write_wan_t5_folder(tmp_path / "broken", tensors)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent", "no such file or folder"),
        (lambda d: d, "not a umT5 encoder"),
        (
            lambda d: _broken_folder(d, lambda t: t.pop("blocks.1.ffn.fc2.weight")),
            "missing tensor 'blocks.1.ffn.fc2.weight'",
        ),
        (lambda d: _broken_folder(d, lambda t: t.pop("norm.weight")), "missing tensor 'norm.weight'"),
        (
            lambda d: _broken_folder(d, lambda t: t.update({"blocks.0.attn.o.weight": torch.zeros(32, 16)})),
            r"'blocks.0.attn.o.weight' has shape \(32, 16\), expected \(32, 32\)",
        ),
        (
            lambda d: _broken_folder(d, lambda t: t.update({"head.weight": torch.zeros(4, 4)})),
            "unexpected tensor 'head.weight'",
        ),
        (
            lambda d: _broken_folder(d, lambda t: t.update({"token_embedding.weight": torch.zeros(20, 32)})),
            r"tokenizer has \d+ tokens, the encoder embeds 20",
        ),
    ],
)
def test_malformed_encoders_raise_one_clear_error(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as err:
        UMT5TextEncoder.load(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(str(path))


def test_missing_or_broken_tokenizer_is_named(tmp_path, wan_folder):
    with pytest.raises(CheckpointError, match="no tokenizer folder") as err:
        UMT5TextEncoder.load(wan_folder, tokenizer=tmp_path / "nowhere")
    assert str(err.value).startswith(str(tmp_path / "nowhere"))
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot load the tokenizer"):
        UMT5TextEncoder.load(wan_folder, tokenizer=tmp_path / "tok")


def test_hf_folder_of_another_model_is_refused(tmp_path):
    from transformers import T5Config

    T5Config(vocab_size=128, d_model=32, num_layers=1, num_heads=4, d_kv=8, d_ff=64).save_pretrained(
        str(tmp_path)
    )
    build_tokenizer(tmp_path)
    with pytest.raises(CheckpointError, match="model_type 't5', expected 'umt5'"):
        UMT5TextEncoder.load(tmp_path)


def test_main_precomputes_an_embeddings_file(tmp_path, wan_folder, capsys):
    out = tmp_path / "prompts.safetensors"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat sleeps\n\nsnow falls\n")
    assert (
        main(["--text-encoder", str(wan_folder), "--out", str(out), "--prompts-file", str(prompts), "a dog"])
        == 0
    )
    assert "wrote 4 prompt embeddings" in capsys.readouterr().out
    assert len(PrecomputedEmbeddings.load(out, dim=TINY["dim"])) == 4  # the empty prompt too
    assert main(["--text-encoder", str(tmp_path / "absent"), "--out", str(out), "a dog"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file or folder" in err
