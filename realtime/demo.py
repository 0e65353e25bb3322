"""The browser demo app: the static files of ``clients/web/`` (package data) under ``/demo/``.

Routes (HTTP GET only; the guard's API-key rule applies as to every route, so with
``server.api_keys`` set a page is opened as ``/demo/<page>?api_key=<key>`` and forwards the key to
what it loads and connects to):

- ``GET /`` -> 307 to ``/demo/`` (query kept) when the client accepts ``text/html`` (a browser);
  any other client (curl, a script) gets 200 with a plain-text page of what is here
  (:func:`index_text`: each enabled kind's websocket endpoints, the demo, the JSON and probe routes,
  the docs); a websocket on ``/`` is the OpenPI robot route, untouched by these HTTP routes;
- ``GET /demo`` -> 307 to ``/demo/``; ``GET /demo/`` -> ``index.html``;
- ``GET /demo/<page>`` -> ``<page>.html``; ``GET /demo/<name>.js`` / ``<name>.mjs`` / ``<name>.css``
  -> that file (``.mjs`` is a vendored ES module, ``agents-realtime.mjs``: OpenAI's Agents JS SDK,
  built once from npm by ``clients/web/vendor-agents-realtime.sh`` and committed).

Only files that ship in ``clients/web/`` with a suffix of :data:`CONTENT_TYPES` are served (read
once, at the first request); any other name is 404. Nothing is built or templated at serve time.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

PREFIX = "/demo/"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # module scripts need a JavaScript MIME type
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# pages and scripts change with the server; a stale cached script would talk an old protocol
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


@functools.cache
def demo_files() -> dict[str, bytes]:
    """File name -> bytes of every servable file in ``clients/web/``."""
    root = resources.files("clients").joinpath("web")
    return {
        entry.name: entry.read_bytes()
        for entry in root.iterdir()
        if entry.is_file() and any(entry.name.endswith(s) for s in CONTENT_TYPES)
    }


def _file_response(name: str) -> Response:
    body = demo_files().get(name)
    if body is None:
        return PlainTextResponse(f"no such demo file: {name}\n", status_code=404)
    suffix = name[name.rindex(".") :]
    return Response(body, media_type=CONTENT_TYPES[suffix], headers=_HEADERS)


def _with_query(path: str, request: Request) -> str:
    query = request.url.query
    return f"{path}?{query}" if query else path


HTTP_ROUTES = (
    ("/demo/", "the browser demo app (a browser opening / is sent there)"),
    ("/v1/models", "served models and session kinds, with any unavailable kind and why (JSON)"),
    ("/v1/status", "sessions, capacity, batch sizes and latencies (JSON)"),
    ("/healthz", "liveness: OK"),
    ("/readyz", "readiness: 200 once models are loaded and warm"),
    ("/metrics", "Prometheus metrics"),
)


def index_text(kinds: Any, unavailable: dict[str, str], ws_base: str) -> str:
    """The plain-text answer to a non-browser ``GET /``: the enabled ``kinds``' websocket
    endpoints under ``ws_base`` (``ws://host:port``), then the HTTP routes and the docs."""
    lines = ["realtime-sessions: a realtime websocket session server", "", "Session kinds (websockets):"]
    for kind in kinds:
        for model in kind.models():
            endpoints = ", ".join(ws_base + path for path in model.endpoints)
            note = f"  UNAVAILABLE: {unavailable[kind.name]}" if kind.name in unavailable else ""
            lines.append(f"  {kind.name:<7} {endpoints}  (model {model.id}){note}")
    if not kinds:
        lines.append("  none enabled (deploy config: <kind>.enabled)")
    lines += ["", "HTTP:"]
    lines += [f"  {path:<11} {what}" for path, what in HTTP_ROUTES]
    lines += [
        "",
        "Docs: README.md and docs/ of the realtime-sessions source (docs/protocols/ for each wire protocol).",
        "",
    ]
    return "\n".join(lines)


async def _root(request: Request) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(_with_query(PREFIX, request), status_code=307)
    state = request.app.state.rt  # realtime.app.AppState
    ws_base = f"{'wss' if request.url.scheme == 'https' else 'ws'}://{request.url.netloc}"
    return PlainTextResponse(index_text(state.kinds, state.unavailable, ws_base))


async def _demo_redirect(request: Request) -> Response:
    return RedirectResponse(_with_query(PREFIX, request), status_code=307)


async def _index(_: Request) -> Response:
    return _file_response("index.html")


async def _file(request: Request) -> Response:
    name: str = request.path_params["name"]
    return _file_response(name if "." in name else f"{name}.html")


def demo_routes() -> list[BaseRoute]:
    """The demo app's HTTP routes (module docstring); websockets on the same paths are unaffected."""
    return [
        Route("/", _root, methods=["GET"]),
        Route("/demo", _demo_redirect, methods=["GET"]),
        Route(PREFIX, _index, methods=["GET"]),
        Route(PREFIX + "{name:str}", _file, methods=["GET"]),
    ]
