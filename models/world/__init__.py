"""The causal world model: block-autoregressive video diffusion with resident rolling KV.

One readable file per part:

- ``configs.py``   geometry contract (tiny trained default, test size, Wan-2.1-1.3B shapes), safetensors I/O
- ``dit.py``       causal DiT: patchify, adaLN time + action conditioning, block-causal self-attention
                   with temporal RoPE on absolute frame indices, text cross-attention
- ``kv_cache.py``  pooled, preallocated ``[sink | window]`` self-attention KV + cross-attention KV per slot
- ``sampler.py``   few-step flow sampling: staged denoise passes, a sigma=0 clean pass that commits KV;
                   the cache-free recompute reference
- ``vae.py``       causal decoder with a per-session temporal cache (1 + 4(n-1) frames, then 4n)
- ``model.py``     ``WorldModel``: resident sessions, batched transactional ``generate`` / ``decode``
- ``stage.py``     ``WorldStage``: the model as a stateful stage of the stage engine
- ``controls.py``  control schemas (``keys``, ``mouse``) -> action vectors
- ``start_frames.py`` the start latents a session's first block holds (world-tiny ships them)
- ``training/``     the procedural maze, start-frame rendering and the training script of world-tiny
                   (no serving module imports it)
"""
