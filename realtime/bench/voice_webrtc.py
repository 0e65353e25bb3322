"""``realtime bench voice --transport webrtc``: time to first audio over WebRTC vs websocket (issue 31).

    OMP_NUM_THREADS=1 realtime bench voice --transport webrtc

One server in this process (the voice kind on the transformers LLM, WebRTC calls on loopback host
candidates: ``webrtc.host_addresses: [127.0.0.1]``). At each ``--sessions`` count N, N users each
hold a GA websocket connection (plain ``websockets``) and a WebRTC call (``clients/webrtc_call.py``,
aiortc, Opus both ways) and ask ``--question`` over both in turn, ``--rounds`` rounds (the first a
warm-up; which transport goes first alternates). A turn: the question spoken at real-time pace
(websocket: 20 ms appends; WebRTC: the call's microphone, real time by nature; 0.5 s of silence
before, 1 s after), server VAD ends it, the response is cut at its first audio (websocket:
``response.cancel``, then ``conversation.item.truncate`` at what played once it is done;
WebRTC: ``output_audio_buffer.clear``, which cancels, clears and truncates on the server) and the
turn ends at ``response.done`` and the truncation (on WebRTC, ``output_audio_buffer.cleared``).
Both conversations get the same edits, so both LLM prompts (and their KV reuse) stay alike. Users start spread
over one round, so their turns end at unrelated moments. The clients run in a second process
(spawned): a call's aiortc work on the client side is as much as on the server's, and a browser
does it on its own machine, so it stays off the server's event loop (not off the box's cores).

**TTFA**, client side: from receiving ``input_audio_buffer.speech_stopped`` to the first
*audible* audio, the same on both transports: WebRTC, the first audible 20 ms frame decoded from
the call's track (``RealtimeCall.first_audible_at``: RMS > 0.005; the client's receive jitter
buffer at 0 frames, so a frame is timed when the packet after it arrives, as a websocket delta
is timed on arrival: what a player buffers after that is the client's choice on both
transports, and aiortc's fixed 4 frames would add 80 ms no browser adds on loopback); websocket, the first
``response.output_audio.delta`` plus the reply's *onset*, where its first audible 20 ms window
lies in its audio (the time a client that plays from the first delta starts to sound). The onset
is the TTS's lead-in (~0.25-0.3 s of near-zero samples before the first word): the track carries
it as silence, so its first audible frame includes it and the first delta does not. Where WebRTC's
extra time goes, per turn: ``speech_stopped`` -> ``output_audio_buffer.started`` (sent when the
server's track pulls the response's first frame: the websocket's first delta plus the wait for
the track's 20 ms tick) and started -> audible less the onset (the media path: Opus encode, RTP on
loopback, the client's receive jitter buffer, decode).

Last line: JSON with ``ttfa_ms_N_websocket`` / ``ttfa_ms_N_webrtc`` (p50) and their ``_p95``,
``webrtc_added_ttfa_p50_ms`` (p50 WebRTC - p50 websocket at 1 session; the issue's goal) and
``webrtc_added_ttfa_p50_ms_N`` for the other counts; and p50s of the parts:
``first_delta_ms_N_websocket``, ``reply_onset_ms_N``, ``webrtc_started_ms_N``,
``webrtc_media_ms_N``; ``turns_N`` (measured turns per transport).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import json
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import websockets

from realtime.bench.goals import goal_note
from realtime.bench.voice_load import percentile

APPEND_MS = 20  # the websocket's appends: one WebRTC frame's worth each
RATE = 24_000  # the bench's speech and the websocket's pcm16
WINDOW = RATE // 50  # 20 ms: the onset window, one Opus frame
AUDIBLE_RMS = 0.005  # as clients/webrtc_call.py: louder than this is speech
TURN_TIMEOUT_S = 120.0
TRANSPORTS = ("websocket", "webrtc")


@dataclass(frozen=True, slots=True)
class Turn:
    """One measured turn: ``ttfa_ms`` (to the first audible audio); websocket: ``first_ms`` (to
    the first delta) and ``onset_ms`` (where the reply's first audible 20 ms lies in its audio);
    WebRTC: ``started_ms`` (to ``output_audio_buffer.started``)."""

    ttfa_ms: float
    first_ms: float | None = None
    onset_ms: float | None = None
    started_ms: float | None = None


def onset_ms(pcm: bytes) -> float | None:
    """Where the first audible 20 ms window of pcm16 24 kHz audio starts, in ms; None if none is."""
    audio = np.frombuffer(pcm, np.int16)[: len(pcm) // 2 // WINDOW * WINDOW].astype(np.float32) / 32768.0
    rms = np.sqrt(np.mean(audio.reshape(-1, WINDOW) ** 2, axis=1))
    loud = np.flatnonzero(rms > AUDIBLE_RMS)
    return float(loud[0] * 20) if len(loud) else None


async def stream(ws: Any, pcm: bytes) -> None:
    """``pcm`` as ``APPEND_MS`` appends at real-time pace."""
    step = RATE * 2 * APPEND_MS // 1000
    start = time.perf_counter()
    for n, offset in enumerate(range(0, len(pcm), step)):
        chunk = base64.b64encode(pcm[offset : offset + step]).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        await asyncio.sleep(max(0.0, start + (n + 1) * APPEND_MS / 1000 - time.perf_counter()))


async def websocket_turn(ws: Any, pcm: bytes) -> Turn:
    """Speak, time the first delta, read on to the reply's onset, cancel, until ``response.done``;
    then truncate the reply to what played, as a websocket client does when it stops playing
    (the WebRTC turn's clear makes the server do the same: both conversations stay alike)."""
    speaking = asyncio.create_task(stream(ws, pcm))
    stopped = first = None
    response_id, item_id, audio, cancelled = None, "", b"", False
    try:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            while True:
                event = json.loads(await ws.recv())
                kind, now = event["type"], time.perf_counter()
                if kind == "input_audio_buffer.speech_stopped":
                    stopped = now
                elif kind == "response.created" and stopped is not None:
                    response_id = event["response"]["id"]
                elif kind == "response.output_audio.delta" and event["response_id"] == response_id:
                    first, item_id = first or now, event["item_id"]
                    audio += base64.b64decode(event["delta"])
                    if not cancelled and onset_ms(audio) is not None:
                        cancelled = True
                        await ws.send(json.dumps({"type": "response.cancel"}))
                elif kind == "error" and event["error"].get("code") != "response_cancel_not_active":
                    raise RuntimeError(f"server error: {event['error']}")  # not a cancel that came late
                elif kind == "response.done" and event["response"]["id"] == response_id:
                    if event["response"]["status"] == "failed" or first is None:
                        raise RuntimeError(f"response failed: {event['response'].get('status_details')}")
                    played = (onset_ms(audio) or 0) + 1000 * WINDOW // RATE  # through the onset window
                    truncate = {"item_id": item_id, "content_index": 0, "audio_end_ms": int(played)}
                    await ws.send(json.dumps({"type": "conversation.item.truncate", **truncate}))
                elif kind == "conversation.item.truncated" and event["item_id"] == item_id:
                    break
            await speaking  # the question's tail of silence
    finally:
        speaking.cancel()
    assert stopped is not None and first is not None
    onset = onset_ms(audio)
    if onset is None:
        raise RuntimeError("a reply without audible audio")
    first_ms = (first - stopped) * 1000
    return Turn(first_ms + onset, first_ms=first_ms, onset_ms=onset)


async def webrtc_turn(call: Any, samples: np.ndarray) -> Turn:
    """Speak, time the first audible frame, clear, until ``response.done`` and ``cleared``."""
    after = call.mark()
    call.speak(samples, RATE)
    stopped = await call.next_event("input_audio_buffer.speech_stopped", TURN_TIMEOUT_S, after)
    stopped_at = call.received_at[call.events.index(stopped)]
    call.mark()  # the assistant's audio comes after this; anything before was the last turn's
    audible = await call.audible(TURN_TIMEOUT_S)
    call.send({"type": "output_audio_buffer.clear"})
    done = await call.next_event("response.done", TURN_TIMEOUT_S, after)
    await call.next_event("output_audio_buffer.cleared", TURN_TIMEOUT_S, after)
    errors = [e["error"] for e in call.events[after:] if e["type"] == "error"]
    if errors or done["response"]["status"] == "failed":
        raise RuntimeError(f"turn failed: {errors or done['response'].get('status_details')}")
    started = await call.next_event("output_audio_buffer.started", 1, after)
    started_at = call.received_at[call.events.index(started)]
    return Turn((audible - stopped_at) * 1000, started_ms=(started_at - stopped_at) * 1000)


async def user(
    url: str, base: str, pcm: bytes, rounds: int, start_s: float, first: int
) -> dict[str, list[Turn]]:
    """One user: a websocket connection and a WebRTC call, ``rounds`` rounds of a turn on each
    (``first``: which transport opens round 0; they alternate); the first round is a warm-up."""
    from clients.webrtc_call import RealtimeCall

    await asyncio.sleep(start_s)
    samples = np.frombuffer(pcm, np.int16).astype(np.float32) / 32768.0
    out: dict[str, list[Turn]] = {t: [] for t in TRANSPORTS}
    call = RealtimeCall(base, receive_buffer_frames=0)  # loopback: time audio as it arrives
    try:
        await call.connect()
        await call.next_event("session.created", 30)
        async with websockets.connect(url, max_size=1 << 22) as ws:
            created = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert created["type"] == "session.created", created
            for r in range(rounds):
                for t in TRANSPORTS if (r + first) % 2 == 0 else TRANSPORTS[::-1]:
                    turn = await (websocket_turn(ws, pcm) if t == "websocket" else webrtc_turn(call, samples))
                    if r:
                        out[t].append(turn)
    finally:
        await call.close()
    return out


def run_users(url: str, base: str, pcm: bytes, n: int, rounds: int, round_s: float) -> dict[str, list[Turn]]:
    """``n`` users at once (in the clients' process), starting spread over ``round_s``; their
    measured turns by transport."""

    async def users() -> dict[str, list[Turn]]:
        runs = [user(url, base, pcm, rounds, i * round_s / n, i % 2) for i in range(n)]
        turns: dict[str, list[Turn]] = {t: [] for t in TRANSPORTS}
        for result in await asyncio.gather(*runs):
            for t in TRANSPORTS:
                turns[t] += result[t]
        return turns

    return asyncio.run(users())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from realtime.bench.voice import spoken, until_released, voice_server

    sessions = sorted(args.sessions)
    figures: dict[str, Any] = {}
    server = argparse.Namespace(**{**vars(args), "sessions": [2 * max(sessions)]})  # each user holds two
    webrtc = {"host_addresses": ["127.0.0.1"], "max_calls": max(sessions)}
    async with voice_server(server, webrtc=webrtc) as (url, service):
        base = url.replace("ws://", "http://").removesuffix("/v1/realtime")
        pcm, _ = spoken(service.models_loaded["tts"], args.question)
        round_s = 2 * (len(pcm) / (2 * RATE) + 0.5)  # about a round: both turns, each cut at first audio
        print(f"TTFA, speech_stopped -> the first audible audio, ms ({args.rounds - 1} measured rounds per user "
              "after a warm-up): websocket: the first delta + where the reply's first audible 20 ms lies "
              "in it (onset); WebRTC: the first audible frame of the track. Then: websocket first delta; "
              "WebRTC: speech_stopped -> output_audio_buffer.started, and started -> audible less the onset "
              "(the media path: track tick, Opus, RTP, jitter buffer)")  # fmt: skip
        print(f"{'sessions':>8} {'turns':>6} {'ws p50':>7} {'p95':>6} {'webrtc p50':>11} {'p95':>6} "
              f"{'+p50':>6} {'+p95':>6} | {'ws delta':>8} {'onset':>6} {'started':>8} {'media':>7}")  # fmt: skip
        spawn = multiprocessing.get_context("spawn")  # the server's process has threads: no fork
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as clients:
            for n in sessions:
                await until_released(url)
                turns = await asyncio.get_running_loop().run_in_executor(
                    clients, run_users, url, base, pcm, n, args.rounds, round_s
                )
                figures.update(session_figures(n, turns))
        print_goal(figures)
    return figures


def session_figures(n: int, turns: dict[str, list[Turn]]) -> dict[str, Any]:
    """The figures of one session count, and its row of the table."""
    ws, rtc = turns["websocket"], turns["webrtc"]

    def p50(values: list[float]) -> float:
        return percentile(values, 0.5)

    f = {
        "ws": p50([x.ttfa_ms for x in ws]),
        "ws95": percentile([x.ttfa_ms for x in ws], 0.95),
        "rtc": p50([x.ttfa_ms for x in rtc]),
        "rtc95": percentile([x.ttfa_ms for x in rtc], 0.95),
        "first": p50([x.first_ms for x in ws]),
        "onset": p50([x.onset_ms for x in ws]),
        "started": p50([x.started_ms for x in rtc]),
        "track": p50([x.ttfa_ms - x.started_ms for x in rtc]),
    }
    f = {k: round(v, 1) for k, v in f.items()}
    added = round(f["rtc"] - f["ws"], 1)
    print(f"{n:>8} {len(ws):>6} {f['ws']:>7.0f} {f['ws95']:>6.0f} {f['rtc']:>11.0f} {f['rtc95']:>6.0f} "
          f"{added:>+6.0f} {f['rtc95'] - f['ws95']:>+6.0f} | {f['first']:>8.0f} {f['onset']:>6.0f} "
          f"{f['started']:>8.0f} {f['track'] - f['onset']:>7.0f}")  # fmt: skip
    return {
        f"ttfa_ms_{n}_websocket": f["ws"],
        f"ttfa_ms_{n}_webrtc": f["rtc"],
        f"ttfa_ms_{n}_websocket_p95": f["ws95"],
        f"ttfa_ms_{n}_webrtc_p95": f["rtc95"],
        "webrtc_added_ttfa_p50_ms" + ("" if n == 1 else f"_{n}"): added,
        f"first_delta_ms_{n}_websocket": f["first"],
        f"reply_onset_ms_{n}": f["onset"],
        f"webrtc_started_ms_{n}": f["started"],
        f"webrtc_media_ms_{n}": round(f["track"] - f["onset"], 1),
        f"turns_{n}": len(ws),
    }


def print_goal(figures: dict[str, Any]) -> None:
    added = figures.get("webrtc_added_ttfa_p50_ms")
    if added is not None:
        print(f"WebRTC adds {added:.0f} ms to TTFA at p50, 1 session"
              f"{goal_note('voice', 'webrtc_added_ttfa_p50_ms')}")  # fmt: skip
