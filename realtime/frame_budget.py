"""A connection's budget of invalid frames (sans-I/O: counts, no sockets).

One per connection (``Connection.frames``, the skeleton's). A frame is *invalid* when the kind's
codec refuses it (it answers the frame's typed error: malformed JSON, an unknown event type, a bad
field, an event the kind does not take) or the transport refuses it (1007, 1009); a frame the
codec accepts is valid even when the session then answers it with an error (a cancel with nothing
to cancel). A kind with a ``max_invalid_frames`` setting (duplex) notes each frame as its reader
decodes it, in order, so the counts are exact when the socket drops.

Two things follow (``docs/limits.md``): the ``limit``-th invalid frame in a row ends the
connection (the kind sends that frame's typed error and one ``too_many_invalid_frames`` error,
then closes 1008), and a socket that sent frames but never a valid one has shown it is no client
of the protocol, so its drop does not keep its session for a resume. A client that sent nothing
at all (one that only listens) keeps that benefit of the doubt.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class InvalidFrameBudget:
    """Invalid frames in a row allowed to one connection (``limit``; 0: no limit), and counts."""

    limit: int
    in_a_row: int = 0
    valid: int = 0
    invalid: int = 0

    def note(self, invalid: bool) -> bool:
        """Count one frame; True when it is the ``limit``-th invalid frame in a row (the
        connection is to end once that frame's error is sent)."""
        if not invalid:
            self.valid += 1
            self.in_a_row = 0
            return False
        self.invalid += 1
        self.in_a_row += 1
        return self.limit > 0 and self.in_a_row >= self.limit

    @property
    def refused_only(self) -> bool:
        """Frames were sent and every one was invalid: not a client of the protocol."""
        return self.invalid > 0 and self.valid == 0
