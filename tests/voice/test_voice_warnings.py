"""The voice e2e path leaves no coroutine never awaited (issue 26 item 10: ``RuntimeWarning:
coroutine '_VoiceHandler._pump' was never awaited`` on stderr). Sockets that close as soon as
they open (before ``session.created``: a child spawned while opening was cancelled before its
first step) and one spoken turn answered end to end, with every RuntimeWarning recorded."""

from __future__ import annotations

import gc
import warnings

import pytest
import websockets

from realtime.protocols.oai_realtime import Dialect
from tests.voice.realtime_client import API_KEY, MODELS, append_audio, connect, voice_server

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]


async def test_the_voice_path_leaves_no_coroutine_never_awaited(spoken_question) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        async with voice_server() as (url, _service):
            headers = {"Authorization": f"Bearer {API_KEY}"}
            for _ in range(8):  # open, then close at once: no frame read
                async with websockets.connect(
                    f"{url}/realtime?model={MODELS[Dialect.GA]}", additional_headers=headers
                ):
                    pass
            async with connect(url, Dialect.GA) as (conn, events):
                await append_audio(conn, spoken_question.pcm16_24k)
                done = (await events.until("response.done", timeout=90))[-1]
            assert done["response"]["status"] == "completed"
        gc.collect()
    never_awaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []
