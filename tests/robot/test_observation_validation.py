"""Observation validation in ``prepare``: every rule of ``presets.canonicalize`` refuses with a message
naming the key and the rule, and whatever ``prepare`` accepts collates and runs in a batch with
healthy observations (issue 11 defect 1: one robot's observation must never fail a shared batch).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openpi_client import msgpack_numpy

from models.policy import presets
from models.policy.interface import ObservationError
from models.policy.pi0_policy import Pi0Input, Pi0Policy
from models.policy.trivial import ZerosPolicy
from realtime.bench.examples import aloha, droid, libero
from realtime.protocols import openpi


@pytest.fixture(scope="module")
def policy() -> Pi0Policy:
    return Pi0Policy()


def _text_array(*code_points: int) -> np.ndarray:
    """A 0-d ``<U{n}`` array holding exactly these code points (numpy cannot build invalid ones)."""
    raw = np.array(code_points, dtype="<u4").tobytes()
    return np.frombuffer(raw, dtype=f"<U{len(code_points)}").reshape(())


def _image(value: float, dtype=np.float64, shape=(224, 224, 3)) -> np.ndarray:
    return np.full(shape, value, dtype)


# (observation, key named in the message, rule named in the message)
REFUSED = [
    ({**libero(), "observation/image": _image(200.0)}, "'observation/image'", "in [0, 1]"),
    ({**libero(), "observation/image": _image(-0.01, np.float32)}, "'observation/image'", "in [0, 1]"),
    ({**libero(), "observation/wrist_image": _image(np.nan)}, "'observation/wrist_image'", "finite"),
    ({**libero(), "observation/image": _image(np.inf, np.float16)}, "'observation/image'", "finite"),
    ({**libero(), "observation/image": _image(0, np.uint8, (224, 224, 4))}, "'observation/image'", "HxWx3"),
    ({**libero(), "observation/image": _image(0, np.uint8, (224, 224))}, "'observation/image'", "HxWx3"),
    ({**libero(), "observation/image": _image(0, np.uint8, (0, 224, 3))}, "'observation/image'", "sides"),
    ({**libero(), "observation/image": _image(0, np.uint8, (4097, 8, 3))}, "'observation/image'", "sides"),
    ({**libero(), "observation/image": _image(0, np.int32)}, "'observation/image'", "uint8 or float"),
    ({**libero(), "observation/image": [[[0, 0, 0]]]}, "'observation/image'", "ndarray"),
    ({**libero(), "observation/state": np.zeros((8, 8))}, "'observation/state'", "shape [8]"),
    ({**libero(), "observation/state": np.zeros(7)}, "'observation/state'", "shape [8]"),
    ({**libero(), "observation/state": np.float32(1.0)}, "'observation/state'", "shape [8]"),
    ({**libero(), "observation/state": [[1.0] * 4, [1.0] * 3]}, "'observation/state'", "numeric array"),
    ({**libero(), "observation/state": np.array([1, "a"], dtype=object)}, "'observation/state'", "numeric"),
    ({**libero(), "observation/state": ["a"] * 8}, "'observation/state'", "numeric"),
    ({**libero(), "observation/state": [2**70] * 8}, "'observation/state'", "numeric"),
    ({**libero(), "observation/state": np.full(8, np.inf)}, "'observation/state'", "finite"),
    ({**libero(), "observation/state": np.full(8, 1e300)}, "'observation/state'", "finite"),
    ({**libero(), "observation/state": np.full(8, np.inf, np.float16)}, "'observation/state'", "finite"),
    ({**libero(), "observation/state": np.full(8, np.nan, np.float16)}, "'observation/state'", "finite"),
    ({**droid(), "observation/joint_position": np.zeros(6)}, "'observation/joint_position'", "shape [7]"),
    ({**droid(), "observation/gripper_position": np.zeros(2)}, "'observation/gripper_position'", "shape [1]"),
    ({**aloha(), "state": np.zeros(13)}, "'state'", "shape [14]"),
    ({**aloha(), "images": {1: np.zeros((3, 8, 8), np.uint8)}}, "'images'", "camera names"),
    (
        {"observation.images.base_0_rgb": _image(0, np.uint8), "state": np.zeros(33)},
        "'state'",
        "1..32 values",
    ),
    ({**libero(), "prompt": "x" * 2001}, "prompt", "at most 2000 characters"),
    ({**libero(), "prompt": b"x" * 8001}, "prompt", "at most 2000 characters"),
    ({**libero(), "prompt": np.array("x" * 2001)}, "prompt", "at most 2000 characters"),
    ({**libero(), "prompt": "pick \ud800"}, "prompt", "valid Unicode"),
    ({**libero(), "prompt": _text_array(0xD800)}, "prompt", "valid Unicode"),
    ({**libero(), "prompt": _text_array(0x61, 0x110000)}, "prompt", "U+10FFFF"),
    ({**libero(), "prompt": np.array(["a", "b"])}, "prompt", "must be a string"),
    ({**libero(), "prompt": None}, "prompt", "must be a string"),
    ({**libero(), "rtc": {1: 2, "x": 3}}, "'rtc'", "named options"),
    ({**libero(), 7: "x"}, "observation keys", "strings"),
]


@pytest.mark.parametrize(("obs", "key", "rule"), REFUSED)
def test_each_silent_accept_case_is_refused_naming_key_and_rule(policy, obs, key, rule):
    with pytest.raises(ObservationError) as caught:
        policy.prepare(obs)
    assert key in str(caught.value) and rule in str(caught.value), str(caught.value)


def test_the_trivial_policy_validates_the_same_way():
    zeros = ZerosPolicy()
    for obs, key, rule in REFUSED:
        if "rtc" in obs:  # real-time chunking is pi0-tiny's own option
            continue
        with pytest.raises(ObservationError) as caught:
            zeros.prepare(obs)
        assert key in str(caught.value) and rule in str(caught.value), str(caught.value)


ACCEPTED = [
    {**libero(), "observation/image": _image(1.0), "observation/wrist_image": _image(0.0, np.float16)},
    {**libero(), "observation/image": _image(0.5, np.float32, (3, 224, 224))},  # CHW float (LeRobot)
    {**libero(), "observation/state": [0.0, 1, 2, 3, 4, 5, 6, True]},  # a list of numbers
    droid(),  # gripper_position is a 0-d float64 scalar
    {**droid(), "observation/gripper_position": np.array([0.5])},
    {**libero(), "prompt": "x" * 2000},
    {**libero(), "prompt": b"\xffpick"},  # invalid UTF-8 bytes are replaced
    {**libero(), "prompt": np.array("put the bowl")},
    {**libero(), "prompt": np.array(b"put the bowl")},
    {"observation.images.base_0_rgb": _image(0, np.uint8, (1, 4096, 3)), "state": np.zeros(1)},
]


def test_observations_within_the_rules_are_accepted_collated_and_run(policy):
    items = [policy.prepare(obs) for obs in ACCEPTED]
    chunks = policy.infer(items, [None] * len(items))
    assert all(
        c.shape == (50, item.action_dim) and np.isfinite(c).all()
        for c, item in zip(chunks, items, strict=True)
    )
    assert {c.shape[1] for c in chunks} == {7, 8, 32}  # LIBERO, DROID and pi0-layout robots


def test_the_prompt_bound_is_a_constructor_argument():
    short = Pi0Policy(max_prompt_chars=10)
    assert short.prepare({**libero(), "prompt": "x" * 10}).observation.prompt == "x" * 10
    with pytest.raises(ObservationError, match="at most 10 characters"):
        short.prepare({**libero(), "prompt": "x" * 11})
    assert presets.MAX_PROMPT_CHARS == 2000


def test_a_poisoned_prompt_cannot_reach_a_batch(policy):
    """Issue 11's reproducer: a 0-d ``<U1`` prompt holding U+D800 passed ``prepare`` and then
    ``collate`` raised for the whole batch. Now ``prepare`` refuses it, so the healthy robots'
    batch is all that gets collated; built past ``prepare``, the same item still breaks collate
    (the check is what protects the batch)."""
    poisoned = {**libero(9), "prompt": _text_array(0xD800)}
    with pytest.raises(ObservationError, match="prompt"):
        policy.prepare(poisoned)
    healthy = [policy.prepare(libero(i)) for i in range(4)]
    assert len(policy.infer(healthy, [None] * 4)) == 4
    bypass = presets.Canonical(healthy[0].observation.images, np.zeros(8, np.float32), "\ud800")
    with pytest.raises(UnicodeEncodeError):
        policy.collate([*healthy, Pi0Input(bypass, None, 7)])


@pytest.mark.parametrize(
    "obs",
    [{**libero(), "observation/image": _image(200.0)}, {**libero(), "observation/state": np.zeros((8, 8))}],
)
def test_wire_decoded_observations_are_refused_by_prepare(policy, obs):
    """Through openpi-client's own encoder and this server's codec: the codec passes these on
    (they are well-formed msgpack-numpy), ``prepare`` refuses them (``invalid_observation``)."""
    conn = openpi.ServerConnection()
    conn.start({})
    cmd = conn.receive(msgpack_numpy.packb(obs))
    assert isinstance(cmd, openpi.Infer)
    with pytest.raises(ObservationError):
        policy.prepare(cmd.observation)


# --------------------------------------------------------------------------- fuzz

_DTYPES = st.sampled_from(["|u1", "<f8", "<f4", "<f2", ">f4", "<i4", "|b1", "<U3", "|S2", "O"])
_SHAPES = st.lists(st.sampled_from([0, 1, 3, 8, 14, 32, 33]), min_size=0, max_size=3).map(tuple)
_FLOATS = st.sampled_from([0.0, 0.5, 1.0, -0.5, 2.0, 200.0, 1e300, np.nan, np.inf, -np.inf])


@st.composite
def _arrays(draw) -> np.ndarray:
    dtype, shape = np.dtype(draw(_DTYPES)), draw(_SHAPES)
    if dtype.kind == "O":
        return np.array([1, "a", None], dtype=object)
    if dtype.kind in "US":
        return np.full(shape, "ab", dtype)
    value = draw(_FLOATS) if dtype.kind == "f" else draw(st.integers(0, 255))
    with np.errstate(over="ignore", invalid="ignore"):
        return np.full(shape, value).astype(dtype)


_LISTS = st.recursive(
    st.one_of(st.floats(allow_nan=True), st.integers(-(2**70), 2**70), st.text(max_size=2), st.none()),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=12,
)
_VALUES = st.one_of(_arrays(), _LISTS, st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_ODD_CODE_POINTS = st.sampled_from([0x61, 0xD800, 0xDBFF, 0xDC00, 0xDFFF, 0x10FFFF, 0x110000, 0xFFFFFFFF])
_CODE_POINTS = st.lists(st.one_of(_ODD_CODE_POINTS, st.integers(0, 0x10FFFF)), min_size=1, max_size=6)
_PROMPTS = st.one_of(
    _CODE_POINTS.map(lambda cps: "".join(chr(min(c, 0x10FFFF)) for c in cps)),  # surrogates included
    _CODE_POINTS.map(lambda cps: _text_array(*cps)),
    _CODE_POINTS.map(lambda cps: _text_array(*cps)),  # twice: numpy text is the rarer, riskier case
    st.binary(max_size=8),
    st.integers(0, 3).map(lambda n: "x" * (1998 + n)),
    _VALUES,
)


@st.composite
def _small_images(draw) -> np.ndarray:
    shape = draw(st.sampled_from([(8, 8, 3), (3, 8, 8), (2, 8, 3), (3, 8, 3)]))
    if draw(st.booleans()):
        return np.full(shape, draw(st.integers(0, 255)), np.uint8)
    with np.errstate(over="ignore"):
        return np.full(shape, draw(_FLOATS)).astype(draw(st.sampled_from(["<f4", ">f8", "<f2"])))


_IMAGES = st.one_of(_VALUES, _small_images())
_STATES = st.one_of(
    _VALUES,
    st.tuples(st.integers(0, 33), _FLOATS).map(lambda t: [t[1]] * t[0]),
    st.tuples(st.sampled_from([(), (1,), (7,), (8,), (14,), (8, 1)]), _FLOATS).map(lambda t: np.full(*t)),
)
_BASES = st.sampled_from([libero, droid, aloha])
_RTC_NAMES = ["control_hz", "executed_steps", "inference_delay", "schedule", "max_guidance_weight"]
_RTC_VALUES = st.one_of(
    _VALUES,
    st.sampled_from(
        ["exp", "ones", "linear", 0, 1, 50, 10**6, -1, 0.5, np.nan, True, np.array(["exp", "a"])]
    ),
    st.integers(0, 60),
)
_RTC_OPTIONS = st.dictionaries(st.sampled_from(_RTC_NAMES), _RTC_VALUES, max_size=3)


def _set(obs: dict, key: str, value) -> None:
    if key.startswith("images/"):
        obs["images"] = {**obs["images"], key.removeprefix("images/"): value}
    else:
        obs[key] = value


@st.composite
def _observations(draw) -> dict:
    """A robot's example observation with one kind of field made odd (and maybe a second one)."""
    obs = draw(_BASES)(draw(st.integers(0, 3)))
    cameras = [k for k in obs if "image" in k] + [f"images/{c}" for c in obs.get("images", {})]
    states = [k for k in obs if k not in cameras and k not in ("images", "prompt")]
    fields = {"prompt": (["prompt"], _PROMPTS), "camera": (cameras, _IMAGES), "state": (states, _STATES)}
    for kind in draw(st.lists(st.sampled_from([*fields, "rtc"]), min_size=1, max_size=2, unique=True)):
        if kind == "rtc":
            obs["rtc"] = draw(st.one_of(st.booleans(), _VALUES, _RTC_OPTIONS))
        else:
            keys, values = fields[kind]
            _set(obs, draw(st.sampled_from(keys)), draw(values))
    return obs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obs=_observations())
def test_fuzzed_prepare_raises_only_observation_error_and_accepted_ones_run_in_a_batch(policy, obs):
    try:
        item = policy.prepare(obs)
    except ObservationError as exc:
        assert str(exc) and "Traceback" not in str(exc)
        return
    state = policy.new_state()  # a previous chunk, so that accepted rtc options guide this one
    state.commit(np.zeros((50, item.action_dim), np.float32), latency_s=0.02, now=0.0)
    batch = [policy.prepare(libero(1)), item]
    chunks = policy.infer(batch, [None, state.snapshot(item, now=0.1)])
    assert [c.shape for c in chunks] == [(50, 7), (50, item.action_dim)] and all(
        np.isfinite(c).all() for c in chunks
    )
