"""Model-loading progress: a tqdm bar on a terminal, ``key=value`` log lines otherwise."""

from __future__ import annotations

import logging
import sys
import threading

from tqdm import tqdm

log = logging.getLogger("realtime.load")


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
        self._bar: tqdm | None = None
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def __call__(self, step: str, done: int, total: int) -> None:
        if self._cancelled.is_set():
            raise LoadCancelled(f"loading {self.kind} stopped at {step!r}: the server is stopping")
        if self._use_bar:
            if self._bar is None:
                self._bar = tqdm(total=total, desc=f"loading {self.kind}", unit="step", leave=False)
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
