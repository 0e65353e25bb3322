"""The realtime session server: ASGI app, routes, protocol codecs, CLI, config, metrics, benches."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("realtime-sessions")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
