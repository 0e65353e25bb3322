"""Strict validation of server frames against the official ``openai`` SDK's pydantic models.

The SDK's unions accept unknown keys (its ``BaseModel`` has ``extra="allow"``), so validating
against the union alone proves little. :func:`validate_server_frame` picks the union member by
``type`` in the connection's dialect (``openai.types.realtime`` for GA,
``openai.types.beta.realtime`` for beta), validates in pydantic's strict mode (no ``"5"`` -> 5
coercion), and then walks the validated model recursively: any ``model_extra`` key is a failure.

One documented allowance: the ``session`` object of ``session.created`` / ``session.updated``
carries ``id``, ``object`` and ``expires_at`` (as OpenAI's service sends). The GA event model
types ``session`` as the *request* shape, which lacks them, so in GA the session must also
validate strictly against ``RealtimeSessionCreateResponse``, which declares all three; the beta
``Session`` model declares ``id`` and lacks only ``object`` and ``expires_at``.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import pydantic
from openai.types.beta.realtime import realtime_server_event as beta_union
from openai.types.realtime import realtime_server_event as ga_union
from openai.types.realtime.realtime_session_create_response import RealtimeSessionCreateResponse

from realtime.protocols.oai_realtime.dialect import Dialect

SESSION_ENVELOPE_EXTRAS = {
    Dialect.GA: {"id", "object", "expires_at"},
    Dialect.BETA: {"object", "expires_at"},
}


def _members(union_alias: Any) -> dict[str, type[pydantic.BaseModel]]:
    union = typing.get_args(union_alias)[0]  # Annotated[Union[...], PropertyInfo]
    out = {}
    for model in typing.get_args(union):
        (name,) = typing.get_args(model.model_fields["type"].annotation)
        out[name] = model
    return out


MODELS = {
    Dialect.GA: _members(ga_union.RealtimeServerEvent),
    Dialect.BETA: _members(beta_union.RealtimeServerEvent),
}


def extras(model: pydantic.BaseModel, path: str = "") -> list[str]:
    """Every undeclared key anywhere in ``model``, as dotted paths."""
    found = [f"{path}.{k}".lstrip(".") for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        found += _extras_in(getattr(model, name), f"{path}.{name}")
    return found


def _extras_in(value: Any, path: str) -> list[str]:
    if isinstance(value, pydantic.BaseModel):
        return extras(value, path)
    if isinstance(value, list | tuple):
        return [e for i, v in enumerate(value) for e in _extras_in(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in _extras_in(v, f"{path}.{k}")]
    return []


def validate_server_frame(frame: str, dialect: Dialect) -> pydantic.BaseModel:
    """The validated SDK model of ``frame``; raises AssertionError or ValidationError when invalid."""
    assert len(frame.encode()) < 1024 * 1024, "every server frame must stay under 1 MiB"
    data = json.loads(frame)
    kind = data["type"]
    assert kind in MODELS[dialect], f"{kind!r} is not a {dialect} server event"
    assert data["event_id"].startswith("event_")
    model = MODELS[dialect][kind].model_validate(data, strict=True)
    unknown = extras(model)
    if kind in ("session.created", "session.updated"):
        allowed = {f"session.{k}" for k in SESSION_ENVELOPE_EXTRAS[dialect]}
        unknown = [k for k in unknown if k not in allowed]
        if dialect is Dialect.GA:
            session = RealtimeSessionCreateResponse.model_validate(data["session"], strict=True)
            unknown += [f"session(response model).{k}" for k in extras(session)]
    assert not unknown, f"{kind}: keys the SDK model does not declare: {unknown}"
    return model
