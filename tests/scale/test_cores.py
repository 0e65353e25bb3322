"""Replicas on their own cores (``replicas.cpu_affinity``, ``realtime.scale.cores``): the CPU list
syntax, each replica's block, pinning a whole process, and the config's checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from realtime.config import ConfigError, config_from_mapping
from realtime.scale.cores import CpuListError, parse_cpu_list, replica_block

from .test_optional_ray import needs_ray


def test_cpu_lists_parse_like_linux_and_anything_else_is_refused():
    assert parse_cpu_list("12-15") == (12, 13, 14, 15)
    assert parse_cpu_list("0,2,4-6") == (0, 2, 4, 5, 6)
    assert parse_cpu_list(" 3 ") == (3,)
    for bad in ("", "a", "1-", "-1", "3-1", "1,,2", "1,1", "0-2,2", "1.5", "0x1"):
        with pytest.raises(CpuListError):
            parse_cpu_list(bad)


def test_each_replica_takes_its_own_block_and_none_is_left_past_the_list():
    cores = (12, 13, 14, 15)
    assert replica_block(cores, 2, 0) == (12, 13)
    assert replica_block(cores, 2, 1) == (14, 15)
    assert replica_block(cores, 2, 2) == ()
    assert replica_block((0, 1, 2), 2, 1) == ()  # half a block is no block


def test_a_bad_cpu_affinity_is_a_config_error_naming_the_field():
    assert config_from_mapping({"replicas": {"cpu_affinity": "0-1"}}).replicas.cores() == (0, 1)
    assert config_from_mapping({}).replicas.cores() == ()
    with pytest.raises(ConfigError, match="replicas.cpu_affinity.*runs backwards"):
        config_from_mapping({"replicas": {"cpu_affinity": "3-1"}})
    with pytest.raises(ConfigError, match="replicas.num_cpus.*whole number"):
        config_from_mapping({"replicas": {"cpu_affinity": "0-1", "num_cpus": 0.5}})


def test_pinning_moves_every_thread_of_the_process_and_what_it_starts_later():
    core = sorted(os.sched_getaffinity(0))[-1]
    code = (
        "import os, threading\n"
        "from realtime.scale.cores import pin_process\n"
        "stop = threading.Event()\n"
        "early = threading.Thread(target=stop.wait); early.start()\n"
        f"pin_process(({core},))\n"
        "late = threading.Thread(target=stop.wait); late.start()\n"
        "print(sorted({tuple(os.sched_getaffinity(int(t))) for t in os.listdir('/proc/self/task')}))\n"
        "stop.set()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[({core},)]"


@needs_ray
def test_too_few_cores_for_the_replicas_is_refused_before_ray_starts():
    from realtime.scale.launch import check_config

    config = config_from_mapping({"replicas": {"cpu_affinity": "0-2", "num_cpus": 2}})
    check_config(config, "deploy.yaml", 1)
    with pytest.raises(ConfigError, match="replicas.cpu_affinity.*3 cores for 2 replicas"):
        check_config(config, "deploy.yaml", 2)


def test_the_scale_bench_keeps_the_rest_of_its_cores_for_the_clients_and_says_when_none_is_left():
    from realtime.bench.scale import CoreSplit

    def split(cores: str, per: int) -> CoreSplit:
        return CoreSplit.of(config_from_mapping({"replicas": {"cpu_affinity": cores, "num_cpus": per}}))

    assert split("12-15", 1) == CoreSplit(first=(12,), rest=(14, 15), shared=False)
    assert split("0-7", 2) == CoreSplit(first=(0, 1), rest=(4, 5, 6, 7), shared=False)
    assert split("0,1", 1) == CoreSplit(first=(0,), rest=(0, 1), shared=True)
    assert "none left" in split("0,1", 1).describe()
