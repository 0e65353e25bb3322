"""The robot page (``clients/web/robot.html``) in headless Chromium against the real server over
loopback with the embedded pi0-tiny policy (deterministic: an observation always maps to the same
chunk).

The page's msgpack writes openpi's bytes exactly (compared with ``openpi_client.msgpack_numpy``
both ways); the page connects, reads the handshake, sends an observation and plots the action
chunk; the same observation gives the same chunk and moving a state slider changes it; an
over-long prompt renders the server's ``invalid_observation`` text frame readably and the session
goes on; the console stays clean. One server for the module.
"""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio
from openpi_client import msgpack_numpy

from realtime.config import config_from_mapping
from tests.browser.conftest import open_page
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]

_ENCODE = """async () => {
  const mp = await import("/demo/msgpack.js");
  const obs = {"observation/image": mp.NdArray.uint8(new Uint8Array([0, 127, 255, 1, 2, 3]), [1, 2, 3]),
    "observation/state": mp.NdArray.float32([0.5, -1, 2.25], [3]), prompt: "pick", n: 300, neg: -40000,
    f: 0.1, nested: {ok: true, none: null, list: [1, "two"]}};
  return Array.from(mp.encode(obs));
}"""
_DECODE = """async (bytes) => {
  const mp = await import("/demo/msgpack.js"), v = mp.decode(new Uint8Array(bytes));
  return {dtype: v.actions.dtype, shape: v.actions.shape, data: Array.from(v.actions.data), t: v.timing};
}"""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def base():
    config = config_from_mapping(
        {"world": {"enabled": False}, "robot": {"enabled": True, "policy": "pi0-tiny", "torch_threads": 1}}
    )
    async with serve_in_process(config) as (url, _):
        yield url


async def test_page_msgpack_is_byte_for_byte_openpis(browser, base, tmp_path):
    expected = {
        "observation/image": np.array([0, 127, 255, 1, 2, 3], np.uint8).reshape(1, 2, 3),
        "observation/state": np.array([0.5, -1, 2.25], np.float32),
        "prompt": "pick",
        "n": 300,
        "neg": -40000,
        "f": 0.1,
        "nested": {"ok": True, "none": None, "list": [1, "two"]},
    }
    reply = {"actions": np.arange(6, dtype=np.float32).reshape(2, 3), "timing": {"infer_ms": np.float64(1.5)}}
    async with open_page(browser, tmp_path / "msgpack.png") as (page, console):
        await page.goto(f"{base}/demo/status")  # any page of the server: same-origin module import
        written = bytes(await page.evaluate(_ENCODE))
        read = await page.evaluate(_DECODE, list(msgpack_numpy.packb(reply)))
    assert written == msgpack_numpy.packb(expected)
    assert read == {"dtype": "<f4", "shape": [2, 3], "data": [0, 1, 2, 3, 4, 5], "t": {"infer_ms": 1.5}}
    assert console.errors == []


async def _reply_after(page, action) -> dict:
    before = await page.evaluate("window.robotStats.replies")
    await action()
    await page.wait_for_function(f"window.robotStats?.replies > {before}", timeout=30_000)
    return await page.evaluate("window.robotStats")


async def test_robot_page_plots_chunks_that_follow_the_state_and_shows_errors(browser, base, tmp_path):
    async with open_page(browser, tmp_path / "robot-page.png") as (page, console):
        await page.goto(f"{base}/demo/robot")
        await page.wait_for_function("window.robotStats?.replies >= 1", timeout=60_000)
        first = await page.evaluate("window.robotStats")
        again = await _reply_after(page, lambda: page.click("#send"))
        slider = page.locator("#sliders input").first
        moved = await _reply_after(page, lambda: slider.fill("0.9"))  # fill sets the value, fires change

        await page.fill("#prompt", "x" * 2500)  # over robot.max_prompt_chars (2000)
        await page.click("#send")
        await page.wait_for_function("window.robotStats?.errors.length > 0", timeout=30_000)
        error_text = await page.locator("#errors li").first.inner_text()
        await page.fill("#prompt", "pick up the red block")
        after_error = await _reply_after(page, lambda: page.click("#send"))
        plotted = await page.evaluate(
            "() => { const d = document.getElementById('plot').getContext('2d').getImageData(0, 0, 960, 420).data;"
            " let lit = 0; for (let i = 0; i < d.length; i += 4) if (d[i] + d[i+1] + d[i+2] > 300) lit++; return lit; }"
        )
        timing = await page.locator("#timing").inner_text()

    meta = first["metadata"]
    assert first["state"] == "connected" and meta["protocol"] == "openpi"
    assert (
        first["actionsShape"][0] == meta["action_horizon"]
        and len(first["lastActions"]) == meta["action_horizon"]
    )
    assert first["serverTiming"]["infer_ms"] > 0 and first["policyTiming"]["batch_size"] == 1
    assert again["lastActions"] == first["lastActions"]  # deterministic policy: same observation, same chunk
    assert moved["lastActions"] != first["lastActions"]  # the state slider reaches the policy
    assert "invalid_observation" in error_text and "prompt" in error_text, error_text
    assert after_error["state"] == "connected" and after_error["lastActions"] == moved["lastActions"]
    assert plotted > 500  # the per-dimension lines are drawn
    assert "server infer" in timing and "batch 1" in timing
    assert console.errors == [], console.errors
    assert (tmp_path / "robot-page.png").stat().st_size > 0
