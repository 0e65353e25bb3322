"""Model-loading progress: a tqdm bar on a terminal, ``key=value`` / JSON log lines otherwise.

Load progress is the server's own: each kind reports its steps through :class:`LoadProgress`.
The libraries a load calls draw bars of their own (transformers' "Loading weights" and "Writing
model shards", its GGUF "Converting and de-quantizing GGUF tensors", huggingface_hub's downloads),
which write raw carriage returns into the structured log; :func:`quiet_library_progress_bars`
turns them off for the whole process before the first load.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from typing import Any

log = logging.getLogger("realtime.load")

#: environment defaults that turn third-party bars off: tqdm reads ``TQDM_*`` as the defaults of
#: every bar when it is first imported, huggingface_hub (and through it transformers) reads its own
QUIET_BARS_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def quiet_library_progress_bars() -> None:
    """Turn off the progress bars of tqdm, transformers and huggingface_hub in this process (and
    the processes it starts), unless the environment already says otherwise.

    The ``TQDM_DISABLE`` default is read when tqdm is first imported, so this runs before any
    load imports it (the app calls it as loading starts; ``realtime.server`` imports no tqdm);
    transformers and huggingface_hub are switched off at run time too, if already imported."""
    for name, value in QUIET_BARS_ENV.items():
        os.environ.setdefault(name, value)
    if "huggingface_hub" in sys.modules:
        importlib.import_module("huggingface_hub.utils").disable_progress_bars()
    if "transformers" in sys.modules:
        importlib.import_module("transformers.utils.logging").disable_progress_bar()


class LoadCancelled(Exception):
    """Raised by a :class:`LoadProgress` call after :meth:`LoadProgress.cancel`."""


class LoadProgress:
    """Callable ``(step, done, total)`` passed to each session kind's ``load``.

    A load runs on a worker thread that asyncio cannot interrupt, and the interpreter joins it at
    exit: a server stopped during a long load (Ctrl-C while the world compiles) would wait for
    the whole load. :meth:`cancel` (thread-safe) makes the next call raise
    :class:`LoadCancelled`, so the load ends at its next reported step."""

    def __init__(self, kind: str, use_bar: bool | None = None) -> None:
        self.kind = kind
        self._use_bar = sys.stderr.isatty() if use_bar is None else use_bar
        self._bar: Any = None  # a tqdm bar, on a terminal
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def __call__(self, step: str, done: int, total: int) -> None:
        if self._cancelled.is_set():
            raise LoadCancelled(f"loading {self.kind} stopped at {step!r}: the server is stopping")
        if self._use_bar:
            if self._bar is None:
                from tqdm import tqdm  # imported late: see quiet_library_progress_bars

                # disable=False: this bar is the server's own, whatever TQDM_DISABLE says
                self._bar = tqdm(
                    total=total, desc=f"loading {self.kind}", unit="step", leave=False, disable=False
                )
            self._bar.total = total
            self._bar.set_postfix_str(step)
            self._bar.n = done
            self._bar.refresh()
        else:
            log.info("loading", extra={"kind": self.kind, "step": step, "done": done, "total": total})

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
