"""The full-duplex speech model: a small Moshi-architecture speech LM over a streaming codec.

One readable file per part (see ``README.md``):

- ``configs.py``        geometry contract: the embedded small default, a test size, Moshi-7B shapes
- ``stage.py``          ``DuplexStage``: the model as one batched, stateful stage of the stage engine
"""
