"""The landing and status pages and the routes behind them, against the real server over loopback
with the robot kind (pi0-tiny) and an API key configured; one server for the module.

HTTP: ``GET /`` redirects browsers to ``/demo/`` (query kept) and tells other clients where to go;
demo files are served with their types and need the key like every route; ``/v1/status`` reports
the robot's sessions, capacity and engine figures. Browser: ``/?api_key=`` lands on the landing
page, which lists the served model and marks kinds that are off; the status page shows the robot
session the robot page holds open, with its stage's batch sizes and latencies and the robot's key latency
(request), and refreshes; a
page for a kind that is off says so readably; consoles stay clean.
"""

from __future__ import annotations

import httpx
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily

from realtime.config import config_from_mapping
from realtime.status import bucket_quantile, key_latencies, server_status
from tests.browser.conftest import open_page
from tests.serving import serve_in_process

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]
KEY = "demo-key"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def base():
    config = config_from_mapping(
        {
            "world": {"enabled": False},
            "robot": {"enabled": True, "policy": "pi0-tiny", "torch_threads": 1},
            "server": {"api_keys": [KEY]},
        }
    )
    async with serve_in_process(config) as (url, _):
        yield url


async def test_bucket_quantile_interpolates_like_histogram_quantile():
    buckets = [(1.0, 0.0), (2.0, 4.0), (4.0, 8.0), (float("inf"), 8.0)]
    assert bucket_quantile(0.5, buckets) == 2.0 and bucket_quantile(0.75, buckets) == 3.0
    assert (
        bucket_quantile(0.5, [(1.0, 5.0), (2.0, 5.0), (float("inf"), 5.0)]) == 1.0
    )  # first bucket: its bound
    assert bucket_quantile(0.99, [(1.0, 0.0), (2.0, 1.0), (float("inf"), 2.0)]) == 2.0  # +Inf: highest bound


async def test_key_latencies_read_each_kinds_histogram_and_counters():
    registry = CollectorRegistry()
    ttfa = Histogram("voice_time_to_first_audio_seconds", "", buckets=(0.25, 0.5, 1.0), registry=registry)
    for seconds in (0.3, 0.4, 0.8):
        ttfa.observe(seconds)

    class Clock:  # the duplex kind's scrape-time counters
        def collect(self):
            for name, value in (("duplex_steps", 100), ("duplex_late_steps", 3), ("duplex_missed_steps", 1)):
                family = CounterMetricFamily(name, "")
                family.add_metric([], value)
                yield family

    registry.register(Clock())
    voice, duplex = key_latencies(
        {f.name: list(f.samples) for f in registry.collect()}, ("duplex", "voice", "echo")
    )
    assert voice.kind == "voice" and voice.ms.count == 3 and voice.ms.mean == 500.0 and voice.counts == {}
    assert 250 < voice.ms.p50 <= 500 and voice.ms.p99 <= 1000
    assert duplex.ms is None  # no step yet
    assert duplex.counts == {"steps": 100, "late_steps": 3, "missed_steps": 1, "lateness_p99_ms": 0}
    document = server_status(
        ready=True,
        draining=False,
        version="x",
        open_connections=0,
        max_connections=1,
        kinds=(),
        registry=registry,
    )
    assert document["latencies"] == []  # only enabled kinds have rows


async def test_routes_redirect_serve_files_and_need_the_key(base):
    async with httpx.AsyncClient(base_url=base) as client:
        html = {"Accept": "text/html,application/xhtml+xml"}
        redirect = await client.get("/", params={"api_key": KEY}, headers=html)
        assert redirect.status_code == 307 and redirect.headers["location"] == f"/demo/?api_key={KEY}"
        other = await client.get("/", params={"api_key": KEY})  # curl, a script: what is here
        assert other.status_code == 200 and other.headers["content-type"].startswith("text/plain")
        ws_base = base.replace("http://", "ws://")
        assert f"robot   {ws_base}/, {ws_base}/v1/realtime/robot/openpi" in other.text
        for route in ("/demo/", "/v1/models", "/v1/status", "/healthz", "/readyz", "/metrics", "docs/"):
            assert route in other.text, route
        assert (await client.get("/demo/", headers=html)).status_code == 401  # the key rule holds
        for path, kind in (
            ("/demo/", "text/html"),
            ("/demo/robot", "text/html"),
            ("/demo/msgpack.js", "text/javascript"),
        ):
            got = await client.get(path, params={"api_key": KEY})
            assert got.status_code == 200 and got.headers["content-type"].startswith(kind), path
        assert (await client.get("/demo/nothing.js", params={"api_key": KEY})).status_code == 404
        assert (await client.get("/v1/status")).status_code == 401
        status = (await client.get("/v1/status", headers={"Authorization": f"Bearer {KEY}"})).json()
    robot = status["kinds"][0]
    assert status["ready"] is True and robot["kind"] == "robot" and robot["capacity"] >= 1
    assert robot["free"] == robot["capacity"] - robot["occupied"]
    assert "robot" in status["connections"]["websockets"]


async def test_landing_and_status_pages_show_what_the_server_does(browser, base, tmp_path):
    async with open_page(browser, tmp_path / "landing.png") as (landing, landing_log):
        await landing.goto(f"{base}/?api_key={KEY}")  # a browser at / lands on /demo/
        await landing.wait_for_function("window.demoReady === true", timeout=30_000)
        landed_at = landing.url
        pages = await landing.locator("#pages").inner_text()
        models = await landing.locator("#models").inner_text()
        await landing.click("text=Voice")  # links carry the key
        await landing.click("#start")
        await landing.wait_for_function("window.voiceStats?.errors.length > 0", timeout=30_000)
        off = await landing.locator("#errors").inner_text()

    async with open_page(browser, tmp_path / "status-page.png") as (page, log):
        robot = await page.context.new_page()
        await robot.goto(f"{base}/demo/robot?api_key={KEY}")  # holds one robot session open
        await robot.wait_for_function("window.robotStats?.replies >= 1", timeout=60_000)
        await page.goto(f"{base}/demo/status?api_key={KEY}&every_ms=300")
        await page.wait_for_function(
            "window.statusStats.last && window.statusStats.last.kinds[0].occupied === 1", timeout=30_000
        )
        refreshes = await page.evaluate("window.statusStats.refreshes")
        await page.wait_for_function(f"window.statusStats?.refreshes > {refreshes + 1}", timeout=10_000)
        kinds = await page.locator("#kinds").inner_text()
        stages = await page.locator("#stages").inner_text()
        latencies = await page.locator("#latencies").inner_text()
        stats = await page.evaluate("window.statusStats")

    assert landed_at.endswith(f"/demo/?api_key={KEY}")
    assert "Robot" in pages and "Voice" in pages and "not enabled" in pages
    assert "pi0-tiny" in models and "/v1/realtime/robot/openpi" in models
    assert "voice kind is not enabled" in off, off
    assert "robot" in kinds and "active 1" in kinds
    stage = next(s for s in stats["last"]["stages"] if s["stage"] == "robot-policy")
    assert stage["batch_size"]["p50"] == 1 and stage["item_ms"]["mean"] > 0 and stage["slots_open"] == 1
    assert "robot-policy" in stages and stats["errors"] == []
    (robot,) = stats["last"]["latencies"]  # the one enabled kind's key latency: its request
    assert robot["kind"] == "robot" and robot["name"] == "request" and robot["ms"]["count"] >= 1
    assert robot["ms"]["p50"] <= robot["ms"]["p95"] <= robot["ms"]["p99"]
    assert "robot" in latencies and "request: observation submitted" in latencies
    assert landing_log.errors == [] and log.errors == [], (landing_log.errors, log.errors)
