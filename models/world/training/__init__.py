"""Training of the embedded world model (world-tiny) and the measures it reports.

Nothing in the serving path imports this package (``tests/test_import_direction.py``):

- ``env.py``          the procedural maze the default is trained on (and its control-response measure)
- ``train.py``        the training script (autoencoder, teacher-forced causal DiT, decoder on samples)
- ``start_frames.py`` renders start frames into a model file (``models.world.start_frames`` serves them)
- ``sharpness.py``    sharpness / PSNR of generated frames against the maze's own
"""
