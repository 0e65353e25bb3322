"""Ray is an optional extra: everything but ``realtime serve --replicas`` works without it, and the
command says how to install it; the Serve app for ``serve run`` builds from a deploy config."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys

import pytest

RAY_MODULES = {"launch", "replica", "router", "checkpoints"}  # the realtime.scale modules that import Ray
NO_RAY = "import sys; sys.modules['ray'] = None\n"  # as if the extra were not installed
needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="the ray extra is not installed"
)


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_without_ray_the_server_imports_and_replicas_say_how_to_install_it(tmp_path):
    from realtime import scale

    folder = os.path.dirname(scale.__file__)
    ray_free = sorted(n[:-3] for n in os.listdir(folder) if n.endswith(".py") and n[:-3] not in RAY_MODULES)
    imports = "".join(f"import realtime.scale.{n}\n" for n in ray_free if n != "__init__")
    done = _python(NO_RAY + "import realtime.app, realtime.server, realtime.cli\n" + imports + "print('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    for module in sorted(RAY_MODULES):
        refused = _python(NO_RAY + f"import realtime.scale.{module}")
        assert refused.returncode != 0 and "ray" in refused.stderr, module
    cli = _python(NO_RAY + "from realtime.cli import main\nsys.exit(main(['serve', '--replicas', '2']))")
    assert cli.returncode == 2
    assert "pip install -e '.[ray]'" in cli.stderr and "Traceback" not in cli.stderr
    drain = _python(NO_RAY + "from realtime.cli import main\nsys.exit(main(['drain', 'abc123']))")
    assert drain.returncode == 2 and "ray extra" in drain.stderr and "Traceback" not in drain.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--ray-address", "auto"], "--ray-address needs --replicas N"), (["--replicas", "0"], "must be >= 1")],
)
def test_replica_flags_are_checked(args, expected):
    done = _python(NO_RAY + f"from realtime.cli import main\nsys.exit(main(['serve', *{args!r}]))")
    assert done.returncode == 2 and expected in done.stderr


@needs_ray
def test_a_shared_gpu_without_a_memory_share_is_a_config_error_before_ray_starts(tmp_path):
    config = tmp_path / "deploy.yaml"
    config.write_text("replicas:\n  num_gpus: 0.5\n")
    done = _python(
        f"from realtime.cli import main\nimport sys\nsys.exit(main(['serve', '--config', {str(config)!r}, '--replicas', '2']))"
    )
    assert done.returncode == 2, done.stderr
    assert "field 'replicas.num_gpus'" in done.stderr and "runtime.memory_available_bytes" in done.stderr


@needs_ray
def test_a_taken_address_is_refused_before_ray_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--replicas", "2", "--host", "127.0.0.1", "--port", str(port)]
        done = _python(f"from realtime.cli import main\nimport sys\nsys.exit(main({args!r}))")
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
    assert "Started a local Ray instance" not in done.stderr + done.stdout


@needs_ray
def test_the_serve_run_app_builds_from_a_deploy_config():
    code = (
        "from deploy.ray.app import app\n"
        "a = app({'replicas': '3'})\n"
        "d = a._bound_deployment\n"
        "print(d.name, d.num_replicas, d.max_ongoing_requests, d.ray_actor_options['num_cpus'])\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RealtimeReplica", "3", "1000", "1.0"]
