"""``clients/voice_client.py`` against the real server over loopback: a 16 kHz wav question in
(resampled by the client), transcripts out and the answer written as a 24 kHz wav."""

from __future__ import annotations

import wave

import numpy as np
import pytest

from clients.voice_client import RATE, converse, read_wav, write_wav
from tests.voice.realtime_client import API_KEY, voice_server
from tests.voice.speech import spoken_16k

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]


async def test_a_wav_question_is_answered_and_the_answer_written_as_wav(tmp_path, spoken_question):
    question = tmp_path / "question.wav"
    with wave.open(str(question), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes((spoken_16k(spoken_question.text) * 32767).astype("<i2").tobytes())
    heard: list[tuple[str, str]] = []
    async with voice_server() as (url, _):
        turn = await converse(url, API_KEY, audio=read_wav(question), on_text=lambda *p: heard.append(p))
    assert turn.status == "completed"
    assert all(w in turn.question.lower() for w in spoken_question.transcript_words)
    assert any(w in turn.answer.lower() for w in spoken_question.answer_words), turn.answer
    assert heard[0] == ("user", turn.question) and "".join(p for who, p in heard[1:]) == turn.answer
    answer = tmp_path / "answer.wav"
    write_wav(answer, turn.audio)
    with wave.open(str(answer), "rb") as w:
        assert w.getframerate() == RATE and w.getnframes() == len(turn.audio) // 2 > RATE // 2
    assert np.abs(np.frombuffer(turn.audio, "<i2")).max() > 1000  # speech, not silence
