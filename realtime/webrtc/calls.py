"""The server's WebRTC calls (aiortc): answer an offer, run each call on the skeleton, hang up.

:meth:`CallRegistry.answer` makes the peer connection for an SDP offer (the outgoing
:class:`~realtime.webrtc.media.PlayoutTrack` on the offer's audio transceiver, host candidates
gathered before the answer: no trickle ICE, as OpenAI answers) and returns the SDP answer; the
call then runs as one task: it waits up to ``webrtc.connect_timeout_s`` for the client's
``oai-events`` channel to open, then hands the call's websocket face (``realtime.webrtc.call``)
to ``serve`` (the kind's endpoint body) and the microphone to ``read_microphone``. Whatever ends
it (hang-up, the channel or the peer connection closing, the session ending, shutdown), the peer
connection is closed and the call forgotten. At most ``webrtc.max_calls`` exist at once.

``webrtc.host_addresses`` replaces aioice's host-address discovery (process-wide: aioice has no
per-connection option), so tests and single-host setups can offer 127.0.0.1, which aioice skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket

from realtime.config import WebRtcConfig
from realtime.protocols.oai_realtime import Dialect
from realtime.protocols.oai_realtime.wire import new_id

if TYPE_CHECKING:  # aiortc is an extra: these import it, so they load with the first call
    from realtime.webrtc.call import Call

log = logging.getLogger("realtime.webrtc")

Serve = Callable[["Call", WebSocket], Awaitable[None]]


class TooManyCallsError(Exception):
    pass


def webrtc_available() -> bool:
    try:
        import aiortc  # noqa: F401
    except ImportError:
        return False
    return True


class CallRegistry:
    def __init__(self, config: WebRtcConfig) -> None:
        self.config = config
        self._calls: dict[str, tuple[Call, Any]] = {}  # id -> (call, its peer connection)
        self._tasks: set[asyncio.Task] = set()
        _use_host_addresses(config.host_addresses)

    def __len__(self) -> int:
        return len(self._calls)

    async def answer(
        self, offer_sdp: str, dialect: Dialect, scope: dict[str, Any], serve: Serve
    ) -> tuple[str, str]:
        """The call's id and SDP answer; the call runs on as a task (``TooManyCallsError``)."""
        from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

        from realtime.webrtc.call import Call

        if len(self._calls) >= self.config.max_calls:
            raise TooManyCallsError(f"the server has {self.config.max_calls} calls already")
        c = self.config
        servers = [
            RTCIceServer(url, c.ice_username or None, c.ice_credential or None)
            if url.startswith("turn")
            else RTCIceServer(url)
            for url in c.ice_servers
        ]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=servers))
        call = Call(new_id("rtc"), dialect, scope, c.max_playout_s)
        self._calls[call.call_id] = (call, pc)
        try:
            pc.on("datachannel", call.attach_channel)
            pc.on("track", lambda track: track.kind == "audio" and self._spawn(self._microphone(call, track)))

            @pc.on("connectionstatechange")
            def _state() -> None:
                if pc.connectionState in ("failed", "closed"):
                    call.end()

            await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
            pc.addTrack(call.track)  # takes the offer's audio transceiver
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception:
            self._calls.pop(call.call_id, None)
            await pc.close()
            raise
        self._spawn(self._run(call, pc, serve))
        return call.call_id, pc.localDescription.sdp

    def hangup(self, call_id: str) -> bool:
        entry = self._calls.get(call_id)
        if entry is None:
            return False
        entry[0].end()
        return True

    async def close(self) -> None:
        """End every call and wait for their tasks (server shutdown)."""
        for call, _ in list(self._calls.values()):
            call.end()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _microphone(self, call: Call, track: Any) -> None:
        from realtime.webrtc.media import read_microphone

        await read_microphone(track, self.config.mic_chunk_ms, call.microphone)

    async def _run(self, call: Call, pc: Any, serve: Serve) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.channel_open.wait(), self.config.connect_timeout_s)
            if call.channel is not None and call.channel.readyState == "open" and not call.ended:
                log.info("call connected", extra={"call_id": call.call_id})
                await serve(call, call.websocket())
            else:
                log.info("call ended before its data channel opened", extra={"call_id": call.call_id})
        finally:
            call.end()
            self._calls.pop(call.call_id, None)
            with contextlib.suppress(Exception):
                await pc.close()


def _use_host_addresses(addresses: tuple[str, ...]) -> None:
    """aioice's host-address discovery, or ``addresses`` in its place (``()``: aioice's own)."""
    import aioice.ice

    discover = getattr(aioice.ice.get_host_addresses, "discover", aioice.ice.get_host_addresses)
    if not addresses:
        aioice.ice.get_host_addresses = discover
        return

    def configured(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return list(addresses)

    configured.discover = discover  # type: ignore[attr-defined]
    aioice.ice.get_host_addresses = configured
