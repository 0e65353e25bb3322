"""Text to speech: the hibari voice (a Kokoro-distilled ONNX model, 24 kHz), and clause splitting.

:class:`HibariTts` wraps ``hibari-tts``'s bundled default voice ("heart", American English): the
other voices download on first use, so the offline default uses only this one. It synthesizes a
clause in a few tens of milliseconds on one core, so the pipeline speaks clause by clause:
:class:`ClauseSplitter` (and :func:`split_clauses` over an iterable) turns the LLM's streamed text
pieces into speakable clauses as soon as each one is complete.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator

import numpy as np

from models.voice.weights import PackagedFile, verified_path

SAMPLE_RATE = 24_000

HIBARI_ONNX = PackagedFile(
    "hibari-tts",
    "0.2.1",
    "hibari/assets/hibari.onnx",
    "5f70741d4e900f4e85d0037498736cc1b3e1b9a63a13546a5da1e63abf4fccd8",
)

# A boundary needs the whitespace after the punctuation, so "3.5" and "Paris." + "com" stay whole.
_SENTENCE_END = re.compile(r"[.!?…]+[\"”’)\]]*\s+|\n+")
_CLAUSE_END = re.compile(r"[,;:—]\s+")


class HibariTts:
    """The hibari default voice, loaded once per process; ``synthesize`` is thread-safe.

    Calls are serialized by a lock (hibari's grapheme-to-phoneme stage is lazily built and keeps
    Python state); one sentence costs tens of milliseconds, so a lock is cheaper than one model
    per thread. ``threads`` is onnxruntime's intra-op thread count. Construction speaks one word
    to load the pronunciation lexicons (about 0.6 s) so the first real clause is fast.
    """

    sample_rate = SAMPLE_RATE

    def __init__(self, threads: int = 1) -> None:
        from hibari import Hibari  # here: the clause splitting above needs no TTS runtime

        self._voice = Hibari(model=str(verified_path(HIBARI_ONNX)), threads=threads)
        self._lock = threading.Lock()
        self.synthesize("Ready.")

    def synthesize(self, text: str, *, speed: float = 1.0, seed: int | None = 0) -> np.ndarray:
        """Speak ``text``: mono float32 at 24 kHz (empty for text with nothing to say).

        ``speed`` 1.0 is the voice's natural pace (0.5-2.0); a fixed ``seed`` makes the output
        reproducible (``None`` varies the noise component per call).
        """
        with self._lock:
            audio = self._voice(text, speed=speed, seed=seed)
        return np.asarray(audio, dtype=np.float32)


class ClauseSplitter:
    """Streamed text pieces in, complete clauses out (pure; one per response).

    A clause ends at sentence punctuation followed by whitespace, at a line break, or at a comma,
    semicolon, colon or dash followed by whitespace once the clause has ``min_clause_chars``
    characters (shorter ones sound choppy). A clause with no boundary is cut at its last space
    once it passes ``max_clause_chars`` (the bound on what waits for a boundary). With
    ``first_clause_words`` > 0 the first clause also ends after that many complete words (a word
    is complete once whitespace follows it), so speech can start before the first sentence is
    done; later clauses follow the rules above. ``flush`` returns the rest when the text stream ends.
    """

    def __init__(
        self, min_clause_chars: int = 24, max_clause_chars: int = 200, first_clause_words: int = 0
    ) -> None:
        self.min_clause_chars = min_clause_chars
        self.max_clause_chars = max_clause_chars
        self._first_words = (
            re.compile(rf"\s*(?:\S+\s+){{{first_clause_words}}}") if first_clause_words > 0 else None
        )
        self._buffer = ""

    def push(self, piece: str) -> list[str]:
        self._buffer += piece
        clauses = []
        while (end := self._boundary()) is not None:
            clause, self._buffer = self._buffer[:end].strip(), self._buffer[end:]
            if clause:
                clauses.append(clause)
                self._first_words = None
        return clauses

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []

    def _boundary(self) -> int | None:
        sentence = _SENTENCE_END.search(self._buffer)
        clause = next(
            (m for m in _CLAUSE_END.finditer(self._buffer) if m.start() >= self.min_clause_chars), None
        )
        first = self._first_words.match(self._buffer) if self._first_words is not None else None
        ends = [m.end() for m in (sentence, clause, first) if m is not None]
        if ends:
            return min(ends)
        if len(self._buffer) > self.max_clause_chars:
            space = self._buffer.rfind(" ", 0, self.max_clause_chars)
            return space + 1 if space > 0 else self.max_clause_chars
        return None


def split_clauses(text_stream: Iterable[str], **limits: int) -> Iterator[str]:
    """:class:`ClauseSplitter` over an iterable of pieces; ``limits`` go to its constructor."""
    splitter = ClauseSplitter(**limits)
    for piece in text_stream:
        yield from splitter.push(piece)
    yield from splitter.flush()
