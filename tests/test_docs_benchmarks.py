"""docs/benchmarks.md is a front door that stays true (issue 27).

- Every JSON line inside a fenced block of ``docs/benchmarks*.md`` parses, and no fenced line is
  abbreviated with ``...``.
- Every command of the front table, and every ``bench`` line of the GPU scripts, names an existing
  ``realtime bench`` scenario and only flags that scenario's parser has, or a committed script.
- The front table's goals are ``realtime/bench/goals.py``'s (what the benches print), and every
  goal there is on the page.
- Every ``##`` / ``###`` heading of the log is listed on the front page (other pages cite the
  log's sections by name).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from realtime.bench import SCENARIOS, run_scenario
from realtime.bench.goals import GOALS

ROOT = Path(__file__).resolve().parents[1]
FRONT = ROOT / "docs" / "benchmarks.md"
LOG = ROOT / "docs" / "benchmarks-log.md"
GPU_SCRIPTS = sorted((ROOT / "realtime" / "bench" / "gpu").glob("*.sh"))


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every line inside a fenced code block."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            out.append((number, line))
    return out


def json_problems(text: str) -> list[str]:
    """Fenced lines holding a JSON object that does not parse, or abbreviated with ``...``."""
    problems = []
    for number, line in fenced_lines(text):
        if "..." in line:
            problems.append(f"{number}: abbreviated: {line[:80]}")
        elif '{"' in line:
            try:
                json.JSONDecoder().raw_decode(line[line.index("{") :])
            except json.JSONDecodeError as exc:
                problems.append(f"{number}: {exc}: {line[:80]}")
    return problems


@pytest.mark.parametrize("path", sorted((ROOT / "docs").glob("benchmarks*.md")), ids=lambda p: p.name)
def test_every_fenced_json_line_parses(path):
    assert not json_problems(path.read_text(encoding="utf-8"))


@functools.cache
def scenario_help(scenario: str) -> str:
    """What ``realtime bench <scenario> --help`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        run_scenario(scenario, ["--help"])
    return out.getvalue()


def scenario_flags(scenario: str) -> frozenset[str]:
    """The long options the scenario's help lists."""
    return frozenset(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", scenario_help(scenario)))


def scenario_choices(scenario: str) -> dict[str, set[str]]:
    """The values each option with ``choices`` accepts, as its help shows them (``--x {a,b}``)."""
    found = re.findall(r"(--[a-z0-9-]+) \[?\{([^}]+)\}", scenario_help(scenario))
    return {flag: set(values.split(",")) for flag, values in found}


def command_problems(command: str) -> list[str]:
    """What in ``command`` names no scenario, flag or committed script."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # environment assignments (quoted: spaces)
        words.pop(0)
    if words[:2] == ["realtime", "bench"] or words[:1] == ["bench"]:  # ``bench``: the scripts' function
        words = words[2:] if words[0] == "realtime" else words[1:]
        if not words or words[0] not in SCENARIOS:
            return [f"no scenario: {command}"]
        scenario, args = words[0], words[1:]
        flags = {w.split("=")[0] for w in args if w.startswith("--")}
        problems = [f"{scenario} has no {flag}" for flag in sorted(flags - scenario_flags(scenario))]
        choices, flag = scenario_choices(scenario), None
        for word in args:
            if word.startswith("--"):
                flag, _, value = word.partition("=")
                word = value
            if word and "$" not in word and flag in choices and word not in choices[flag]:  # $: the shell's
                problems.append(f"{scenario} {flag} takes none of {word!r}")
        return problems
    if words and words[0] in ("bash", "python", "python3"):
        words = words[1:]
    if not words or not (ROOT / words[0]).is_file() or not _tracked(words[0]):
        return [f"neither a realtime bench command nor a committed script: {command}"]
    return []


def _tracked(path: str) -> bool:
    done = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=ROOT, capture_output=True)
    return done.returncode == 0


def front_table() -> list[dict[str, str]]:
    """The rows of the first table under "## Current figures", by column name."""
    text = FRONT.read_text(encoding="utf-8").split("## Current figures", 1)[1]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    table = []
    for line in rows:
        if not line.startswith("| ") and table:
            break
        table.append([cell.strip() for cell in line.strip("|").split(" | ")])
    header, _, *body = table
    return [dict(zip(header, row, strict=True)) for row in body]


def _code(cell: str) -> str:
    match = re.search(r"`([^`]+)`", cell)
    assert match, f"no `code` in {cell!r}"
    return match.group(1)


def test_the_front_table_has_every_kind():
    kinds = {row["kind"] for row in front_table()}
    assert kinds == set(SCENARIOS), kinds ^ set(SCENARIOS)


def test_every_front_table_command_runs_as_written():
    problems = [p for row in front_table() for p in command_problems(_code(row["command"]))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: p.name)
def test_every_bench_line_of_the_gpu_scripts_runs_as_written(script):
    lines = [
        line.split("2>&1")[0].strip()
        for line in script.read_text().replace("\\\n", " ").splitlines()  # continuation lines joined
        if line.strip().startswith("bench ")  # at any indent: a loop's body too
    ]
    # every script runs benches, but env.sh and vllm_env.sh (sourced by them), ray_bundle.sh,
    # vllm_bundle.sh, voice_bundle.sh, whisper_tokenizer_wheel.sh, device_wheels.sh and their bundle_lib.sh (build
    # what the device calls carry, on the dev machine)
    # and training runs of a model module
    helpers = (
        "env.sh",
        "vllm_env.sh",
        "ray_bundle.sh",
        "vllm_bundle.sh",
        "voice_bundle.sh",
        "bundle_lib.sh",
        "whisper_tokenizer_wheel.sh",
        "device_wheels.sh",
    )
    assert lines or script.name in helpers or "python3 -m models." in script.read_text()
    problems = [p for line in lines for p in command_problems(line)]
    problems += [
        f"no {t}" for t in re.findall(r"tests/\S+\.py", script.read_text()) if not (ROOT / t).is_file()
    ]
    assert not problems, "\n".join(problems)


def test_the_gpu_scripts_the_front_page_names_are_committed():
    names = set(re.findall(r"`(\w+\.sh)`", FRONT.read_text(encoding="utf-8")))
    assert names and names <= {p.name for p in GPU_SCRIPTS}
    assert all(_tracked(str(p.relative_to(ROOT))) for p in GPU_SCRIPTS)


def _goal_of(kind: str, key: str) -> str:
    goals = GOALS.get(kind, {})
    goal = goals.get(key) or goals.get(key.removesuffix("_vllm"))
    return str(goal) if goal else "—"


def test_the_front_table_goals_are_the_benches_goals():
    wrong = [
        f"{row['kind']} {_code(row['figure'])}: {row['goal']!r}, goals.py says {_goal_of(row['kind'], _code(row['figure']))!r}"
        for row in front_table()
        if row["goal"] != _goal_of(row["kind"], _code(row["figure"]))
    ]
    assert not wrong, "\n".join(wrong)


def test_every_goal_is_on_the_front_page():
    text = FRONT.read_text(encoding="utf-8")
    shown = {(row["kind"], _code(row["figure"])) for row in front_table()}
    missing = [
        f"{kind} {key} {goal}"
        for kind, goals in GOALS.items()
        for key, goal in goals.items()
        if (kind, key) not in shown and f"{kind} `{key}` {goal}" not in text
    ]
    assert not missing, "\n".join(missing)


def test_every_log_section_is_listed_on_the_front_page():
    front = FRONT.read_text(encoding="utf-8")
    headings = re.findall(r"^#{2,3} (.+)$", LOG.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert headings
    assert not [h for h in headings if h not in front]


def test_the_checkers_catch_what_they_are_for():
    bad = '```\n{"fps_1": 28.8, ...}\n{"a": 1\nok {"b": [1, 2]} tail\n```\n{"outside": ...}\n'
    assert [p.split(":")[0] for p in json_problems(bad)] == ["2", "3"]
    assert command_problems("realtime bench engine --sessions 2") == []
    assert command_problems("OMP_NUM_THREADS=1 realtime bench engine --no-such-flag 1") == [
        "engine has no --no-such-flag"
    ]
    assert command_problems("realtime bench nosuch") == ["no scenario: realtime bench nosuch"]
    assert command_problems("realtime bench engine --sessions 2 --rate auto") == []
    assert command_problems("realtime bench world --model nosuch --dtype=bfloat16") == [
        "world --model takes none of 'nosuch'"
    ]
    assert command_problems("bash realtime/bench/gpu/robot.sh") == []
    assert command_problems("bash .gl/s8.sh a")
