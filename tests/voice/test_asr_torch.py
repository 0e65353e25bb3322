"""Whisper on torch (models/voice/whisper.py, asr_torch.py) on random TINY weights: the loader and
the math against transformers' own ``WhisperForConditionalGeneration``, batching, determinism,
long audio, language detection, the random folders, and bfloat16 on a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from models.voice.asr import SHORT_WINDOW_SECONDS, build_asr, split_long
from models.voice.asr_torch import TorchWhisperAsr
from models.voice.whisper import WEIGHTS, WhisperDims, greedy, inspect_folder, parameter_shapes
from realtime.bench.random_whisper import LARGE_V3_TURBO, TINY, build_random_whisper
from tests.voice.speech import spoken_16k

SR = 16_000
STEPS = 40  # tokens decoded over a 30 s window in the comparison with transformers

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def asr(tiny_whisper: Path) -> TorchWhisperAsr:
    return TorchWhisperAsr(tiny_whisper)


def _noise(seconds: float, level: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * SR)) * level).astype(np.float32)


def _inputs() -> list[np.ndarray]:
    return [
        _noise(2.0, 0.1, 1),
        _noise(7.5, 0.5, 2),
        np.asarray(spoken_16k("What is the capital of France?")),
    ]


@pytest.fixture(scope="module")
def reference(tiny_whisper: Path, tmp_path_factory: pytest.TempPathFactory):
    """TINY with an end-of-text that wins wherever one common token would (random weights never end
    a text on their own): our ASR, transformers' model and its feature extractor on that folder."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    base = TorchWhisperAsr(tiny_whisper)
    _, decoded = base.decode([_noise(2.0, 0.1, 1)])
    common = max(set(decoded[0].tokens), key=decoded[0].tokens.count)
    folder = tmp_path_factory.mktemp("ends") / "tiny"
    shutil.copytree(tiny_whisper, folder)
    tensors = load_file(folder / WEIGHTS)
    embeddings = tensors["model.decoder.embed_tokens.weight"]
    embeddings[base.tokens.eot] = 1.5 * embeddings[common]
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
    hf = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    return TorchWhisperAsr(folder), hf, WhisperFeatureExtractor.from_pretrained(folder)


def _window_30s(extractor, audio: np.ndarray) -> torch.Tensor:
    return extractor(audio, sampling_rate=SR, return_tensors="pt").input_features  # padded to 30 s


def test_the_encoder_matches_transformers_on_a_30_s_window(reference):
    ours, hf, extractor = reference
    for audio in _inputs():
        mel = _window_30s(extractor, audio)
        with torch.inference_mode():
            theirs = hf.model.encoder(mel).last_hidden_state
            mine, mask = ours.model.encoder(mel, [mel.shape[-1]])
        assert mask is None and mine.shape == theirs.shape == (1, 1500, TINY.d_model)
        assert (mine - theirs).abs().max().item() < 1e-4


def test_greedy_tokens_and_log_probabilities_match_transformers_generate(reference):
    ours, hf, extractor = reference
    t = ours.tokens
    ended = 0
    for audio in _inputs():
        mel = _window_30s(extractor, audio)
        with torch.inference_mode():
            memory, mask = ours.model.encoder(mel, [mel.shape[-1]])
            caches = ours.model.decoder.start(memory, t.prompt_length + STEPS)
            prompt = t.prompt(t.languages["en"])
            mine = greedy(ours.model, caches, mask, [prompt], [STEPS], t, ours.checked.suppression)[0]
            out = hf.generate(
                mel,
                language="en",
                task="transcribe",
                return_timestamps=False,
                max_new_tokens=STEPS,
                return_dict_in_generate=True,
                output_scores=True,
            )
        assert out.sequences[0, : len(prompt)].tolist() == prompt
        theirs = out.sequences[0, len(prompt) :].tolist()
        if t.eot in theirs:
            theirs = theirs[: theirs.index(t.eot) + 1]
            ended += 1
        assert mine.tokens + [t.eot] * (len(theirs) > len(mine.tokens)) == theirs
        logprobs = [s[0].log_softmax(-1)[token].item() for s, token in zip(out.scores, theirs, strict=False)]
        assert mine.sum_logprob == pytest.approx(sum(logprobs), abs=1e-3)
    assert ended, "the end-of-text path is compared too"


def test_a_batch_gives_each_utterance_what_it_gets_alone_and_runs_repeat(asr, tiny_whisper):
    audios = [
        _noise(1.0, 0.1, 3),
        np.asarray(spoken_16k("How many legs does a spider have?")),
        np.zeros(0, np.float32),
    ]
    audios += [_noise(6.3, 0.3, 4), _noise(0.4, 1.0, 5)]
    batch = asr.transcribe_batch(audios)
    alone = [asr.transcribe(a) for a in audios]
    for b, a, audio in zip(batch, alone, audios, strict=True):
        assert (b.text, b.language) == (a.text, a.language) and b.text
        assert b.avg_logprob == pytest.approx(a.avg_logprob, abs=1e-4)
        assert b.no_speech_prob == pytest.approx(a.no_speech_prob, abs=1e-6)
        assert b.audio_seconds == len(audio) / SR and b.compute_seconds > 0
    again = TorchWhisperAsr(tiny_whisper).transcribe_batch(audios)
    assert [(t.text, t.avg_logprob, t.no_speech_prob) for t in again] == [
        (t.text, t.avg_logprob, t.no_speech_prob) for t in batch
    ]
    assert asr.transcribe_batch([]) == []


def test_an_utterance_over_29_s_is_cut_at_a_pause_and_its_parts_joined(asr):
    pause = np.zeros(SR // 2, np.float32)
    audio = np.concatenate([np.concatenate([_noise(2.5, 0.2, i), pause]) for i in range(12)])
    assert len(audio) / SR > SHORT_WINDOW_SECONDS
    windows = split_long(audio)
    assert len(windows) == 2
    whole = asr.transcribe(audio)
    parts = asr.transcribe_batch(windows)
    assert whole.text == " ".join(p.text for p in parts if p.text) and whole.text
    assert whole.audio_seconds == pytest.approx(len(audio) / SR)


def test_the_language_is_detected_when_none_is_set(tiny_whisper, asr):
    detecting = TorchWhisperAsr(tiny_whisper, language=None)
    transcripts = detecting.transcribe_batch(_inputs())
    assert all(t.language in asr.tokens.languages for t in transcripts)
    with pytest.raises(ValueError, match="xx"):
        TorchWhisperAsr(tiny_whisper, language="xx")


def test_build_asr_serves_a_hugging_face_folder_on_torch(tiny_whisper):
    built = build_asr(str(tiny_whisper))
    assert isinstance(built, TorchWhisperAsr) and built.device == "cpu" and built.dtype is torch.float32


def test_random_folders_are_deterministic_and_large_v3_turbo_has_its_real_size(tiny_whisper, tmp_path):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    again = build_random_whisper(tmp_path / "again", TINY)
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json"):
        assert (again / name).read_bytes() == (tiny_whisper / name).read_bytes(), name
    checked = inspect_folder(again)
    assert checked.dims.vocab_size == 51865 and checked.tokens.languages["en"] == 50259
    config = {
        f: getattr(LARGE_V3_TURBO, f) for f in ("d_model", "encoder_layers", "decoder_layers", "num_mel_bins")
    }
    config |= {f"{k}_attention_heads": LARGE_V3_TURBO.heads for k in ("encoder", "decoder")}
    config |= {f"{k}_ffn_dim": LARGE_V3_TURBO.ffn for k in ("encoder", "decoder")}
    config |= {"vocab_size": 51866, "max_source_positions": 1500, "max_target_positions": 448}
    shapes = parameter_shapes(WhisperDims.from_config(config, Path("config.json")))
    assert round(sum(int(np.prod(s)) for s in shapes.values()) / 1e6) == 809  # openai/whisper-large-v3-turbo
    with torch.device("meta"):
        theirs = WhisperForConditionalGeneration(WhisperConfig(**config)).state_dict()
    assert {name: tuple(t.shape) for name, t in theirs.items() if name != "proj_out.weight"} == shapes


def _teacher_forced(asr: TorchWhisperAsr, audios: list[np.ndarray], tokens: list[list[int]]) -> torch.Tensor:
    """The log-probabilities ``[B, k, vocab]`` (float32, CPU) of the ``k`` tokens after the
    prompt, given ``tokens`` before each, under the folder's suppression (equal-length audio)."""
    mels = np.stack([asr.mel(a) for a in audios])
    t, k = asr.tokens, len(tokens[0])
    with torch.inference_mode():
        memory, mask = asr.model.encoder(
            torch.from_numpy(mels).to(asr.torch_device, asr.dtype), [mels.shape[-1]] * len(audios)
        )
        caches = asr.model.decoder.start(memory, t.prompt_length + k)
        sequence = torch.tensor(
            [t.prompt(t.languages["en"]) + f[:-1] for f in tokens], device=asr.torch_device
        )
        logits = asr.model.decoder(sequence, 0, caches, mask)[:, t.prompt_length - 1 :].float().cpu()
        logits[..., list(asr.checked.suppression.tokens)] = -torch.inf
        logits[:, 0, list(asr.checked.suppression.at_begin)] = -torch.inf
        return logits.log_softmax(-1)


@pytest.mark.gpu
def test_bfloat16_on_cuda_picks_the_first_tokens_float32_picks_on_the_cpu(tiny_whisper, asr):
    """A batch of 8. Random weights leave many near ties (top two within a few tenths of a nat)
    that bfloat16's rounding may flip either way, so: each window's first 3 tokens agree wherever
    float32's choice leads by 0.4 nats (a quarter of them at least; bfloat16 on the CPU moved
    log-probabilities by up to 0.21 here), and bfloat16's log-probabilities of float32's top 10
    stay within 0.5 of float32's."""
    cuda = TorchWhisperAsr(tiny_whisper, device="cuda")
    assert cuda.dtype is torch.bfloat16 and cuda.sync_every == 4
    audios = [_noise(2.0, level, 10) for level in (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0)]
    _, ref = asr.decode(audios)
    _, got = cuda.decode(audios)
    assert [len(d.tokens) for d in got] == [len(d.tokens) for d in ref]
    firsts = [d.tokens[:3] for d in ref]
    cpu, gpu = _teacher_forced(asr, audios, firsts), _teacher_forced(cuda, audios, firsts)
    assert cpu.argmax(-1).tolist() == firsts
    top = cpu.topk(10, -1)
    clear = top.values[..., 0] - top.values[..., 1] > 0.4
    assert clear.sum() >= clear.numel() // 4, clear
    assert torch.equal(gpu.argmax(-1)[clear], cpu.argmax(-1)[clear])
    assert (gpu.gather(-1, top.indices) - top.values).abs().max() < 0.5
    clear_first = [i for i in range(len(audios)) if clear[i, 0]]
    assert [got[i].tokens[0] for i in clear_first] == [firsts[i][0] for i in clear_first]
