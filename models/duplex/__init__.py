"""The full-duplex speech model: a small Moshi-architecture speech LM over a streaming codec.

One readable file per part (see ``README.md``):

- ``configs.py``        geometry contract: the embedded small default, a test size, Moshi-7B shapes
- ``codec.py``          streaming causal-conv codec (24 kHz <-> 12.5 Hz), residual VQ, per-slot buffers
- ``kv_cache.py``       temporal KV resident in place per slot, sink + window rolling
- ``lm.py``             the speech LM: temporal transformer over text + audio streams, depth transformer
- ``stage.py``          ``DuplexStage``: the model as one batched, stateful stage of the stage engine
"""
