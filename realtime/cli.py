"""Command line: ``realtime serve`` (``--replicas N``: on Ray Serve, ``realtime.scale``), ``realtime bench
<scenario>``, ``realtime --version``.

Errors a user can fix (bad config, busy port) print one line on stderr and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from realtime import __version__
from realtime.config import ConfigError, DeployConfig, load_config
from realtime.logs import configure_logging

log = logging.getLogger("realtime.cli")


def _parser() -> argparse.ArgumentParser:
    # the benches are a leaf over the server: only this command reaches them (the package names
    # the scenarios; each scenario module loads when it runs)
    from realtime.bench import SCENARIOS

    parser = argparse.ArgumentParser(prog="realtime", description="Realtime websocket session server.")
    parser.add_argument("--version", action="version", version=f"realtime-sessions {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve the session kinds of a deploy config")
    serve.add_argument("--config", help="deploy config YAML (default: the embedded deploy/default.yaml)")
    serve.add_argument("--host", help="bind address (overrides server.host)")
    serve.add_argument("--port", type=int, help="port; 0 picks a free one (overrides server.port)")
    serve.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="overrides server.log_level"
    )
    serve.add_argument("--log-format", choices=["text", "json"], help="overrides server.log_format")
    serve.add_argument(
        "--replicas",
        type=_positive_int,
        metavar="N",
        help="serve N replicas on Ray Serve behind its HTTP proxy (needs the ray extra; docs/scaling.md)",
    )
    serve.add_argument(
        "--ray-address", metavar="ADDR", help="with --replicas: join the Ray cluster at ADDR, not a local one"
    )

    drain = sub.add_parser(
        "drain",
        help="move a replica's sessions to the others of `realtime serve --replicas` (docs/scaling.md)",
    )
    drain.add_argument("replica", help="the replica's tag (as /v1/status lists it)")
    drain.add_argument("--config", help="the deploy config the replicas run (its replicas.app_name)")
    drain.add_argument(
        "--ray-address", metavar="ADDR", help="the cluster (default: the local Ray instance, 'auto')"
    )

    bench = sub.add_parser("bench", help="run a benchmark scenario against its peer")
    bench.add_argument("scenario", choices=sorted(SCENARIOS))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="scenario options (see --help of each)")
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _load(args: argparse.Namespace) -> DeployConfig | None:
    """The deploy config ``--config`` names, or ``None`` after one line saying what is wrong."""
    try:
        return load_config(args.config)
    except ConfigError as exc:
        print(f"realtime: {exc}", file=sys.stderr)
        return None


def _scale_launch(what: str) -> Any:
    """``realtime.scale.launch``, or ``None`` after one line naming the ray extra (optional)."""
    try:
        from realtime.scale import launch
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        print(
            f"realtime: {what} runs on Ray Serve, the ray extra: "
            "pip install 'realtime-sessions[ray]' (in a checkout: pip install -e '.[ray]')",
            file=sys.stderr,
        )
        return None
    return launch


def _serve_replicas(args: argparse.Namespace, config: DeployConfig) -> int:
    launch = _scale_launch("--replicas")
    if launch is None:
        return 2
    name = args.config or "deploy/default.yaml"
    return launch.serve_replicas(
        config, name, args.replicas, args.ray_address, host=args.host, port=args.port
    )


def _drain(args: argparse.Namespace) -> int:
    config = _load(args)
    launch = _scale_launch("drain") if config is not None else None
    if launch is None:
        return 2
    return launch.drain_replica(config, args.replica, args.ray_address)


def _serve(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 2
    if args.ray_address and args.replicas is None:
        print("realtime: --ray-address needs --replicas N", file=sys.stderr)
        return 2
    configure_logging(args.log_level or config.server.log_level, args.log_format or config.server.log_format)
    if args.replicas is not None:
        return _serve_replicas(args, config)
    # pools and per-tick scratch of several sizes: segments that grow in place keep the caching
    # allocator from stranding free memory between them (read once, at the first CUDA allocation)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    from realtime.server import build_server  # imported late: pulls in torch via the session kinds

    server = build_server(config, host=args.host, port=args.port)
    try:
        server.run()
    except OSError as exc:
        print(f"realtime: cannot serve: {exc}", file=sys.stderr)
        return 2
    if server.fatal_error:
        print(f"realtime: model loading failed: {server.fatal_error}", file=sys.stderr)
        return 1
    if not server.started:
        print("realtime: server did not start (see the log above)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "drain":
        configure_logging("warning")
        return _drain(args)
    configure_logging("warning")
    from realtime.bench import run_scenario

    return run_scenario(args.scenario, args.args)


if __name__ == "__main__":
    sys.exit(main())
