"""WebRTC call requests and track frames, sans-I/O (``oai_realtime.calls``, ``oai_realtime.track``)."""

from __future__ import annotations

import json

import pytest

from realtime.protocols.oai_realtime import CodecOptions, Dialect, Limits, RealtimeCodec, SessionConfig
from realtime.protocols.oai_realtime import server_events as ev
from realtime.protocols.oai_realtime.calls import CallOffer, parse_call
from realtime.protocols.oai_realtime.errors import ParamError
from realtime.protocols.oai_realtime.session_config import AudioFormat
from realtime.protocols.oai_realtime.track import TrackAudio, frame_type, pack, unpack

OFFER = (
    "v=0\no=- 1 1 IN IP4 0.0.0.0\ns=-\nt=0 0\nm=audio 9 UDP/TLS/RTP/SAVPF 111\na=rtpmap:111 opus/48000/2\n"
)
DEFAULTS = SessionConfig(model="m", instructions="Be brief.")


def _multipart(fields: dict[str, str], boundary: str = "XyZ") -> tuple[str, bytes]:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    return f"multipart/form-data; boundary={boundary}", ("".join(parts) + f"--{boundary}--\r\n").encode()


def _rejected(content_type: str, body: bytes, dialect: Dialect = Dialect.GA) -> tuple[str, str | None]:
    with pytest.raises(ParamError) as refused:
        parse_call(content_type, body, dialect, DEFAULTS, Limits())
    return refused.value.rejected.code, refused.value.rejected.param


def test_an_sdp_body_is_the_offer_with_crlf_lines():
    offer = parse_call("application/sdp", OFFER.encode(), Dialect.GA, DEFAULTS, Limits())
    assert offer == CallOffer(OFFER.replace("\n", "\r\n"), None)
    assert parse_call("Application/SDP; charset=utf-8", OFFER.encode(), Dialect.BETA, DEFAULTS, Limits()).sdp


def test_a_multipart_call_carries_its_session():
    session = {"type": "realtime", "instructions": "Answer in French."}
    content_type, body = _multipart({"sdp": OFFER, "session": json.dumps(session)})
    offer = parse_call(content_type, body, Dialect.GA, DEFAULTS, Limits())
    assert offer.sdp.startswith("v=0\r\n") and offer.config is not None
    assert offer.config.instructions == "Answer in French."


def test_bad_calls_are_refused_with_openai_errors():
    assert _rejected("application/sdp", b"hello") == ("invalid_value", "sdp")
    assert _rejected("application/sdp", b"v=0\r\nm=video 9 RTP/AVP 96\r\n") == ("invalid_value", "sdp")
    assert _rejected("application/sdp", b"v=0\xff\xfe") == ("invalid_value", "sdp")
    assert _rejected("text/plain", OFFER.encode())[0] == "invalid_value"
    assert _rejected(*_multipart({"session": "{}"})) == ("missing_required_parameter", "sdp")
    assert _rejected(*_multipart({"sdp": OFFER, "session": "{nope"})) == ("invalid_value", "session")
    assert _rejected(*_multipart({"sdp": OFFER, "session": '{"type": "realtime", "bogus": 1}'}))[0] == (
        "unknown_parameter"
    )
    content_type, body = _multipart({"sdp": OFFER})
    assert _rejected(content_type, body, Dialect.BETA)[0] == "invalid_value"  # beta: SDP only
    assert _rejected("multipart/form-data; boundary=nope", b"garbage")[0] == "invalid_value"


def test_track_frames_round_trip_and_frame_types_are_read_without_parsing():
    audio = TrackAudio("resp_1", "item_1", AudioFormat.G711_ULAW, b"\x01\x02")
    assert unpack(pack(audio)) == audio
    assert frame_type('{"type":"response.done","event_id":"e"}') == "response.done"
    assert frame_type('{"event_id":"e","type":"response.done"}') is None


def test_a_codec_for_a_call_renders_audio_as_track_frames_and_everything_else_as_events():
    ref = ev.PartRef("resp_1", "item_1")
    delta = ev.AudioDelta(ref, b"\x00\x01" * 4, AudioFormat.PCM16)
    call = RealtimeCodec(Dialect.GA, DEFAULTS, CodecOptions(media_track=True))
    frame = call.render(delta)
    assert isinstance(frame, bytes) and unpack(frame) == TrackAudio(
        "resp_1", "item_1", AudioFormat.PCM16, delta.audio
    )
    assert frame_type(call.render(ev.AudioDone(ref))) == "response.output_audio.done"
    socket = RealtimeCodec(Dialect.GA, DEFAULTS)
    assert frame_type(socket.render(delta)) == "response.output_audio.delta"
