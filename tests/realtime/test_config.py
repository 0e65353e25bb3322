"""Deploy config loading: the embedded default, strict validation, one-line errors."""

from __future__ import annotations

import pytest

from realtime.config import ConfigError, DeployConfig, config_from_mapping, default_config_path, load_config


def test_embedded_default_loads_and_is_packaged():
    path = default_config_path()
    assert path.is_file()
    config = load_config()
    assert isinstance(config, DeployConfig)
    assert config.server.port == 8000


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("server: {port: 8000\n", "", "invalid YAML at line"),
        ("server:\n  prot: 1\n", "server.prot", "unknown key"),
        ("bogus: 1\n", "bogus", "unknown key"),
        ("server:\n  port: eighty\n", "server.port", "expected an integer"),
        ("server:\n  port: 70000\n", "server.port", "must be in [0, 65535]"),
        ("server:\n  shutdown_timeout_s: -1\n", "server.shutdown_timeout_s", "must be a finite number > 0"),
        ("server:\n  log_format: xml\n", "server.log_format", "must be one of"),
        ("robot:\n  enabled: 'yes'\n", "robot.enabled", "expected true or false"),
        # FlashAttention-3 was withdrawn from the robot policy (docs/models.md); the world keeps it
        ("robot:\n  attention: flash3\n", "robot.attention", "must be one of 'auto', 'flash2', 'sdpa'"),
        ("server: 3\n", "server", "must be a mapping"),
        ("- a\n- b\n", "<root>", "must be a mapping"),
    ],
)
def test_bad_config_gives_one_line_error_naming_file_field_reason(tmp_path, text, field, reason):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert field in message
    assert reason in message
    assert info.value.field_path == field


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_empty_file_means_all_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == DeployConfig()


def test_int_accepted_for_float_but_bool_is_not_a_number():
    assert config_from_mapping({"server": {"shutdown_timeout_s": 3}}).server.shutdown_timeout_s == 3.0
    with pytest.raises(ConfigError, match="expected a number"):
        config_from_mapping({"server": {"shutdown_timeout_s": True}})


def test_list_fields_become_tuples():
    config = config_from_mapping({"server": {"api_keys": ["a", "b"]}})
    assert config.server.api_keys == ("a", "b")
    with pytest.raises(ConfigError, match=r"server\.api_keys\[1\]"):
        config_from_mapping({"server": {"api_keys": ["a", 2]}})
    origins = config_from_mapping({"server": {"allowed_origins": ["https://app.example"]}}).server
    assert origins.allowed_origins == ("https://app.example",)


@pytest.mark.parametrize(
    ("section", "key", "value", "reason"),
    [
        ("runtime", "memory_budget_fraction", 0, "must be in (0, 1]"),
        ("runtime", "max_sessions", -1, "must be a finite number > 0"),
        ("robot", "coalesce_window_s", float("nan"), "must be a finite number >= 0"),
        ("world", "jpeg_quality", 101, "must be in [1, 100]"),
        ("world", "fps", 500, "must be in min_fps..max_fps"),
        ("server", "max_connections", 0, "must be a finite number > 0"),
        ("robot", "max_prompt_chars", 0, "must be a finite number > 0"),
    ],
)
def test_range_limits_name_the_field(section, key, value, reason):
    with pytest.raises(ConfigError) as info:
        config_from_mapping({section: {key: value}})
    assert info.value.field_path == f"{section}.{key}"
    assert reason in info.value.reason


@pytest.mark.parametrize(
    ("device", "value", "compiles"),
    [
        ("cpu", None, False),  # the default, auto: no compiler needed on the CPU
        ("cuda", None, True),
        ("cuda:1", None, True),
        ("cuda", False, False),
        ("cpu", True, True),
    ],
)
def test_world_compile_auto_compiles_on_cuda_only(device, value, compiles):
    world = {"device": device} | ({} if value is None else {"compile": value})
    assert config_from_mapping({"world": world}).world.compiles is compiles


def test_world_compile_takes_true_false_or_auto_only():
    with pytest.raises(ConfigError, match="world.compile"):
        config_from_mapping({"world": {"compile": "yes"}})
