"""The duplex page (``clients/web/duplex.html``) in headless Chromium against the real duplex kind
over loopback: the embedded ``duplex-test`` model with scripted turn-taking (``tests/duplex/
kind_server.py``: the real stage runs, the script decides when it speaks and names each frame's
text piece ``w<step>``), so a test knows what the transcript must be.

The page streams the fake microphone all along; the model's audio deltas arrive and play, the
speak/listen indicator follows ``response.speak`` / ``response.listen``, ``playback.ack`` goes out
with what was played and the server's history holds exactly that (asserted on the session's own
ledger). "Drop connection" closes the socket; the page resumes with its token and last seq, the
server replays what it missed, and every event is applied once: each response's transcript on the
page equals the server's final transcript and the step numbers never repeat. The status page shows
the duplex key-latency row; "stop" releases the session at once. Consoles stay clean; screenshots
are saved.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.browser.conftest import open_page
from tests.duplex.kind_server import duplex_server

pytest.importorskip("playwright.async_api", reason="Python Playwright is not installed")
pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]

TURN_FRAMES = 10  # the scripted model speaks 10 frames (0.8 s), then listens 10


def turns(step: int) -> bool:
    return (step // TURN_FRAMES) % 2 == 0


async def test_duplex_page_plays_acks_and_resumes_after_a_drop(browser, monkeypatch, tmp_path):
    # barge-in off (no RMS reaches 1.0): the fake microphone's question must not cut the script
    async with duplex_server(monkeypatch, speak=turns, barge_in_rms=1.0) as (ws_base, service, _):
        base = ws_base.replace("ws://", "http://")
        async with open_page(browser, tmp_path / "duplex-page.png") as (page, console):
            await page.goto(f"{base}/demo/duplex?resume_delay_ms=1000")
            await page.click("#start")  # a user gesture: the AudioContext may start
            await page.wait_for_function("window.duplexStats?.state === 'live'", timeout=30_000)
            await page.wait_for_function(
                "window.duplexStats.acknowledged.some((a) => a.committed_ms > 0)"
                " && window.duplexStats.responses.length >= 2",
                timeout=30_000,
            )
            before = await page.evaluate("window.duplexStats")
            indicator = await page.locator("#indicator").inner_text()

            await page.click("#drop")
            await page.wait_for_function("window.duplexStats?.state === 'detached'", timeout=5_000)
            await page.wait_for_function("window.duplexStats?.resumes.length >= 1", timeout=15_000)
            responses = len(before["responses"])
            await page.wait_for_function(
                f"window.duplexStats.responses.length >= {responses + 3}", timeout=30_000
            )
            after = await page.evaluate("window.duplexStats")
            lines = await page.locator("#transcript li").all_inner_texts()
            ds = service.sessions[after["sessionId"]]
            attached_again = ds.attachment is not None
            history = {r["id"]: ds.turns.retrieve(r["item"]) for r in after["responses"]}

            status = await page.context.new_page()
            await status.goto(f"{base}/demo/status?every_ms=300")
            await status.wait_for_function(
                "window.statusStats.last && window.statusStats.last.latencies.some("
                "(l) => l.kind === 'duplex' && l.ms && l.counts.steps > 0)",
                timeout=15_000,
            )
            latencies = await status.locator("#latencies").inner_text()
            await status.screenshot(path=str(tmp_path / "duplex-status.png"), full_page=True)

            await page.click("#stop")  # session.close: released at once, not kept for a resume
            await page.wait_for_function("window.duplexStats?.state === 'closed'", timeout=5_000)
            for _ in range(50):
                if len(service.manager) == 0:
                    break
                await asyncio.sleep(0.05)
            released = len(service.manager) == 0 and not service.sessions

    # connected, audio arrived and played, the indicator followed the model's decisions
    assert before["appended"] > 10 and before["audioDeltas"] > 0 and before["ackedMs"] > 0, before
    assert {"speaking", "listening"} <= set(before["indicator"]) and indicator in ("speaking", "listening")
    # playback acks: what was played, confirmed, and the server's history holds only that
    assert after["acks"] and all(a["played_ms"] > 0 for a in after["acks"])
    confirmed = [a for a in after["acknowledged"] if a["committed_ms"] > 0]
    assert confirmed and all(a["committed_ms"] <= a["played_ms"] for a in confirmed), confirmed
    assert all(
        after["finalTranscripts"][a["response_id"]].startswith(a["history_committed"]) for a in confirmed
    )
    committed = [h.content[0].transcript for h in history.values()]
    assert any(committed) and all(
        after["finalTranscripts"][rid].startswith(h.content[0].transcript) for rid, h in history.items()
    )
    # the drop: resumed on the same session, missed events replayed and applied exactly once
    assert after["drops"] == 1 and attached_again and after["sessionId"] == before["sessionId"]
    assert after["resumes"][0]["replayed"] >= 5 and after["skipped"] == 0, after["resumes"]
    assert 0 < before["eventAcked"] <= before["lastSeq"]  # the journal was freed up to what the page had
    for rid, final in after["finalTranscripts"].items():
        assert after["transcripts"].get(rid, "") == final, (rid, final)
    steps = [int(w) for line in lines for w in re.findall(r"w(\d+)", line)]
    assert steps == sorted(set(steps)) and len(steps) >= 3 * TURN_FRAMES, steps
    assert len(lines) - len({r["id"] for r in after["responses"]}) in (0, 1)  # one may be still open
    assert "duplex" in latencies and "late steps" in latencies
    assert released, "stop sends session.close: the session is released, not kept for a resume"
    assert after["errors"] == [] and console.errors == [], (after["errors"], console.errors)
    assert (tmp_path / "duplex-page.png").stat().st_size > 0
