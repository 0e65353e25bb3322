"""A small streaming neural audio codec (Mimi's shape in miniature): 24 kHz <-> 12.5 Hz tokens.

- Encoder: causal strided 1-D convs (kernel ``2 * stride``, left context ``stride``), ELU between
  them, then a 1x1 conv to ``latent_dim``: one latent per 1920 samples (80 ms).
- Residual VQ: ``n_q`` codebooks of ``codebook_size``; each quantises what the previous left.
- Decoder: a 1x1 conv, then causal transposed convs (kernel ``2 * stride``) mirroring the encoder,
  ELU between them, a 1x1 conv to one channel and ``tanh``: one latent -> 1920 samples.

Streaming state is explicit: each encoder conv keeps the last ``stride`` input samples of the
previous chunk (its left context), each decoder transposed conv keeps the ``stride`` output
samples that overlap into the next chunk (its tail). Zero state is the start of a stream, so
encoding (decoding) frame by frame with carried state equals encoding (decoding) the whole signal
at once with zero state: the same arithmetic on the same samples. :class:`CodecStatePool` holds
these buffers for every slot, preallocated. Weights are random (seeded): the tokens carry no
phonetics, the decoded audio is noise-like. A random decoder's output sits at a constant offset
(ELU activations are mostly positive), so :meth:`StreamingCodec.normalise_output` rescales its last
1x1 conv once at build: zero mean, a set spread over random codes (audible noise, not a DC level).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.duplex.configs import DuplexModelConfig


class CausalConv(nn.Module):
    """Strided conv, kernel ``2 * stride``; its state is the previous ``stride`` input samples."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(cin, cout, 2 * stride, stride=stride)

    def forward(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """``x [B, cin, L]`` (``L`` a multiple of ``stride``), ``state [B, cin, stride]`` ->
        ``([B, cout, L / stride], next state)``."""
        xx = torch.cat([state, x], dim=-1)
        return self.conv(xx), xx[..., -self.stride :]


class CausalConvTranspose(nn.Module):
    """Transposed conv, kernel ``2 * stride``; its state is the output tail overlapping the next chunk."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.ConvTranspose1d(cin, cout, 2 * stride, stride=stride)

    def forward(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """``x [B, cin, L]``, ``state [B, cout, stride]`` -> ``([B, cout, L * stride], next state)``."""
        y = F.conv_transpose1d(x, self.conv.weight, None, stride=self.stride)
        n = x.shape[-1] * self.stride
        head = y[..., : self.stride] + state  # the bias is added once, below, to emitted samples only
        y = torch.cat([head, y[..., self.stride :]], dim=-1)
        return y[..., :n] + self.conv.bias[:, None], y[..., n:]


class ResidualVQ(nn.Module):
    def __init__(self, n_q: int, size: int, dim: int) -> None:
        super().__init__()
        self.codebooks = nn.Parameter(torch.randn(n_q, size, dim) / dim**0.5)

    def encode(self, z: Tensor) -> Tensor:
        """``z [B, dim, F]`` -> codes ``[B, n_q, F]`` (nearest codeword of each residual)."""
        r = z.transpose(1, 2)  # [B, F, dim]
        codes = []
        for book in self.codebooks:
            dist = (r * r).sum(-1, keepdim=True) - 2 * r @ book.T + (book * book).sum(-1)
            idx = dist.argmin(-1)  # [B, F]
            codes.append(idx)
            r = r - book[idx]
        return torch.stack(codes, dim=1)

    def decode(self, codes: Tensor) -> Tensor:
        """codes ``[B, n_q, F]`` -> ``[B, dim, F]`` (sum of the chosen codewords)."""
        z = sum(book[codes[:, q]] for q, book in enumerate(self.codebooks))
        return z.transpose(1, 2)


@dataclass(frozen=True)
class CodecState:
    """One batch's streaming buffers: per encoder conv ``[B, cin, stride]``, per decoder conv
    ``[B, cout, stride]``."""

    encoder: tuple[Tensor, ...]
    decoder: tuple[Tensor, ...]


class StreamingCodec(nn.Module):
    def __init__(self, cfg: DuplexModelConfig) -> None:
        super().__init__()
        widths = (1, *cfg.codec_channels)
        self.encoder = nn.ModuleList(
            CausalConv(widths[i], widths[i + 1], s) for i, s in enumerate(cfg.codec_strides)
        )
        self.to_latent = nn.Conv1d(widths[-1], cfg.latent_dim, 1)
        self.quantizer = ResidualVQ(cfg.n_q, cfg.codebook_size, cfg.latent_dim)
        self.from_latent = nn.Conv1d(cfg.latent_dim, widths[-1], 1)
        out_widths = (cfg.codec_channels[0], *cfg.codec_channels[:-1])
        self.decoder = nn.ModuleList(
            CausalConvTranspose(cfg.codec_channels[i], out_widths[i], cfg.codec_strides[i])
            for i in reversed(range(len(cfg.codec_strides)))
        )
        self.to_audio = nn.Conv1d(cfg.codec_channels[0], 1, 1)

    def encode(self, pcm: Tensor, state: CodecState) -> tuple[Tensor, tuple[Tensor, ...]]:
        """``pcm [B, L]`` (``L`` a multiple of 1920) -> codes ``[B, n_q, L / 1920]`` and the next
        encoder state."""
        x, after = pcm[:, None, :], []
        for i, (conv, buf) in enumerate(zip(self.encoder, state.encoder, strict=True)):
            x, nxt = conv(x, buf)
            after.append(nxt)
            if i < len(self.encoder) - 1:
                x = F.elu(x)
        return self.quantizer.encode(self.to_latent(x)), tuple(after)

    def decode(self, codes: Tensor, state: CodecState) -> tuple[Tensor, tuple[Tensor, ...]]:
        """codes ``[B, n_q, F]`` -> ``pcm [B, F * 1920]`` in [-1, 1] and the next decoder state."""
        x, after = self._decode_features(codes, state)
        return torch.tanh(self.to_audio(x))[:, 0], after

    def _decode_features(self, codes: Tensor, state: CodecState) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The decoder up to its last 1x1 conv: ``[B, channels, F * 1920]`` and the next state."""
        x, after = self.from_latent(self.quantizer.decode(codes)), []
        for conv, buf in zip(self.decoder, state.decoder, strict=True):
            x, nxt = conv(F.elu(x), buf)
            after.append(nxt)
        return F.elu(x), tuple(after)

    @torch.no_grad()
    def normalise_output(self, frames: int = 16, std: float = 0.1) -> None:
        """For random weights: rescale the last 1x1 conv so its output (before ``tanh``) has zero
        mean and standard deviation ``std`` over ``frames`` frames of uniformly random codes
        (drawn from torch's global generator: seeded builds stay reproducible). Streaming is
        untouched: only two parameters change, once."""
        book = self.quantizer.codebooks
        codes = torch.randint(book.shape[1], (1, book.shape[0], frames), device=book.device)
        zeros = tuple(
            torch.zeros(1, c.conv.out_channels, c.stride, dtype=book.dtype, device=book.device)
            for c in self.decoder
        )
        x, _ = self._decode_features(codes, CodecState((), zeros))
        y = self.to_audio(x)
        scale = std / y.std().clamp_min(1e-8)
        self.to_audio.bias.sub_(y.mean()).mul_(scale)
        self.to_audio.weight.mul_(scale)


class CodecStatePool:
    """Every slot's encoder (user audio) and decoder (model audio) buffers, preallocated, zero = fresh."""

    def __init__(self, codec: StreamingCodec, slots: int, dtype: torch.dtype, device: str) -> None:
        enc = [(c.conv.in_channels, c.stride) for c in codec.encoder]
        dec = [(c.conv.out_channels, c.stride) for c in codec.decoder]
        self.encoder = tuple(torch.zeros(slots, c, s, dtype=dtype, device=device) for c, s in enc)
        self.decoder = tuple(torch.zeros(slots, c, s, dtype=dtype, device=device) for c, s in dec)

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (*self.encoder, *self.decoder))

    def gather(self, slots: Tensor) -> CodecState:
        return CodecState(
            tuple(t[slots] for t in self.encoder),
            tuple(t[slots] for t in self.decoder),
        )

    def commit(self, slots: Tensor, encoder: tuple[Tensor, ...], decoder: tuple[Tensor, ...]) -> None:
        for pool, new in zip((*self.encoder, *self.decoder), (*encoder, *decoder), strict=True):
            pool[slots] = new

    def reset(self, slot: int) -> None:
        for t in (*self.encoder, *self.decoder):
            t[slot].zero_()
