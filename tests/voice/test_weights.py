"""Packaged weight lookup, checksums and the build-once cache (models/voice/weights.py)."""

from __future__ import annotations

import hashlib

import pytest

from models.voice import weights
from models.voice.vad import SILERO_ONNX


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(weights.CACHE_ENV, str(tmp_path))
    return tmp_path


def test_packaged_file_is_found_and_verified():
    path = weights.verified_path(SILERO_ONNX)
    assert path.name == "silero_vad.onnx" and weights.sha256_file(path) == SILERO_ONNX.sha256


def test_wrong_checksum_missing_package_and_wrong_version_are_typed_errors():
    with pytest.raises(weights.WeightsError, match="expected 0000"):
        weights.verified_path(weights.PackagedFile("silero-vad", "6.2.3", SILERO_ONNX.path, "0000"))
    with pytest.raises(weights.WeightsError, match="pip install no-such-dist==1.0"):
        weights.locate(weights.PackagedFile("no-such-dist", "1.0", "x.bin", "00"))
    with pytest.raises(weights.WeightsError, match="silero-vad==0.1"):
        weights.locate(weights.PackagedFile("silero-vad", "0.1", SILERO_ONNX.path, "00"))


def test_build_once_builds_once_and_detects_a_corrupted_cache(cache):
    calls = []

    def build(out):
        calls.append(out)
        (out / "data.bin").write_bytes(b"weights")

    first = weights.build_once("thing", build)
    assert weights.build_once("thing", build) == first == cache / "thing" and len(calls) == 1
    manifest = (first / weights.MANIFEST).read_text()
    assert hashlib.sha256(b"weights").hexdigest() in manifest
    assert [p.name for p in cache.iterdir()] == ["thing"], "no temporary directory left behind"
    (first / "data.bin").write_bytes(b"tampered")
    with pytest.raises(weights.WeightsError, match="data.bin has sha256"):
        weights.build_once("thing", build)


def test_failed_build_leaves_nothing(cache):
    def build(out):
        (out / "partial.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        weights.build_once("thing", build)
    assert list(cache.iterdir()) == []


def test_a_build_s_progress_bar_stays_out_of_the_server_s_log(cache, capfd):
    """transformers' GGUF conversion draws a tqdm bar on stderr, the server's JSON-lines log (a
    fresh machine's first ``realtime serve`` printed carriage returns there): a build's stderr is dropped."""
    from tqdm.auto import tqdm

    def build(out):
        for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        (out / "data.bin").write_bytes(b"weights")

    weights.build_once("thing", build)
    assert capfd.readouterr().err == ""
