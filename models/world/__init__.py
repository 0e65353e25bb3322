"""The causal world model: block-autoregressive video diffusion with resident rolling KV.

One readable file per part (the forward path is ``dit.py``; the rest earns its own file):

- ``configs.py``      geometry contract (world-tiny, Self-Forcing / CausVid, the Wan-shaped timing
                      config, test size), the peers' few-step schedules, safetensors I/O
- ``dit.py``          Wan 2.1's causal DiT at every size: patch embedding, time (+ action)
                      modulation, block-causal self-attention with 3-axis RoPE on absolute frame
                      indices, text cross-attention, the head
- ``attention.py``    the attention kernel (SDPA / FlashAttention-4) and the key split that fills the SMs
- ``kv_cache.py``     pooled, preallocated ``[sink | window]`` self-attention KV + cross-attention KV per slot
- ``sampler.py``      few-step flow sampling: staged denoise passes, a t = 0 clean pass that commits
                      KV; the cache-free recompute reference
- ``graphs.py``       CUDA-graph replay of the DiT's steady pass
- ``checkpoints.py``  Self-Forcing / CausVid checkpoint files: reading, checking, key mapping
- ``prompts.py``      prompts -> text context (world-tiny's word table; ``text_encoder.py``: umT5)
- ``vae.py``          the small causal decoder with a per-session temporal cache (1 + 4(n-1) frames, then 4n);
                      ``wan_vae.py`` Wan 2.1's VAE decoder and ``taehv.py`` TAEHV's tiny decoder of
                      its latents, with the same contract; ``decoders.py`` picks one by the config
- ``model.py``        ``WorldModel``: resident sessions, batched transactional ``generate`` / ``decode``
- ``stage.py``        the model as the DiT block stage and the decode stage of the stage engine
- ``profiling.py``    stage timing behind one seam (off by default)
- ``memory.py``       the bytes outside the per-session pools, from the config alone
- ``controls.py``     control schemas (``keys``, ``mouse``) -> action vectors
- ``start_frames.py`` the start latents a session's first block holds (world-tiny ships them)
- ``training/``       the procedural maze, start-frame rendering and the training script of world-tiny
                      (no serving module imports it)
"""
