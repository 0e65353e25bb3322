"""The world page's queue position, against the real server over loopback (world-tiny) with one
session of capacity and ``runtime.over_capacity: queue``.

A first page plays and steers; a second page waits in the admission queue: the server sends
``session.queued`` with its position and the page shows it (longer than ``server.start_timeout_s``,
which does not apply while a socket waits in the queue). When the first page goes away, the second
is admitted and plays. ``/v1/status`` then reports the world key latency (an accepted control event
to the first chunk that applied it leaving the server). Consoles stay clean.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from realtime.config import config_from_mapping
from tests.browser.conftest import open_page
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(150), pytest.mark.asyncio(loop_scope="session")]

START_TIMEOUT_S = 1.0


async def test_a_queued_world_page_shows_its_position_then_plays(browser, tmp_path):
    config = config_from_mapping(
        {
            "robot": {"enabled": False},
            "runtime": {"memory_available_bytes": 2**30, "max_sessions": 1, "over_capacity": "queue"},
            "server": {"start_timeout_s": START_TIMEOUT_S},
            "world": {"enabled": True, "torch_threads": 1},
        }
    )
    async with (
        serve_in_process(config) as (base, _),
        open_page(browser, tmp_path / "world-first.png") as (first, first_log),
        open_page(browser, tmp_path / "world-queued.png") as (second, second_log),
    ):
        await first.goto(f"{base}/demo/world?seed=1")
        await first.wait_for_function("window.worldStats?.framesShown > 4", timeout=60_000)
        await first.click("#screen")
        await first.keyboard.down("a")  # a control event: the server times it to its chunk
        await first.wait_for_function("window.worldStats?.keyToPhotonMs.length >= 1", timeout=20_000)
        await first.keyboard.up("a")

        await second.goto(f"{base}/demo/world?seed=2")
        await second.wait_for_function("window.worldStats?.queuePosition === 1", timeout=20_000)
        await asyncio.sleep(2 * START_TIMEOUT_S)  # queued past the start deadline: still waiting
        queued = await second.evaluate("window.worldStats")
        said = await second.locator("#status").inner_text()
        await second.screenshot(path=str(tmp_path / "world-queued-waiting.png"))

        await first.goto("about:blank")  # the first socket goes: its slot passes to the queue
        await second.wait_for_function(
            "window.worldStats.state === 'playing' && window.worldStats.framesShown > 4", timeout=30_000
        )
        playing = await second.evaluate("window.worldStats")
        async with httpx.AsyncClient(base_url=base) as client:
            status = (await client.get("/v1/status")).json()

    assert queued["state"] == "queued" and queued["errors"] == [], queued
    assert "number 1 in the queue" in said, said
    assert playing["errors"] == [] and playing["sessionId"], playing
    world = next(k for k in status["latencies"] if k["kind"] == "world")
    assert world["name"] == "event_to_chunk" and world["ms"]["count"] >= 1 and world["ms"]["mean"] > 0, world
    assert first_log.errors == [] and second_log.errors == [], (first_log.errors, second_log.errors)
