"""Replicas on their own cores (``replicas.cpu_affinity``, docs/scaling.md): the CPU list syntax,
each replica's block of it, and pinning a whole process to a set of cores.

Ray's ``num_cpus`` is bookkeeping: it places actors but does not confine them, so CPU replicas on
one node share every core with each other, Serve's proxy and whatever else runs there. With
``replicas.cpu_affinity`` set, the replica whose node-local rank is ``r`` pins its process to the
``r``-th block of ``num_cpus`` cores of the list (:func:`replica_block`), so each replica computes
on cores of its own. Linux only (``os.sched_setaffinity``).
"""

from __future__ import annotations

import os


class CpuListError(ValueError):
    """A CPU list that does not parse; ``str()`` says why."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The cores of a Linux CPU list (``"12-15"``, ``"0,2,4-7"``), in the order written, each
    once; raises :class:`CpuListError` for anything else (empty, negative, reversed ranges,
    repeats, junk)."""
    cores: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise CpuListError(f"{text!r} is not a CPU list like '12-15' or '0,2,4-7'")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise CpuListError(f"range {part.strip()!r} runs backwards")
        cores.extend(range(first, last + 1))
    if len(set(cores)) != len(cores):
        raise CpuListError(f"{text!r} names a core twice")
    return tuple(cores)


def replica_block(cores: tuple[int, ...], per_replica: int, rank: int) -> tuple[int, ...]:
    """Replica ``rank``'s cores: the ``rank``-th block of ``per_replica`` of ``cores``; empty when
    the list has no whole block left for it."""
    block = cores[rank * per_replica : (rank + 1) * per_replica]
    return block if len(block) == per_replica else ()


def pin_process(cores: tuple[int, ...]) -> None:
    """Confine every thread of this process, and the threads and children it starts later, to
    ``cores`` (``os.sched_setaffinity`` of one id moves one thread, so each is moved); raises
    ``OSError`` when the kernel refuses (a core this machine or its cgroup lacks)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
