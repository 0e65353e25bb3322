"""The server's table of ephemeral client secrets (minted by ``POST /v1/realtime/client_secrets``
and the beta ``POST /v1/realtime/sessions``; the wire side is
``realtime.protocols.oai_realtime.client_secrets``).

Contract:

- A secret is ``ek_`` + 32 random URL-safe bytes. Only its SHA-256 digest is kept, so neither the
  table nor a log line can give it back; it is never logged.
- It is bound to the session config it was minted with: :meth:`ClientSecrets.redeem` returns that
  config, and the connection starts from it.
- **Single use**: the first redemption removes it, so a second connection with the same secret
  is refused, as is an expired or unknown (forged) one; all three look the same to the client
  (``None`` here, the same 401 body on the wire).
- Bounded: at most ``max_secrets`` unexpired secrets at once (``server.max_client_secrets``);
  minting past it raises :class:`TooManySecretsError` (HTTP 429). Expired ones go first.
"""

from __future__ import annotations

import hashlib
import heapq
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PREFIX = "ek_"


class TooManySecretsError(Exception):
    """``max_secrets`` unexpired secrets are outstanding."""


@dataclass(frozen=True)
class Minted:
    value: str
    expires_at: int  # unix seconds


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class ClientSecrets:
    """Outstanding secrets by digest: (expiry, bound config). The event loop's alone."""

    def __init__(self, max_secrets: int, clock: Callable[[], float] = time.time) -> None:
        self.max_secrets = max_secrets
        self._clock = clock
        self._held: dict[bytes, tuple[float, Any]] = {}
        self._expiries: list[tuple[float, bytes]] = []  # heap; entries of redeemed secrets linger

    def __len__(self) -> int:
        self._expire()
        return len(self._held)

    def _expire(self) -> None:
        now = self._clock()
        while self._expiries and self._expiries[0][0] <= now:
            expires, digest = heapq.heappop(self._expiries)
            held = self._held.get(digest)
            if held is not None and held[0] == expires:
                del self._held[digest]

    def mint(self, bound: Any, expires_after_s: int) -> Minted:
        """A new secret for one connection started from ``bound``, good for ``expires_after_s``."""
        self._expire()
        if len(self._held) >= self.max_secrets:
            raise TooManySecretsError(f"{self.max_secrets} client secrets are outstanding")
        if len(self._expiries) > 2 * self.max_secrets:  # drop the entries of redeemed secrets
            self._expiries = [(expires, digest) for digest, (expires, _) in self._held.items()]
            heapq.heapify(self._expiries)
        value = PREFIX + secrets.token_urlsafe(32)
        expires = self._clock() + expires_after_s
        digest = _digest(value)
        self._held[digest] = (expires, bound)
        heapq.heappush(self._expiries, (expires, digest))
        return Minted(value, int(expires))

    def holds(self, presented: str) -> bool:
        """``presented`` is outstanding (not expired, not used); nothing changes."""
        self._expire()
        return _digest(presented) in self._held

    def redeem(self, presented: str) -> Any | None:
        """The config ``presented`` was minted with, once; ``None`` if expired, used or unknown."""
        self._expire()
        held = self._held.pop(_digest(presented), None)
        return None if held is None else held[1]
