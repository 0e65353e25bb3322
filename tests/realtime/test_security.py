"""docs/security.md, row by row, against one real server over loopback (and one over TLS).

Every route with ``server.api_keys`` set: which credential forms it takes, and what it answers
without one. The websocket rows open real handshakes; a 101 means the guard let the request
through (what the kind then does is its own tests' subject).
"""

from __future__ import annotations

import asyncio
import datetime
import ssl

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from realtime.config import config_from_mapping
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]

KEY = "sekrit-route-key-7c2"
CONFIG = {
    "server": {"api_keys": [KEY]},
    "runtime": {"memory_available_bytes": 1 << 30},
    "robot": {"enabled": True, "policy": "zeros", "device": "cpu"},
    "world": {"enabled": True, "model": "world-test", "torch_threads": 1},
    "echo": {"enabled": True},
    "duplex": {"enabled": True, "model": "duplex-test", "compute_admission": False},
}
HTTP_ROUTES = ["/metrics", "/v1/models", "/v1/status", "/demo/status"]
WS_ROUTES = [
    "/",
    "/v1/realtime/robot/openpi",
    "/v1/realtime/world?protocol_version=1",
    "/v1/realtime/echo",
    "/v1/realtime?mode=duplex",
    "/v1/duplex",
    "/v1/realtime",  # the voice kind's path (served here by the catch-all: the guard is the subject)
]
CREDENTIALS = {
    "bearer": ({"Authorization": f"Bearer {KEY}"}, "", None),
    "api-key": ({"Authorization": f"Api-Key {KEY}"}, "", None),
    "query": ({}, f"api_key={KEY}", None),
    "subprotocol": ({}, "", [f"openai-insecure-api-key.{KEY}", "realtime"]),
}


@pytest.fixture(scope="module")
async def served():
    async with serve_in_process(config_from_mapping(CONFIG)) as (base, _):
        yield base


def _with_query(path: str, query: str) -> str:
    if not query:
        return path
    return path + ("&" if "?" in path else "?") + query


async def _handshake(url: str, headers: dict, subprotocols: list[str] | None) -> int:
    try:
        async with websockets.connect(
            url, additional_headers=headers, subprotocols=subprotocols, open_timeout=30
        ):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code
    except websockets.exceptions.NegotiationError:
        return 101  # the handshake passed the guard; the kind chose no subprotocol


@pytest.mark.parametrize("path", WS_ROUTES)
async def test_websocket_routes_take_every_credential_form_and_refuse_none_with_401(served, path):
    url = served.replace("http://", "ws://")
    assert await _handshake(url + path, {}, None) == 401
    assert await _handshake(url + path, {"Authorization": "Bearer wrong"}, None) == 401
    for name, (headers, query, subprotocols) in CREDENTIALS.items():
        assert await _handshake(url + _with_query(path, query), headers, subprotocols) == 101, name


@pytest.mark.parametrize("path", HTTP_ROUTES)
async def test_http_routes_take_header_and_query_keys_and_refuse_none_with_401(served, path):
    async with httpx.AsyncClient(base_url=served) as client:
        assert (await client.get(path)).status_code == 401
        for name, (headers, query, _) in CREDENTIALS.items():
            if name == "subprotocol":
                continue  # websockets only
            reply = await client.get(_with_query(path, query), headers=headers)
            assert reply.status_code == 200, name


async def test_probes_need_no_key_and_refuse_upgrades(served):
    async with httpx.AsyncClient(base_url=served) as client:
        for path in ("/healthz", "/readyz"):
            assert (await client.get(path)).status_code == 200
            assert await _handshake(served.replace("http://", "ws://") + path, {}, None) == 404


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for ``localhost`` and its key, as PEM files in ``tmp_path``: (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


async def test_tls_through_uvicorns_ssl_options_and_https_origins(tmp_path):
    cert, key = self_signed(tmp_path)
    config = config_from_mapping(
        {
            "server": {"ssl_certfile": cert, "ssl_keyfile": key},
            "robot": {"enabled": False},
            "world": {"enabled": False},
            "echo": {"enabled": True},
        }
    )
    trust = ssl.create_default_context(cafile=cert)
    async with serve_in_process(config, ready=False) as (base, server):
        assert base.startswith("https://")
        port = int(base.rsplit(":", 1)[1])
        local = f"https://localhost:{port}"
        async with httpx.AsyncClient(verify=trust) as client:
            while (await client.get(local + "/readyz")).status_code != 200:
                await asyncio.sleep(0.05)
        with pytest.raises(httpx.TransportError):  # no plain HTTP on a TLS port
            async with httpx.AsyncClient() as client:
                await client.get(f"http://localhost:{port}/healthz")
        url = f"wss://localhost:{port}/v1/realtime/echo"
        async with websockets.connect(url, ssl=trust, origin=local, open_timeout=30) as ws:  # the TLS origin
            await ws.send('{"type": "echo", "text": "over tls"}')
            assert "session.created" in await asyncio.wait_for(ws.recv(), 30)
        with pytest.raises(InvalidStatus) as refused:  # the plain-HTTP origin is another origin
            async with websockets.connect(url, ssl=trust, origin=f"http://localhost:{port}", open_timeout=30):
                pass
        assert refused.value.response.status_code == 403
