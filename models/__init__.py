"""Model implementations and adapters; each exposes a small stage interface the runtime drives.

Imports nothing from ``realtime`` or ``sessions``.
"""
