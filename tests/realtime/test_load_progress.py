"""Load progress is the server's own lines: third-party progress bars stay out of the log.

A fresh interpreter per case, since tqdm reads its ``TQDM_*`` defaults when first imported. The
whole server's log (``--log-format json``, every line JSON, no carriage return) is checked by
``tests/test_readme.py::test_the_server_log_is_json_lines_only``.
"""

from __future__ import annotations

import os
import subprocess
import sys

# the bars a voice load draws: transformers' "Loading weights" (its logging.tqdm) and the GGUF
# conversion's plain tqdm.auto bar
LIBRARY_BARS = """
import realtime.app  # what the server imports before loading
from realtime.progress import LoadProgress, quiet_library_progress_bars
quiet_library_progress_bars()
from tqdm.auto import tqdm
from transformers.utils import logging as hf_logging
for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
    pass
for _ in hf_logging.tqdm(range(3), desc="Loading weights"):
    pass
progress = LoadProgress("voice", use_bar={use_bar})
progress("llm", 0, 1)
progress.close()
"""


def run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True
    )


def test_library_bars_are_off_and_the_servers_own_bar_stays():
    quiet = run(LIBRARY_BARS.format(use_bar=False))
    assert quiet.stderr == "" and quiet.stdout == ""
    own = run(LIBRARY_BARS.format(use_bar=True))  # a terminal's bar is the server's own
    assert "loading voice" in own.stderr
    assert "Loading weights" not in own.stderr and "GGUF" not in own.stderr


def test_without_quieting_the_bars_would_leak():
    """The check above can fail: the same bars, not quieted, write to stderr."""
    loud = run(LIBRARY_BARS.replace("quiet_library_progress_bars()\n", "").format(use_bar=False))
    assert "Loading weights" in loud.stderr and "GGUF" in loud.stderr
