"""``voice.asr_model``: a Hugging Face Whisper folder is served on torch by the voice kind, and a
missing or malformed folder fails the config load with one line naming the file (exit 2)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.voice.asr_torch import TorchWhisperAsr
from realtime.config import ConfigError, config_from_mapping
from realtime.protocols.oai_realtime import Dialect
from tests.voice.realtime_client import append_audio, connect, voice_server


def _config(**voice: object) -> dict:
    return {"robot": {"enabled": False}, "voice": {"enabled": True, **voice}}


def _edit_json(name: str, **changes: object) -> Callable[[Path], Path]:
    def edit(folder: Path) -> Path:
        data = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**data, **changes}))
        return folder / name

    return edit


def _remove(name: str) -> Callable[[Path], Path]:
    def remove(folder: Path) -> Path:
        (folder / name).unlink()
        return folder / name

    return remove


def _tensors(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], Path]:
    def rewrite(folder: Path) -> Path:
        tensors = load_file(folder / "model.safetensors")
        change(tensors)
        save_file(tensors, folder / "model.safetensors")
        return folder / "model.safetensors"

    return rewrite


def _wrong_shape(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.decoder.embed_positions.weight"] = torch.zeros(100, 32)


def _drop_one(tensors: dict[str, torch.Tensor]) -> None:
    del tensors["model.decoder.layers.1.fc2.bias"]


def _integers(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.encoder.conv1.bias"] = torch.zeros(32, dtype=torch.int32)


def _garbage(folder: Path) -> Path:
    (folder / "model.safetensors").write_bytes(b"not tensors")
    return folder / "model.safetensors"


def _not_a_tokenizer(folder: Path) -> Path:
    (folder / "tokenizer.json").write_text("{}")
    return folder / "tokenizer.json"


def _ctranslate2_without_tokenizer(folder: Path) -> Path:
    (folder / "model.bin").write_bytes(b"\0")
    (folder / "tokenizer.json").unlink()
    return folder / "tokenizer.json"


BROKEN = {
    "no config.json": (_remove("config.json"), "file not found"),
    "another model_type": (
        _edit_json("config.json", model_type="llama"),
        "model_type is 'llama', not 'whisper'",
    ),
    "a dimension missing": (_edit_json("config.json", d_model=None), "d_model must be a positive integer"),
    "no model.safetensors": (_remove("model.safetensors"), "file not found"),
    "not safetensors": (_garbage, "not a safetensors file"),
    "a tensor of the wrong shape": (
        _tensors(_wrong_shape),
        "tensor 'model.decoder.embed_positions.weight' has shape [100, 32], expected [448, 32]",
    ),
    "a missing tensor": (_tensors(_drop_one), "missing tensor 'model.decoder.layers.1.fc2.bias'"),
    "an integer tensor": (
        _tensors(_integers),
        "tensor 'model.encoder.conv1.bias' is I32, not F32, F16 or BF16",
    ),
    "untied logits": (
        _edit_json("config.json", tie_word_embeddings=False),
        "tie_word_embeddings is not true",
    ),
    "no tokenizer.json": (_remove("tokenizer.json"), "file not found"),
    "not a tokenizer": (_not_a_tokenizer, "not a tokenizer"),
    "mel bins unlike the model's": (
        _edit_json("preprocessor_config.json", feature_size=128),
        "feature_size 128 but the model has 80 mel bins",
    ),
    "a suppressed id past the vocabulary": (
        _edit_json("generation_config.json", suppress_tokens=[60000]),
        "suppress_tokens must be a list of token ids below 51865",
    ),
    "a CTranslate2 folder without its tokenizer": (_ctranslate2_without_tokenizer, "file not found"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_malformed_folder_fails_the_config_load_naming_the_file(tiny_whisper, tmp_path, case):
    folder = shutil.copytree(tiny_whisper, tmp_path / "whisper")
    break_it, reason = BROKEN[case]
    named = break_it(folder)
    with pytest.raises(ConfigError) as raised:
        config_from_mapping(_config(asr_model=str(folder)), source="deploy.yaml")
    message = str(raised.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("config error in deploy.yaml: field 'voice.asr_model': ")
    assert f"{named}: " in message and reason in message, message


def test_the_other_asr_fields_are_checked(tiny_whisper, tmp_path):
    absent = tmp_path / "absent"
    with pytest.raises(ConfigError, match=f"{absent}: no such folder"):
        config_from_mapping(_config(asr_model=str(absent)))
    with pytest.raises(ConfigError, match="voice.asr_device': must be cpu, cuda or cuda:N"):
        config_from_mapping(_config(asr_model=str(tiny_whisper), asr_device="gpu"))
    with pytest.raises(ConfigError, match="voice.asr_device': applies to a Hugging Face Whisper asr_model"):
        config_from_mapping(_config(asr_device="cuda"))
    config = config_from_mapping(
        _config(asr_model=str(tiny_whisper), asr_device="cuda:1", asr_dtype="float16")
    )
    assert config.voice.asr_name == "tiny" and config_from_mapping(_config()).voice.asr_name == "whisper-base"
    assert config_from_mapping({"voice": {"enabled": False, "asr_model": str(absent)}})  # checked when served


def test_serve_with_a_malformed_folder_exits_2_with_one_line(tiny_whisper, tmp_path, capsys):
    from realtime.cli import main

    folder = shutil.copytree(tiny_whisper, tmp_path / "whisper")
    (folder / "tokenizer.json").unlink()
    config = tmp_path / "deploy.yaml"
    config.write_text(f"robot: {{enabled: false}}\nvoice: {{enabled: true, asr_model: '{folder}'}}\n")
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{folder / 'tokenizer.json'}: file not found" in err, err
    assert not torch.cuda.is_initialized()


@pytest.mark.timeout(180)
@pytest.mark.asyncio(loop_scope="session")
async def test_a_spoken_turn_is_transcribed_by_the_configured_folder(tiny_whisper, spoken_question):
    """Random weights: the transcript is gibberish, but it is the folder's, through the protocol."""
    async with voice_server(asr_model=str(tiny_whisper)) as (url, service):
        assert isinstance(service.models_loaded["asr"], TorchWhisperAsr)
        assert service.models()[0].details["asr"] == "tiny"
        async with connect(url, Dialect.GA) as (conn, events):
            assert events.seen[0]["session"]["audio"]["input"]["transcription"]["model"] == "tiny"
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await append_audio(conn, spoken_question.pcm16_24k)
            got = await events.until("conversation.item.input_audio_transcription.completed", timeout=90)
    completed = got[-1]
    assert completed["transcript"].strip() and completed["usage"]["seconds"] > 1
    assert "input_audio_buffer.committed" in [e["type"] for e in got]
