"""Ephemeral client secrets (issue 31): minted by the real ``openai`` SDK (GA
``client.realtime.client_secrets.create``, beta ``client.beta.realtime.sessions.create``), used by
its realtime connection in place of the API key, bound to their session config, single-use,
expiring, and never in the log; expired, reused and forged secrets get OpenAI's 401 body."""

from __future__ import annotations

import json
import logging

import pytest
import websockets
from openai import AsyncOpenAI

from realtime.logs import redact
from realtime.protocols.oai_realtime import Dialect
from tests.voice.realtime_client import API_KEY, MODELS, Events, voice_server

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
async def server():
    async with voice_server() as running:
        yield running


def _client(url: str, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=url.replace("ws://", "http://"), websocket_base_url=url)


async def _refusal(url: str, key: str) -> tuple[int, dict]:
    """The HTTP answer to a realtime handshake with ``key`` as its Bearer credential."""
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(
            f"{url}/realtime?model=gpt-realtime", additional_headers={"Authorization": f"Bearer {key}"}
        ):
            pass
    response = refused.value.response
    return response.status_code, json.loads(response.body)


async def test_ga_secret_opens_one_session_with_its_config_then_is_refused(server, caplog):
    url, _ = server
    caplog.set_level(logging.DEBUG)
    minted = await _client(url, API_KEY).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 120},
        session={"type": "realtime", "model": "gpt-realtime", "instructions": "Answer in French."},
    )
    assert minted.value.startswith("ek_") and minted.session.instructions == "Answer in French."
    async with _client(url, minted.value).realtime.connect(model=MODELS[Dialect.GA]) as conn:
        created = await Events(conn, Dialect.GA).next()
        assert created["type"] == "session.created"
        assert created["session"]["instructions"] == "Answer in French."
    status, body = await _refusal(url, minted.value)  # single use
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    server_lines = [  # as the server's formatters write them (realtime.logs.redact)
        redact(r.getMessage())
        for r in caplog.records
        if not r.name.startswith(("websockets.client", "httpx", "httpcore", "openai"))
    ]
    assert server_lines and not [line for line in server_lines if minted.value in line]


async def test_beta_secret_opens_a_beta_session(server):
    url, _ = server
    minted = await _client(url, API_KEY).beta.realtime.sessions.create(
        model="gpt-4o-realtime-preview", voice="verse"
    )
    secret = minted.client_secret.value
    async with _client(url, secret).beta.realtime.connect(model=MODELS[Dialect.BETA]) as conn:
        created = await Events(conn, Dialect.BETA).next()
        assert created["session"]["voice"] == "verse"


async def test_forged_and_misplaced_secrets_get_openais_401(server):
    url, _ = server
    forged = await _refusal(url, "ek_" + "A" * 43)
    assert forged == (
        401,
        {
            "error": {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
    )
    minted = await _client(url, API_KEY).realtime.client_secrets.create()
    with pytest.raises(Exception) as refused:  # a secret is not an API key: it cannot mint another
        await _client(url, minted.value).realtime.client_secrets.create()
    assert getattr(refused.value, "status_code", None) == 401


async def test_minting_needs_the_api_key_and_a_valid_request(server):
    url, _ = server
    with pytest.raises(Exception) as unauthorized:
        await _client(url, "wrong-key").realtime.client_secrets.create()
    assert getattr(unauthorized.value, "status_code", None) == 401
    with pytest.raises(Exception) as invalid:
        await _client(url, API_KEY).realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 5}
        )
    assert getattr(invalid.value, "status_code", None) == 400
    assert invalid.value.body["code"] == "integer_below_min_value"
