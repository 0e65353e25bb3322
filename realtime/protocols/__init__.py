"""Wire protocol codecs, sans-I/O: bytes or text in -> typed commands out, typed events in -> bytes or text out."""
