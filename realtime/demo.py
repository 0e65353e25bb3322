"""The browser demo app: the static files of ``clients/web/`` (package data) under ``/demo/``.

Routes (HTTP GET only; the guard's API-key rule applies as to every route, so with
``server.api_keys`` set a page is opened as ``/demo/<page>?api_key=<key>`` and forwards the key to
what it loads and connects to):

- ``GET /`` -> 307 to ``/demo/`` (query kept) when the client accepts ``text/html`` (a browser);
  any other client gets 404 with a hint (``/`` is also the OpenPI websocket path);
- ``GET /demo`` -> 307 to ``/demo/``; ``GET /demo/`` -> ``index.html``;
- ``GET /demo/<page>`` -> ``<page>.html``; ``GET /demo/<name>.js`` / ``<name>.css`` -> that file.

Only files that ship in ``clients/web/`` with a suffix of :data:`CONTENT_TYPES` are served (read
once, at the first request); any other name is 404. Nothing is built or templated at serve time.
"""

from __future__ import annotations

import functools
from importlib import resources

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

PREFIX = "/demo/"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # module scripts need a JavaScript MIME type
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


async def _root(request: Request) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(_with_query(PREFIX, request), status_code=307)
    return PlainTextResponse(
        "not found: GET / is the OpenPI websocket path; the demo is at /demo/, models at /v1/models\n",
        status_code=404,
    )


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
