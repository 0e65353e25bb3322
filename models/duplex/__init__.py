"""The full-duplex speech models: the cascade that converses (the default) and a small
Moshi-architecture speech LM over a streaming codec (random weights).

One readable file per part (see ``README.md``):

- ``cascade.py``        ``duplex-cascade``: VAD + streaming ASR -> turn-taking -> LLM -> TTS as one duplex stage
- ``turns.py``          the cascade's turn-taking: end of turn, speculation, barge-in, backchannel
- ``configs.py``        geometry contract: the embedded small default, a test size, Moshi-7B shapes
- ``codec.py``          streaming causal-conv codec (24 kHz <-> 12.5 Hz), residual VQ, per-slot buffers
- ``kv_cache.py``       temporal KV resident in place per slot, sink + window rolling
- ``lm.py``             the speech LM: temporal transformer over text + audio streams, depth transformer
- ``stage.py``          ``DuplexStage``: the model as one batched, stateful stage of the stage engine
- ``context.py``        a model's context as host data: what checkpoints keep, how a resume restores it
"""
