"""Client secrets without I/O: the server's table (single use, bound, expiry, bound size) and the
mint requests' parser (checked like ``session.update``); the e2e tests are
``tests/voice/test_client_secrets.py``."""

from __future__ import annotations

import pytest

from realtime.client_secrets import ClientSecrets, TooManySecretsError
from realtime.protocols.oai_realtime import Dialect, Limits, SessionConfig
from realtime.protocols.oai_realtime.client_secrets import parse_mint
from realtime.protocols.oai_realtime.errors import ParamError


def test_a_secret_is_single_use_bound_and_expires():
    now = [1000.0]
    table = ClientSecrets(max_secrets=2, clock=lambda: now[0])
    first = table.mint("config A", expires_after_s=60)
    second = table.mint("config B", expires_after_s=10)
    assert first.value.startswith("ek_") and first.expires_at == 1060
    with pytest.raises(TooManySecretsError):
        table.mint("config C", expires_after_s=60)
    assert table.redeem(first.value) == "config A"
    assert table.redeem(first.value) is None  # used
    assert table.redeem("ek_" + "x" * 43) is None  # forged
    now[0] += 10
    assert table.redeem(second.value) is None  # expired
    assert len(table) == 0
    for _ in range(20):  # minted and used: the expiry heap stays bounded
        assert table.redeem(table.mint("c", 60).value) == "c"
    assert len(table._expiries) <= 2 * table.max_secrets + 1


def test_mint_requests_are_checked_like_session_update():
    defaults = SessionConfig(model="gpt-realtime")
    ga = parse_mint(
        {
            "expires_after": {"anchor": "created_at", "seconds": 7200},
            "session": {"type": "realtime", "instructions": "Hi"},
        },
        Dialect.GA,
        defaults,
        Limits(),
    )
    assert ga.expires_after_s == 7200 and ga.config.instructions == "Hi"
    assert parse_mint({}, Dialect.GA, defaults, Limits()).expires_after_s == 600
    for bad in (
        {"expires_after": {"seconds": 9}},
        {"expires_after": {"seconds": 7201}},
        {"expires_after": {"anchor": "now"}},
        {"session": {"type": "realtime", "voice_typo": 1}},
        {"extra": 1},
    ):
        with pytest.raises(ParamError):
            parse_mint(bad, Dialect.GA, defaults, Limits())
    beta = parse_mint(
        {"voice": "verse", "client_secret": {"expires_after": {"seconds": 30}}},
        Dialect.BETA,
        defaults,
        Limits(),
    )
    assert beta.config.voice == "verse" and beta.expires_after_s == 30


def test_the_guard_checks_a_secret_without_using_it_and_redeems_it_once_admitted():
    """A connection refused after the check (loading, draining: 1013) leaves the secret usable."""
    from realtime.auth import BOUND_SESSION, check_request, redeem_secret
    from realtime.config import ServerConfig

    table = ClientSecrets(max_secrets=4)
    secret = table.mint("bound config", expires_after_s=60).value
    server = ServerConfig(api_keys=("the-key",))

    def scope(path: str = "/v1/realtime", key: str = secret) -> dict:
        headers = [(b"authorization", f"Bearer {key}".encode())]
        return {"type": "websocket", "path": path, "headers": headers, "query_string": b""}

    checked = scope()
    assert check_request(checked, server, table) is None and table.holds(secret)  # not used yet
    assert check_request(scope(), server, table) is None  # a retry after a 1013 passes too
    assert redeem_secret(checked, table) is None and checked["state"][BOUND_SESSION] == "bound config"
    assert not table.holds(secret)
    refused = check_request(scope(), server, table)
    assert refused is not None and refused.status == 401 and "invalid_api_key" in (refused.json_body or "")
    other = table.mint("c", 60).value
    assert check_request(scope("/v1/realtime/world", other), server, table).status == 401  # voice only
    assert check_request(scope(key="the-key"), server, table) is None  # the API key still works
