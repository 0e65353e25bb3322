"""Media encoding for session outputs (CPU-bound: callers run these off the event loop)."""
