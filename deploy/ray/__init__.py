"""The Ray Serve application of the realtime server, for ``serve run`` (docs/scaling.md)."""
