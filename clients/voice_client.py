"""A small voice client for ``/v1/realtime`` on the official ``openai`` SDK's realtime connection.

It sends one spoken turn (a wav file, any rate, mono or the first channel; or raw pcm16 24 kHz),
prints the transcripts as they arrive and writes the answer's audio to a wav file::

    python -m clients.voice_client question.wav --out answer.wav \\
        --url ws://127.0.0.1:8000/v1 --api-key "$REALTIME_API_KEY"

The turn is committed by the client (``turn_detection: null``), so a file works without trailing
silence; ``--text`` sends a typed question instead of audio. :func:`converse` is the library entry
point (one connection, one turn, a :class:`Turn` back).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr
from openai import AsyncOpenAI

RATE = 24_000  # pcm16 mono, the Realtime API's audio format
APPEND_BYTES = RATE * 2 // 5  # 200 ms per append


@dataclass(frozen=True)
class Turn:
    """One exchange: what the server heard, what it answered, and the answer's pcm16 24 kHz audio."""

    question: str
    answer: str
    audio: bytes
    status: str  # the response's final status: completed, incomplete, cancelled, failed


def read_wav(path: Path) -> bytes:
    """A wav file as pcm16 mono 24 kHz (first channel, resampled with soxr when needed)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit wav is supported, not {8 * w.getsampwidth()}-bit")
        frames = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels())[:, 0]
        rate = w.getframerate()
    samples = frames.astype(np.float32) / 32768
    if rate != RATE:
        samples = soxr.resample(samples, rate, RATE)
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def write_wav(path: Path, pcm: bytes) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)


async def converse(
    url: str,
    api_key: str,
    *,
    audio: bytes | None = None,
    text: str | None = None,
    model: str = "gpt-realtime",
    on_text: Callable[[str, str], None] = lambda who, piece: None,
    timeout_s: float = 120.0,
) -> Turn:
    """One turn over a GA connection: ``audio`` (pcm16 24 kHz) or ``text`` in, the :class:`Turn` out.

    ``on_text(who, piece)`` gets the user's transcript (``who="user"``) and the answer's
    transcript deltas (``who="assistant"``) as they arrive. Raises ``TimeoutError`` when the
    answer takes longer than ``timeout_s`` and ``RuntimeError`` on a server ``error`` event.
    """
    if (audio is None) == (text is None):
        raise ValueError("give exactly one of audio or text")
    client = AsyncOpenAI(websocket_base_url=url, api_key=api_key)
    async with client.realtime.connect(model=model) as conn:
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        if audio is not None:
            for start in range(0, len(audio), APPEND_BYTES):
                chunk = audio[start : start + APPEND_BYTES]
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            await conn.input_audio_buffer.commit()
        else:
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            )
            on_text("user", text or "")
        await conn.response.create()
        question, answer, pcm = text or "", [], bytearray()
        async with asyncio.timeout(timeout_s):
            async for event in conn:
                if event.type == "error":
                    raise RuntimeError(f"{event.error.code}: {event.error.message}")
                if event.type == "conversation.item.input_audio_transcription.completed":
                    question = event.transcript
                    on_text("user", question)
                elif event.type == "response.output_audio_transcript.delta":
                    answer.append(event.delta)
                    on_text("assistant", event.delta)
                elif event.type == "response.output_audio.delta":
                    pcm += base64.b64decode(event.delta)
                elif event.type == "response.done":
                    return Turn(question, "".join(answer), bytes(pcm), event.response.status or "")
    raise RuntimeError("the connection closed before the response was done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", nargs="?", type=Path, help="a wav file, or .pcm (pcm16 mono 24 kHz)")
    parser.add_argument("--text", help="a typed question instead of audio")
    parser.add_argument("--out", type=Path, default=Path("answer.wav"), help="where the answer audio goes")
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1", help="the server's websocket base URL")
    parser.add_argument("--api-key", default="none", help="the server's API key (when it has keys)")
    parser.add_argument("--model", default="gpt-realtime")
    args = parser.parse_args(argv)
    if (args.input is None) == (args.text is None):
        parser.error("give an input file or --text")
    audio = None
    if args.input is not None:
        audio = args.input.read_bytes() if args.input.suffix == ".pcm" else read_wav(args.input)

    def show(who: str, piece: str) -> None:
        if who == "user":
            print(f"you: {piece}", flush=True)
        else:
            print(piece, end="", flush=True)

    turn = asyncio.run(
        converse(args.url, args.api_key, audio=audio, text=args.text, model=args.model, on_text=show)
    )
    print()
    write_wav(args.out, turn.audio)
    print(
        f"[{turn.status}] {len(turn.audio) / (2 * RATE):.1f} s of answer audio -> {args.out}", file=sys.stderr
    )
    return 0 if turn.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
