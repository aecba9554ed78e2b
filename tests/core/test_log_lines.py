"""Issue 35: the ``loop_governor`` logger tells the story of a run, one line per decision.

Each line starts with the task's name and quotes the tool's own (redacted) message, the
words the model read, never the normalized signature; the lines come in the order the
decisions were taken: the failure the model was told about, each retry, the retries running
out, each refusal, withdrawal (and for how long) and restore, and each stop. Without logging
configured, nothing is printed at all.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.policies.ladder import offered

SECRET = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD"


def _gov(clock: VirtualClock, **settings: object) -> lg.Governor:
    return lg.Governor(lg.GovernorConfig(**settings), clock=clock, sleep=clock.sleep, random=lambda: 0.5)


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "loop_governor"]


def test_nothing_is_printed_when_the_application_configured_no_logging() -> None:
    """Python's last-resort handler prints WARNINGs of a logger without handlers to stderr:
    the library's NullHandler keeps a program that configured nothing silent."""
    program = textwrap.dedent(
        """
        import loop_governor as lg
        g = lg.Governor(lg.GovernorConfig(breaker_failure_threshold=1, retry_max_attempts=1))
        def down(q):
            raise TimeoutError("upstream unavailable")
        with g.task("t"):
            for _ in range(3):
                try:
                    g.call("search", down, "q")
                except lg.AgentToolError:
                    pass
            try:
                g.call("crm", lambda: (_ for _ in ()).throw(PermissionError("API key revoked")))
            except lg.FatalError as stop:
                print("stopped", stop.info.code)
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "stopped unauthorized"  # refusals and a stop happened
    assert done.stderr == ""


def test_a_failing_run_reads_as_its_story(clock: VirtualClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="loop_governor")
    gov = _gov(clock, breaker_failure_threshold=10, task_retry_budget=10)
    with gov.task("ticket-7", name="Refund policy"):
        with pytest.raises(lg.TransientError):
            gov.call("search", Backend(forever=HTTPError(503, f"upstream unavailable (key {SECRET})")), "refunds")
        for _ in range(6):
            try:
                gov.call("fetch_doc", Backend(forever=HTTPError(404, "no document named refunds-2019.pdf")), "x")
            except lg.FatalError:
                break
            except lg.AgentToolError:
                pass
    lines = _lines(caplog)
    texts = [text for _, text in lines]
    assert all(text.startswith('task "Refund policy": ') for text in texts), texts  # the name, not the id
    story = [(level, text.removeprefix('task "Refund policy": ')) for level, text in lines]
    said_404 = "HTTPError: no document named refunds-2019.pdf"
    expected = [
        ("INFO", "search failed (transient, HTTP 503): HTTPError: upstream unavailable (key ", "attempt 2 of 3)"),
        ("INFO", "search failed (transient, HTTP 503): HTTPError: upstream unavailable (key ", "attempt 3 of 3)"),
        ("WARNING", "search failed (transient, HTTP 503): HTTPError: upstream unavailable (key ", ""),
        ("INFO", f"fetch_doc failed (permanent, HTTP 404): {said_404}", ""),
        ("WARNING", "answered a call to fetch_doc from memory without making it", ""),
        ("WARNING", "withdrew fetch_doc from the model for the rest of the task", "calling it again ends the run"),
        ("WARNING", "answered a call to fetch_doc from memory without making it", ""),
        ("WARNING", "loop-governor stopped the run: fetch_doc (repeated_failure)", ""),
    ]
    assert len(story) == len(expected), "\n".join(texts)
    for (level, text), (want_level, start, end) in zip(story, expected, strict=True):
        assert level == want_level and text.startswith(start) and text.endswith(end), text
    assert "retries exhausted after 3 attempts; the model was told: " in story[2][1]
    # the 404: the model's text, the tool's own message, on the first failure and on each line after it
    assert "the model was told: " in story[3][1] and "2 more identical calls" in story[3][1]
    assert all(said_404 in text for _, text in story[3:7])
    assert all(SECRET not in text for text in texts)
    assert not any("<n>" in text or "<q>" in text for text in texts)  # never the normalized signature


def test_a_withdrawal_for_an_outage_says_how_long_and_the_restore_is_a_line(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loop_governor")
    gov = _gov(clock, breaker_failure_threshold=1, breaker_cooldown_s=60, retry_max_attempts=1)
    down = Backend(forever=HTTPError(503, "weather service down"))
    with gov.task("forecast") as scope:
        for _ in range(4):
            clock.advance(1)
            with pytest.raises(lg.AgentToolError):
                gov.call("weather", down, "Oslo")
        clock.advance(120)
        assert offered(scope, ["weather"]) == [True]
    texts = [text.removeprefix('task "forecast": ') for _, text in _lines(caplog)]
    opened = next(t for t in texts if t.startswith("circuit breaker of weather: closed -> open"))
    assert opened == "circuit breaker of weather: closed -> open for 60s after: HTTPError: weather service down"
    refused = [t for t in texts if t.startswith("refused a call to weather without making it (circuit breaker open)")]
    assert refused and all("retry in " in t for t in refused)
    (withdrawn,) = [t for t in texts if t.startswith("withdrew weather")]
    assert withdrawn.startswith("withdrew weather from the model for 5")  # the cooldown left, in seconds
    assert withdrawn.endswith("it is offered again after that, and calling it before then ends the run")
    assert "for the rest of the task" not in withdrawn
    assert texts[-1] == "offering weather to the model again: its withdrawal (repeated_refusal) is over"


def test_a_line_outside_a_task_has_no_task_prefix_and_a_guard_warning_is_a_line(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loop_governor")
    gov = _gov(clock)
    with pytest.raises(lg.PermanentError):
        gov.call("fetch_doc", Backend(forever=HTTPError(404, "gone")), "x")
    with gov.task("review"):
        for _ in range(3):
            gov.call("critic", lambda draft: "still weak: add the numbers section", "the draft")
    texts = [text for _, text in _lines(caplog)]
    assert texts[0].startswith("fetch_doc failed (permanent, HTTP 404): HTTPError: gone; the model was told: ")
    assert any(
        t.startswith('task "review": critic: it returned the same result ') and "the model was told" in t for t in texts
    ), texts


def test_a_poll_near_and_at_its_bound_is_a_line_each(clock: VirtualClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="loop_governor")
    gov = _gov(clock, tools={"job_status": lg.ToolPolicy(poll=True, max_calls=5)})
    with gov.task("export"):
        for _ in range(6):
            clock.advance(10)
            try:
                gov.call("job_status", lambda job_id: "running", "job-42")
            except lg.AgentToolError:
                break
    texts = [text.removeprefix('task "export": ') for _, text in _lines(caplog)]
    assert any(t.startswith("job_status: the job was polled ") and "nears its bound" in t for t in texts), texts
    assert any(
        t.startswith("withdrew job_status from the model for the rest of the task (poll_max_calls") for t in texts
    )
    assert any(
        t.startswith("refused a call to job_status without making it (its polled job reached its bound): the poll of")
        for t in texts
    )
