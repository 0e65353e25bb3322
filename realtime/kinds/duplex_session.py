"""One duplex session's state, which outlives its sockets (``Session.kind_state``): the input
frames, the protocol state machines (``Turns``, ``Journal``), and what is queued for the socket it
is attached to, if any. Its epoch is the session's (``Session.epoch``); the manager holds it
(the one registry) and its grace while detached (``SessionManager.detach``).

Ownership (architecture invariant 2). The session's one owner is the runner of the connection it
is attached to (``Session.owner``): every method that changes the session (client commands,
``apply_outputs``, ``emit``, ``attach``, ``interrupt``) is called from that runner, one mailbox
item at a time, and none of them awaits. The frame clock never changes the session; it meets it through two hand-off
channels, each with one writer and one reader:

- input: the owner pushes the client's frames into :class:`InputFrames`; the clock's silence
  callback pops the next one (:meth:`DuplexSession.next_input`), or steps on silence; a session
  restored from a checkpoint hands its model context to the stage on its first input, once;
- output: the clock's ``on_output`` callback puts each step's output into the bounded
  :class:`StepInbox` (:meth:`DuplexSession.deliver`) and wakes the owner with one :class:`Flush`
  item (the attachment's ``flush_posted`` flag, the channel's own); the owner applies the outputs
  in step order, then writes what they queued.

While no socket is attached nobody owns the session: the outputs wait in the inbox (at most
``StepInbox.max_steps``: the grace period's worth) and the connection that resumes it takes
ownership, replays the journal, then applies them in order (their events were never sent). An
item a replaced connection's runner still holds finds the session no longer its own
(:meth:`DuplexSession.owned_by`) and is dropped.

The model's context (``models/duplex/context.py``): each applied output's share of it goes into
the session's bounded ``ContextLog`` (the stage made it), which checkpoints take a snapshot of;
the session never reads the model's device state.

Every server event is rendered once with the next ``server_event_seq`` and the current ``epoch``
and kept in the journal; while a socket is attached it is also queued for that socket. Audio and
transcript deltas are queued with their epoch, so the connection's writer drops them once a
barge-in bumped it; everything else is queued without one (never dropped). A client that does
not read delays only its own runner, never the clock.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

import numpy as np

from models.duplex.context import ContextLog
from models.duplex.stage import FRAME_SAMPLES, DuplexInput, DuplexOutput
from realtime.connection import Connection
from realtime.protocols.duplex import events as de
from realtime.protocols.duplex.audio import pcm16_bytes
from realtime.protocols.duplex.codec import DuplexCodec
from realtime.protocols.duplex.journal import Journal
from realtime.protocols.duplex.opus import OggOpusEncoder
from realtime.protocols.duplex.turns import ModelStep, Turns
from realtime.protocols.oai_realtime import server_events as ev
from realtime.scale.resume import DuplexState
from sessions.session import Session

_DELTAS = (ev.AudioDelta, ev.TranscriptDelta)


def new_token() -> str:
    return secrets.token_urlsafe(24)


class InputFrames:
    """The client's audio cut into model frames: bounded, oldest first. A partial frame waits
    for the rest of its samples; what does not fit ``max_frames`` is refused (counted)."""

    def __init__(self, max_frames: int) -> None:
        self.max_frames = max_frames
        self.client_frames = 0  # frames the clock took from the queue
        self.silent_frames = 0  # steps the clock found the queue empty
        self._frames: deque[np.ndarray] = deque()
        self._partial = np.zeros(0, np.float32)

    def __len__(self) -> int:
        return len(self._frames)

    def push(self, samples: np.ndarray) -> tuple[list[np.ndarray], int]:
        """Queue ``samples``; returns the complete frames queued and the samples refused."""
        data = np.concatenate([self._partial, samples]) if self._partial.size else samples
        whole = data.shape[0] // FRAME_SAMPLES
        room = self.max_frames - len(self._frames)
        taken = min(whole, room)
        frames = [data[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(taken)]
        self._frames.extend(frames)
        refused = (whole - taken) * FRAME_SAMPLES
        self._partial = data[whole * FRAME_SAMPLES :].copy() if taken == whole else np.zeros(0, np.float32)
        return frames, refused

    def pop(self) -> np.ndarray | None:
        """The clock's side: the oldest frame, or None (the step goes on silence); counted."""
        if not self._frames:
            self.silent_frames += 1
            return None
        self.client_frames += 1
        return self._frames.popleft()

    def clear(self) -> int:
        dropped = len(self._frames)
        self._frames.clear()
        self._partial = np.zeros(0, np.float32)
        return dropped


class StepInbox:
    """Model outputs handed from the frame clock to the session's owner, oldest first.

    At most ``max_steps`` wait: :meth:`put` answers False beyond it (the output is not kept) and
    the caller ends the session; the bound is set above the longest time nobody applies them
    without the session ending anyway (a detached grace, a send the watchdog ends)."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self._outputs: deque[DuplexOutput | StepFailed] = deque()

    def __len__(self) -> int:
        return len(self._outputs)

    def put(self, out: DuplexOutput | StepFailed) -> bool:
        if len(self._outputs) >= self.max_steps:
            return False
        self._outputs.append(out)
        return True

    def take(self) -> list[DuplexOutput | StepFailed]:
        outputs = list(self._outputs)
        self._outputs.clear()
        return outputs


@dataclass(frozen=True, slots=True)
class Pending:
    """One frame queued for a socket: a text frame, or binary audio still being encoded."""

    frame: str | None
    encoded: Future | None  # concurrent.futures.Future[bytes] on the media executor
    epoch: int | None  # None: never dropped by an epoch bump


@dataclass(eq=False)
class Attachment:
    """One socket of the session: what is queued for it, and whether a :class:`Flush` is posted.
    It counts only while its connection owns the session (:attr:`DuplexSession.attachment`)."""

    conn: Connection
    opus: bool
    pending: deque[Pending] = field(default_factory=deque)
    flush_posted: bool = False
    encoder: LazyEncoder | None = None  # the open response's Ogg stream (Opus output)


@dataclass(frozen=True)
class Flush:
    """Runner item: apply the clock's outputs, then write what the session queued for this socket."""


@dataclass(frozen=True)
class End:
    """Runner item: write what is queued, then end the connection (a step's fatal error)."""

    reason: str
    message: str


@dataclass(frozen=True)
class StepFailed:
    """A model step's typed error (a ``DuplexError``), carried to the owner as an output."""

    error: Exception


class DuplexSession:
    def __init__(
        self,
        session: Session,
        *,
        codec: DuplexCodec,
        turns: Turns,
        journal: Journal,
        max_input_frames: int,
        max_unapplied_steps: int,
        silence: Callable[[], DuplexInput],
        context: ContextLog | None,
        media: Executor,
        opus_bitrate: int,
        on_failed: Callable[[DuplexSession, Exception], None],
        on_frame: Callable[[bool], None],
    ) -> None:
        self.session = session
        self.session_id = session.session_id
        self.codec = codec
        self.turns = turns
        self.journal = journal
        self.frames = InputFrames(max_input_frames)
        self.inbox = StepInbox(max_unapplied_steps)
        self.resume_token = new_token()
        self.step = 0  # the model's last step index
        self.context = context  # the model's context as the applied outputs logged it (None: not kept)
        self._pending_context: object | None = None  # a checkpoint's, for the stage's next input
        self._attachment: Attachment | None = None
        self._silence = silence
        self._media = media
        self._opus_bitrate = opus_bitrate
        self._on_failed = on_failed
        self._on_frame = on_frame

    @property
    def attachment(self) -> Attachment | None:
        """The socket the session is attached to: its owner's (None while detached, or once a
        resume moved it to another connection that has not attached yet)."""
        att = self._attachment
        return att if att is not None and att.conn is self.session.owner else None

    @property
    def epoch(self) -> int:
        """The session's one epoch (``Session.epoch``): every frame is rendered with it."""
        return self.session.epoch

    @property
    def client_frames(self) -> int:
        return self.frames.client_frames

    @property
    def silent_frames(self) -> int:
        return self.frames.silent_frames

    # -- the frame clock's side (hand-off channels only: see the module docstring) ----------
    def next_input(self) -> DuplexInput:
        """The next frame the clock steps this session on: the client's, else silence (counted);
        the first after :meth:`restore` carries the checkpoint's model context."""
        pcm = self.frames.pop()
        self._on_frame(pcm is None)
        frame = self._silence() if pcm is None else DuplexInput(pcm)
        if self._pending_context is not None:
            frame = dataclasses.replace(frame, restore=self._pending_context)
            self._pending_context = None
        return frame

    def deliver(self, out: DuplexOutput | StepFailed) -> bool:
        """Hand one step's output to the owner (woken with a :class:`Flush` while attached);
        False when the inbox is full (the output is dropped: the caller ends the session)."""
        if not self.inbox.put(out):
            return False
        self._wake()
        return True

    # -- the owner's side -----------------------------------------------------------------
    def owned_by(self, conn: Connection) -> bool:
        """Whether ``conn``'s runner owns the session."""
        return self.session.owner is conn

    def apply_outputs(self) -> None:
        """Apply every output the clock handed over, in step order (the owner's call)."""
        for out in self.inbox.take():
            self._apply(out)

    def _apply(self, out: DuplexOutput | StepFailed) -> None:
        if isinstance(out, StepFailed):
            self._on_failed(self, out.error)
            return
        self.step = out.step
        if self.context is not None and out.context is not None:
            self.context.add(out.context)
        speaks = out.speaking and not self.turns.muted
        opus = self.attachment is not None and self.attachment.opus
        audio = b"" if not speaks or opus else pcm16_bytes(out.pcm)
        events = self.turns.step(ModelStep(out.step, out.speaking, out.text, audio))
        self.emit(events, pcm=out.pcm if speaks else None)

    # -- output ---------------------------------------------------------------------------
    def emit(self, events: Sequence[ev.ServerEvent], *, pcm: np.ndarray | None = None) -> None:
        """Journal every event under the next seq; queue it for the attached socket, if any."""
        att = self.attachment
        for event in events:
            delta = isinstance(event, _DELTAS)
            if isinstance(event, ev.AudioDelta) and att is not None and att.opus:
                self._queue_opus(att, pcm)
                continue
            if isinstance(event, ev.AudioDone) and att is not None and att.encoder is not None:
                self._end_opus(att)  # the stream's last page leaves before response.output_audio.done
            frame = self.codec.frame(event, epoch=self.epoch, seq=self.journal.next_seq())
            if frame is None:
                continue
            self.journal.record(frame, self.epoch, delta=delta)
            if att is not None:
                att.pending.append(Pending(frame, None, self.epoch if delta else None))
        self._post_flush()

    def send_only(self, event: ev.ServerEvent) -> None:
        """Queue ``event`` for the attached socket alone (not journaled; it carries the last seq)."""
        if self.attachment is not None:
            frame = self.codec.frame(event, epoch=self.epoch, seq=self.journal.last_seq)
            if frame is not None:
                self.attachment.pending.append(Pending(frame, None, None))
                self._post_flush()

    def _queue_opus(self, att: Attachment, pcm: np.ndarray | None) -> None:
        """The frame's audio as Ogg/Opus bytes, encoded on the media thread (in order: one worker)."""
        if pcm is None:
            return
        if att.encoder is None:
            att.encoder = LazyEncoder(self._opus_bitrate)
        att.pending.append(Pending(None, self._media.submit(att.encoder.encode, pcm), self.epoch))

    def _end_opus(self, att: Attachment) -> None:
        encoder, att.encoder = att.encoder, None
        assert encoder is not None
        att.pending.append(Pending(None, self._media.submit(encoder.close), self.epoch))

    def _post_flush(self) -> None:
        if self.attachment is not None and self.attachment.pending:
            self._wake()

    def _wake(self) -> None:
        """One :class:`Flush` item posted to the attached connection's runner until it runs."""
        att = self.attachment
        if att is not None and not att.flush_posted:
            att.flush_posted = True
            att.conn.post(Flush())

    def take_pending(self, conn: Connection) -> list[Pending]:
        """What is queued for ``conn`` (empty if it is no longer attached)."""
        att = self.attachment
        if att is None or att.conn is not conn:
            return []
        att.flush_posted = False
        items = list(att.pending)
        att.pending.clear()
        return items

    # -- interrupt and attachment ----------------------------------------------------------
    def interrupt(self) -> None:
        """A barge-in or cancel, in one call: the session's epoch moves on (``Session.interrupt``
        fences the frame clock's engine and the socket's writer), and deltas of the old epoch are
        never sent from here, nor replayed."""
        self.session.interrupt()
        epoch = self.session.epoch
        self.journal.drop_stale(epoch)
        att = self.attachment
        if att is not None:
            att.pending = deque(p for p in att.pending if p.epoch is None or p.epoch >= epoch)
            att.encoder = None  # the interrupted response's Ogg stream ends unfinished

    def resume(self, conn: Connection, cursor: int, *, opus: bool) -> None:
        """``conn`` took the session over (it adopted it): the journal after ``cursor`` again,
        once; a resync if some of it is gone; the steps taken while no socket was attached (never
        sent: applied now, live, in this socket's audio format); then ``session.resumed`` with a
        new token."""
        entries, gap = self.journal.after(cursor)
        att = self.attach(conn, opus=opus)
        att.pending.extend(Pending(e.frame, None, None) for e in entries)
        self.resume_token = new_token()
        if gap:
            self.emit([de.ResyncRequired(self.session_id, "journal_gap", self.journal.first_available())])
        before = self.journal.last_seq
        self.apply_outputs()
        replayed = len(entries) + self.journal.last_seq - before
        self.emit([de.SessionResumed(self.session_id, self.resume_token, replayed)])

    def state(self, max_journal_bytes: int, max_context_bytes: int) -> DuplexState:
        """What a checkpoint keeps of this session (``realtime.scale.resume``): the newest
        ``max_journal_bytes`` of its journal (a resume from before them is a gap: resync) and
        about ``max_context_bytes`` of its model's context (the newest part)."""
        last_seq, trimmed_to, entries = self.journal.snapshot(max_journal_bytes)
        context = self.context.snapshot(max_context_bytes) if self.context is not None else None
        return DuplexState(
            self.resume_token, self.epoch, self.turns.conversation_id, last_seq, trimmed_to, entries, context
        )

    def restore(self, state: DuplexState, cursor: int) -> None:
        """Continue the session ``state`` was taken of (its id and epoch are the ``Session``'s):
        its journal, resume token, conversation id and model context (logged here at once; the
        stage rebuilds it with the session's first input, before its engine slot steps). Events
        the client got after the checkpoint (its ``cursor`` is past it) are not in it: seqs go on
        after the cursor, so none is reused."""
        self.journal.restore(max(state.last_seq, cursor), state.trimmed_to, state.entries)
        self.resume_token = state.resume_token
        self.turns.conversation_id = state.conversation_id
        if state.model_context is not None and self.context is not None:
            self.context.restore(state.model_context)
            self._pending_context = state.model_context

    def replaced_frame(self) -> str | None:
        """``session.replaced`` for the socket a resume took the session from (not journaled)."""
        return self.codec.frame(
            de.SessionReplaced(self.session_id), epoch=self.epoch, seq=self.journal.last_seq
        )

    def attach(self, conn: Connection, *, opus: bool) -> Attachment:
        """Queue for ``conn`` from now on (it adopted the session: ``Connection.adopt``)."""
        self._attachment = Attachment(conn, opus)
        return self._attachment


class LazyEncoder:
    """An Ogg/Opus stream created on the media thread at its first frame (setup costs ms). Its
    encodes are submitted to a one-worker executor at once, so they run in order."""

    def __init__(self, bitrate: int) -> None:
        self.bitrate = bitrate
        self._encoder: OggOpusEncoder | None = None

    def encode(self, pcm: np.ndarray) -> bytes:
        if self._encoder is None:
            self._encoder = OggOpusEncoder(self.bitrate)
        return self._encoder.encode(pcm)

    def close(self) -> bytes:
        return self._encoder.close() if self._encoder is not None else b""
