"""Handshake negotiation: dialect, subprotocol answer, API key sources, model, and no key leaks."""

from __future__ import annotations

import pytest

from realtime.protocols.oai_realtime.dialect import (
    DEFAULT_BETA_MODEL,
    SERVED_MODEL_HEADER,
    Dialect,
    negotiate,
)


def test_the_sdk_ga_handshake():
    hs = negotiate("model=gpt-realtime", {"Authorization": "Bearer sk-test"}, [])
    assert (hs.dialect, hs.subprotocol, hs.model, hs.api_key, hs.key_source) == (
        Dialect.GA,
        None,
        "gpt-realtime",
        "sk-test",
        "authorization",
    )


def test_the_sdk_beta_handshake_by_header():
    hs = negotiate(
        b"model=gpt-4o-realtime-preview", {"openai-beta": "realtime=v1", "authorization": "Bearer k"}, []
    )
    assert hs.dialect is Dialect.BETA and hs.model == "gpt-4o-realtime-preview"
    assert negotiate("", {"OpenAI-Beta": "assistants=v2, Realtime=V1"}, []).dialect is Dialect.BETA
    assert negotiate("", {"OpenAI-Beta": "assistants=v2"}, []).dialect is Dialect.GA


def test_browser_subprotocols():
    offered = ["realtime", "openai-insecure-api-key.ek_123", "openai-beta.realtime-v1"]
    hs = negotiate("", {}, offered)
    assert (hs.dialect, hs.subprotocol, hs.api_key, hs.key_source) == (
        Dialect.BETA,
        "realtime",
        "ek_123",
        "subprotocol",
    )
    ga = negotiate("", {}, ["realtime", "openai-insecure-api-key.ek_9", "openai-agents-sdk.0.20"])
    assert (ga.dialect, ga.subprotocol, ga.api_key) == (Dialect.GA, "realtime", "ek_9")


def test_subprotocol_answered_only_when_realtime_is_offered():
    assert negotiate("", {}, ["openai-insecure-api-key.k"]).subprotocol is None
    assert negotiate("", {}, []).subprotocol is None


@pytest.mark.parametrize(
    ("query", "headers", "protocols", "key", "source"),
    [
        ("api_key=q", {"authorization": "Bearer h"}, ["openai-insecure-api-key.s"], "h", "authorization"),
        ("api_key=q", {}, ["realtime", "openai-insecure-api-key.s"], "s", "subprotocol"),
        ("api_key=q&model=m", {}, [], "q", "query"),
        ("", {"Authorization": "Api-Key h2"}, [], "h2", "authorization"),
        ("", {"Authorization": "Basic abc"}, [], None, None),
        ("api_key=", {"Authorization": "Bearer "}, ["openai-insecure-api-key."], None, None),
    ],
)
def test_key_sources_in_order(query, headers, protocols, key, source):
    hs = negotiate(query, headers, protocols)
    assert (hs.api_key, hs.key_source) == (key, source)


def test_the_key_never_appears_in_repr():
    hs = negotiate("api_key=sk-secret-123", {}, [])
    assert "sk-secret-123" not in repr(hs) and "sk-secret-123" not in str(hs)


def test_display_model_and_served_model_header():
    beta = negotiate("model=gpt-4o-mini-realtime-preview", {"openai-beta": "realtime=v1"}, [])
    assert beta.display_model("smollm2") == "gpt-4o-mini-realtime-preview"
    assert (
        negotiate("model=smollm2", {"openai-beta": "realtime=v1"}, []).display_model("smollm2")
        == DEFAULT_BETA_MODEL
    )
    assert negotiate("model=gpt-realtime", {}, []).display_model("smollm2") == "smollm2"
    assert beta.accept_headers("smollm2") == [(SERVED_MODEL_HEADER.encode(), b"smollm2")]
    assert negotiate("model=" + "m" * 300, {}, []).model is None
