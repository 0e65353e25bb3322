"""The echo model: the smallest streaming pipeline, for the echo session kind (docs/adding-a-session-kind.md)."""
