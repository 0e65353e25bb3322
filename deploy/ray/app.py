"""``serve run deploy/ray/serve.yaml`` (or ``serve run deploy.ray.app:app config=... replicas=N``):
the same application ``realtime serve --replicas N`` runs (``realtime.scale.launch.application``),
for operators who manage Serve themselves.

Builder arguments (strings, from the YAML's ``args`` or ``key=value`` on the command line):
``config``, a deploy config file (default: the embedded ``deploy/default.yaml``), and
``replicas``, the replica count (default 1; a ``deployments`` override in the YAML wins).

Each node's Serve proxy must load ``realtime.scale.proxy`` (close 1012 when a replica dies):
start the nodes with ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=realtime.scale.proxy:middlewares``
in their environment (``ray start``), and with this package importable there.
"""

from __future__ import annotations

from ray.serve import Application

from realtime.config import load_config
from realtime.scale.launch import application, check_config


def app(args: dict[str, str]) -> Application:
    config = load_config(args.get("config"))
    replicas = int(args.get("replicas", "1"))
    check_config(config, args.get("config") or "deploy/default.yaml", replicas)
    return application(config, replicas)
