"""Thread pools whose workers all exist from the start.

``ThreadPoolExecutor`` adds a worker whenever a task finds none idle, up to its limit, and never
retires one: under load its thread count creeps up once and stays there. To an operator watching
threads, and to the reliability suite's churn check (thread counts before and after), that growth
looks like a leak. A pool from here starts every worker at once, so its thread count is fixed
from its creation to its shutdown.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


def default_workers() -> int:
    """The worker count of asyncio's default executor: Python's own formula."""
    return min(32, (os.cpu_count() or 1) + 4)


def prestarted_pool(threads: int, name: str) -> ThreadPoolExecutor:
    """A pool of ``threads`` workers, all running when this returns."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
    started = threading.Barrier(threads + 1)  # each worker waits here until all exist
    for _ in range(threads):
        pool.submit(started.wait)
    started.wait()
    return pool
