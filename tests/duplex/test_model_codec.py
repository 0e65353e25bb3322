"""The streaming codec: frame-by-frame coding equals whole-signal coding; per-slot buffers."""

from __future__ import annotations

import torch

from models.duplex.codec import CodecStatePool, StreamingCodec
from models.duplex.configs import FRAME_SAMPLES, SMALL, TEST


def _codec(cfg=TEST) -> StreamingCodec:
    torch.manual_seed(0)
    return StreamingCodec(cfg).eval().requires_grad_(False)


def test_encoding_and_decoding_frame_by_frame_equals_the_whole_signal_at_once() -> None:
    codec, frames = _codec(), 7
    pcm = 0.3 * torch.randn(3, frames * FRAME_SAMPLES, generator=torch.Generator().manual_seed(2))
    whole_pool, stream_pool = (
        CodecStatePool(codec, 3, torch.float32, "cpu"),
        CodecStatePool(codec, 3, torch.float32, "cpu"),
    )
    rows = torch.arange(3)
    codes, _ = codec.encode(pcm, whole_pool.gather(rows))
    audio, _ = codec.decode(codes, whole_pool.gather(rows))
    assert codes.shape == (3, TEST.n_q, frames) and audio.shape == (3, frames * FRAME_SAMPLES)
    streamed_codes, streamed_audio = [], []
    for f in range(frames):
        state = stream_pool.gather(rows)
        c, encoder = codec.encode(pcm[:, f * FRAME_SAMPLES : (f + 1) * FRAME_SAMPLES], state)
        a, decoder = codec.decode(c, state)
        stream_pool.commit(rows, encoder, decoder)
        streamed_codes.append(c)
        streamed_audio.append(a)
    assert torch.equal(torch.cat(streamed_codes, dim=-1), codes)
    torch.testing.assert_close(torch.cat(streamed_audio, dim=-1), audio, rtol=1e-5, atol=1e-6)
    assert len(set(codes.flatten().tolist())) > 1  # the tokens follow the signal


def test_slots_stream_independently_and_reset_to_a_fresh_stream() -> None:
    codec = _codec()
    pool = CodecStatePool(codec, 2, torch.float32, "cpu")
    pcm = 0.3 * torch.randn(2, FRAME_SAMPLES, generator=torch.Generator().manual_seed(3))
    first, enc, dec = None, None, None
    for _ in range(2):  # slot 1 carries context from its previous frame
        state = pool.gather(torch.tensor([1]))
        codes, enc = codec.encode(pcm[1:], state)
        audio, dec = codec.decode(codes, state)
        pool.commit(torch.tensor([1]), enc, dec)
        first = audio if first is None else first
    assert all(t[0].abs().sum() == 0 for t in (*pool.encoder, *pool.decoder))  # slot 0 untouched
    assert not torch.equal(audio, first)  # same frame, different left context
    pool.reset(1)
    state = pool.gather(torch.tensor([1]))
    again, _ = codec.decode(codec.encode(pcm[1:], state)[0], state)
    torch.testing.assert_close(again, first)


def test_pool_bytes_are_the_buffers_of_one_slot() -> None:
    codec = _codec(SMALL)
    pool = CodecStatePool(codec, 4, torch.float64, "cpu")
    assert pool.bytes_per_slot * 4 == sum(t.nbytes for t in (*pool.encoder, *pool.decoder))
    left_context = sum(conv.conv.in_channels * conv.stride for conv in codec.encoder)
    tails = sum(conv.conv.out_channels * conv.stride for conv in codec.decoder)
    assert pool.bytes_per_slot == 8 * (left_context + tails)
