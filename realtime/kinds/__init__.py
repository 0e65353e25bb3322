"""Registry of session kinds: name -> factory ``(DeployConfig, ServerContext) -> SessionKindService``.

Factories are imported lazily so that a deployment pays only for the kinds it enables.
"""

from __future__ import annotations

import importlib

from realtime.kinds.base import ServerContext, SessionKindService

KIND_FACTORIES: dict[str, str] = {
    "robot": "realtime.kinds.robot:build_robot_service",
    "world": "realtime.kinds.world:build_world_service",
    "echo": "realtime.kinds.echo:build_echo_service",
    "voice": "realtime.kinds.voice:build_voice_service",
    "duplex": "realtime.kinds.duplex:build_duplex_service",
}


def build_kind(name: str, ctx: ServerContext) -> SessionKindService:
    module_name, _, attr = KIND_FACTORIES[name].partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(ctx)
