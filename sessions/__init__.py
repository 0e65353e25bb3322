"""The session runtime: manager, session state machine, ticks, stage engine, KV/state pools.

Imports nothing from ``realtime`` (protocols live there); models are reached through the
interfaces declared in ``models``.
"""
