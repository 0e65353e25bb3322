"""The speech LM: Moshi's layout in miniature (a temporal transformer and a depth transformer).

Streams, one position per 80 ms frame: the text stream (the model's inner monologue), the model's
``n_q`` audio codebooks and the user's ``n_q`` audio codebooks (from the codec). No acoustic
delay between codebooks (Moshi delays the acoustic codebooks by one frame; a simplification).

- **Temporal transformer** (causal over frames, RoPE, resident KV in :class:`SlotKV`): the input
  of step ``t`` is the sum of the embeddings of the text token and the model's audio tokens chosen
  at step ``t - 1`` (a start token at ``t = 0``) and the user's audio tokens of frame ``t``.
  Its output ``h_t`` gives the text token of step ``t`` through the text head.
- **Depth transformer** (causal over the ``n_q`` codebooks of one frame, no state across frames):
  position ``k`` gets ``proj(h_t)`` plus the embedding of the token before it (the text token for
  ``k = 0``, codebook ``k - 1`` otherwise) and predicts the model's codebook ``k``. Its KV is
  per-call scratch ``[B, heads, n_q, head_dim]`` per layer.

Listen/speak decision: from the text stream. Token 0 is PAD: a PAD step is "listening", any
other token "speaking" (Moshi's text stream is mostly PAD while the model listens). The text
head's PAD bias starts at ``pad_bias`` so that the random model listens about half the time.

Sampling: Gumbel-max with noise that is a pure function of ``(session seed, step, stream)`` (a
counter-based hash), so a step's tokens do not depend on the batch it ran in, on the device's
random state, or on retries: stepping is deterministic and transactional by construction.
Weights are random (seeded) unless loaded: the text is random words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.duplex.configs import DuplexModelConfig
from models.duplex.kv_cache import SlotKV, StepRows
from models.rope import apply_rope, rope, rope_angles
from models.world.dit import RMSNorm

PAD, BOS = 0, 1
# The tiny text vocabulary's word pieces (ids 2 ..); larger vocabularies (Moshi-shaped) reuse them.
WORDS = (
    "yes no hi hello okay so well right sure I you we it that this what how why when where "
    "is are was be do can will think know like mean really just now here there good great "
    "fine thanks sorry maybe and but or because then also very much more time day way thing"
).split()

# Attention over the keys/values a layer is allowed to see: (q, k, v) [B, H, N, Dh] -> [B, H, N, Dh].
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


class Block(nn.Module):
    """Pre-norm transformer block: self-attention (RoPE when positions are given) + SwiGLU MLP."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, theta: float) -> None:
        super().__init__()
        self.heads, self.theta = heads, theta
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.w_gate = nn.Linear(dim, ffn_dim, bias=False)
        self.w_up = nn.Linear(dim, ffn_dim, bias=False)
        self.w_down = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: Tensor, angles: tuple[Tensor, Tensor] | None, attend: Attend) -> Tensor:
        """``x [B, N, D]``; ``angles``: the :func:`rope_angles` of the tokens' absolute frame
        indices (computed once per forward), or None (no RoPE)."""
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        if angles is not None:
            q, k = apply_rope(q, angles), apply_rope(k, angles)
        o = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(o.transpose(1, 2).reshape(b, n, d))
        h = self.norm2(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


def text_piece(token: int) -> str:
    """The text a token adds to the transcript: ``""`` for PAD and BOS, else ``" " + word``."""
    return "" if token in (PAD, BOS) else " " + WORDS[(token - 2) % len(WORDS)]


def _hash32(x: Tensor) -> Tensor:
    """A 32-bit integer mix (lowbias32) of int64 values holding 32-bit numbers."""
    mask = 0xFFFFFFFF
    x = x & mask
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & mask
    x = ((x ^ (x >> 15)) * 0x846CA68B) & mask
    return x ^ (x >> 16)


def gumbel_noise(seeds: Tensor, step: Tensor, streams: int, vocab: int) -> Tensor:
    """Gumbel noise ``[B, streams, vocab]`` (float64), a pure function of each row's ``seeds [B]``,
    ``step [B]`` (int64), the stream index and the token id."""
    key = _hash32(
        seeds[:, None] ^ _hash32(step[:, None] * 0x9E3779B1 + torch.arange(streams, device=step.device))
    )
    bits = _hash32(key[:, :, None] ^ _hash32(torch.arange(vocab, device=step.device)))
    u = (bits.to(torch.float64) + 0.5) / 2**32
    return -torch.log(-torch.log(u))


def sample(logits: Tensor, noise: Tensor, temperature: float) -> Tensor:
    """Token per row of ``logits [B, V]``: Gumbel-max with ``noise [B, V]``; 0 = greedy."""
    if temperature == 0:
        return logits.argmax(-1)
    return (logits.to(torch.float64) / temperature + noise).argmax(-1)


@dataclass(frozen=True)
class StepTokens:
    """What one temporal + depth step chose for each row."""

    text: Tensor  # [B] text token of this step
    audio: Tensor  # [B, n_q] the model's codebooks of this step
    hidden: Tensor  # [B, D] temporal transformer output (before the heads)


class DuplexLM(nn.Module):
    def __init__(self, cfg: DuplexModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, dd, n_q, size = cfg.dim, cfg.depth_dim, cfg.n_q, cfg.codebook_size
        self.text_emb = nn.Embedding(cfg.text_vocab, d)
        self.audio_emb = nn.ModuleList(nn.Embedding(size + 1, d) for _ in range(n_q))  # id size = start
        self.user_emb = nn.ModuleList(nn.Embedding(size, d) for _ in range(n_q))
        self.temporal = nn.ModuleList(
            Block(d, cfg.heads, cfg.ffn_dim, cfg.rope_theta) for _ in range(cfg.layers)
        )
        self.out_norm = RMSNorm(d)
        self.text_head = nn.Linear(d, cfg.text_vocab)
        with torch.no_grad():
            self.text_head.bias[PAD] += cfg.pad_bias
        self.depth_in = nn.Linear(d, dd)
        self.depth_text_emb = nn.Embedding(cfg.text_vocab, dd)
        self.depth_audio_emb = nn.ModuleList(nn.Embedding(size, dd) for _ in range(n_q - 1))
        self.depth_pos = nn.Parameter(torch.randn(n_q, dd) * 0.02)
        self.depth = nn.ModuleList(
            Block(dd, cfg.depth_heads, cfg.depth_ffn_dim, cfg.rope_theta) for _ in range(cfg.depth_layers)
        )
        self.depth_norm = RMSNorm(dd)
        self.audio_heads = nn.ModuleList(nn.Linear(dd, size, bias=False) for _ in range(n_q))

    @property
    def start_audio(self) -> int:
        """The model-audio token id fed at ``t = 0`` (before the model said anything)."""
        return self.cfg.codebook_size

    def embed(self, text: Tensor, audio: Tensor, user: Tensor) -> Tensor:
        """Temporal input: ``text [B, N]``, ``audio / user [B, N, n_q]`` -> ``[B, N, D]``."""
        x = self.text_emb(text)
        for q in range(self.cfg.n_q):
            x = x + self.audio_emb[q](audio[..., q]) + self.user_emb[q](user[..., q])
        return x

    def temporal_forward(self, x: Tensor, positions: Tensor, attend: Callable[[int], Attend]) -> Tensor:
        """``x [B, N, D]`` at ``positions [B, N]`` -> ``h [B, N, D]``; ``attend(layer)`` gives each
        layer's attention (over the resident KV for a step, causal over ``x`` for a recompute)."""
        angles = rope_angles(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for layer, block in enumerate(self.temporal):
            x = block(x, angles, attend(layer))
        return self.out_norm(x)

    def depth_decode(self, h: Tensor, text: Tensor, seeds: Tensor, step: Tensor) -> Tensor:
        """The model's ``n_q`` codebooks ``[B, n_q]`` after temporal output ``h [B, D]`` and the
        step's text token ``text [B]``, one depth position per codebook."""
        cfg = self.cfg
        noise = gumbel_noise(seeds, step, 1 + cfg.n_q, cfg.codebook_size)[:, 1:]  # stream 0 is text
        b = h.shape[0]
        base = self.depth_in(h)
        scratch = [
            h.new_zeros(2, b, cfg.depth_heads, cfg.n_q, cfg.depth_head_dim) for _ in range(cfg.depth_layers)
        ]
        prev_emb = self.depth_text_emb(text)
        codes = []
        for k in range(cfg.n_q):
            x = (base + prev_emb + self.depth_pos[k])[:, None, :]
            for layer, block in enumerate(self.depth):
                x = block(x, None, _scratch_attend(scratch[layer], k))
            logits = self.audio_heads[k](self.depth_norm(x[:, 0]))
            code = sample(logits, noise[:, k], cfg.audio_temperature)
            codes.append(code)
            if k + 1 < cfg.n_q:
                prev_emb = self.depth_audio_emb[k](code)
        return torch.stack(codes, dim=1)

    def step(
        self, kv: SlotKV, rows: StepRows, text: Tensor, audio: Tensor, user: Tensor, seeds: Tensor
    ) -> StepTokens:
        """One frame of every row of ``rows``: previous ``text [B]`` / ``audio [B, n_q]``, this
        frame's ``user [B, n_q]`` codes, ``seeds [B]``. Writes each row's KV at its position in
        place (a padding row, ``t = -1``, into the scratch column)."""
        x = self.embed(text[:, None], audio[:, None], user[:, None])
        view = kv.view(rows)

        def attend(layer: int) -> Attend:
            return lambda q, k, v: kv.attend(layer, rows, view, q, k, v)

        h = self.temporal_forward(x, rows.t[:, None], attend)[:, 0]
        noise = gumbel_noise(seeds, rows.t, 1, self.cfg.text_vocab)[:, 0]
        text_out = sample(self.text_head(h), noise, self.cfg.text_temperature)
        return StepTokens(text_out, self.depth_decode(h, text_out, seeds, rows.t), h)

    def prefill(self, kv: SlotKV, slot: int, inputs: Tensor, frames: Tensor, positions: Tensor) -> None:
        """Rebuild one slot's KV from the temporal inputs of its kept frames (a restored session,
        ``models/duplex/context.py``): ``inputs [N, 1 + 2 n_q]`` (previous text, previous model
        codebooks, user codes) of frames ``frames [N]`` (ascending), in one causal forward at
        RoPE ``positions [N]``; each key is stored at its frame's column, roped with the frame's
        index as a step stores it. With ``frames == positions == 0 .. N - 1`` (no roll) this is
        what stepping the same inputs writes (up to rounding); after a roll the kept frames see
        only each other (the frames they saw once are gone)."""
        n_q = self.cfg.n_q
        x = self.embed(inputs[None, :, 0], inputs[None, :, 1 : 1 + n_q], inputs[None, :, 1 + n_q :])
        columns = kv.index(frames)
        back = (frames - positions)[None]  # the rotation from a key's position to its frame's

        def attend(layer: int) -> Attend:
            def run(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                stored = rope(k.transpose(1, 2), back, self.cfg.rope_theta).transpose(1, 2)
                kv.store(slot, layer, columns, stored[0], v[0])
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            return run

        self.temporal_forward(x, positions[None], attend)

    def bucket_step(
        self, kv: SlotKV, text: Tensor, audio: Tensor, user: Tensor, seeds: Tensor, t: Tensor
    ) -> Tensor:
        """:meth:`step` of pool rows ``0 .. b - 1`` (``b = len(t)``; ``t = -1``: a padding row),
        as one tensor ``[b, 1 + n_q]`` (text token, then the codebooks): the graph-capturable form
        (fixed shapes, no host synchronisation, no host-side knowledge of the rows)."""
        out = self.step(kv, StepRows.bucket(t), text, audio, user, seeds)
        return torch.cat([out.text[:, None], out.audio], dim=1)


def _scratch_attend(scratch: Tensor, k_pos: int) -> Attend:
    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scratch[0, :, :, k_pos] = k[:, :, 0]
        scratch[1, :, :, k_pos] = v[:, :, 0]
        return F.scaled_dot_product_attention(q, scratch[0, :, :, : k_pos + 1], scratch[1, :, :, : k_pos + 1])

    return attend
