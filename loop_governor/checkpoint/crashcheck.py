"""Kill a checkpointing process at random instants and look at what survives.

Used by the crash test in the suite and by ``benchmarks/checkpoint_crash.py``; also a
ready-made check for anyone adding a store (it takes a store URL).

How it works: a *zygote* process (``python -m loop_governor.checkpoint.crashcheck``)
imports everything once, then per request forks a *worker* that loads the task's
checkpoint (or starts one), and loops: grow it by one step, ``store.save``, then append
the step number to an acknowledgement file. The zygote SIGKILLs the worker after the
requested delay and reports how it died. Forking from a warm zygote costs about a
millisecond where a fresh interpreter costs hundreds, which is what lets the suite afford
hundreds of kills; the worker is still a separate process killed with SIGKILL, and it
shares no open file or connection with anyone (stores are opened after the fork). The
zygote, not the test, sends the kill: the worker is its unreaped child, so its pid cannot
be recycled in between.

Why the acknowledgement is sound: the worker writes it with a single ``os.write`` after
``save`` returned, so the last complete line is a save that returned, and a SIGKILL does
not lose data already handed to the kernel. A worker resumes from the step stored before
it started (``previous``) and saves ``previous + 1, previous + 2, ...``, so after the
kill, with ``base = max(acked, previous)``: ``base <= stored <= base + 1``. The lower
bound is "no returned save is lost"; the ``+ 1`` is a save that reached the store but was
killed before returning (for the file store, during the fsync of its journal record or
of the directory after a snapshot's rename) or before its ack.

Kills must also land during compaction, the one multi-step write: workers take
``store_options`` (e.g. ``compact_min_bytes=8192, compact_ratio=0``, a compaction every
~20 saves), and [`file_store_state`][loop_governor.checkpoint.crashcheck.file_store_state] tells from the files what a
kill interrupted.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from loop_governor.checkpoint import file_journal
from loop_governor.checkpoint.codec import CorruptData
from loop_governor.checkpoint.file_store import FileCheckpointStore, snapshot_header
from loop_governor.checkpoint.model import TaskCheckpoint
from loop_governor.checkpoint.url import checkpoint_store_from_url
from loop_governor.errors import ErrorType, GovernedError

# -- the growing checkpoint ----------------------------------------------------------------


def payload(step: int) -> str:
    """Deterministic filler of varying length, so saves end at different offsets."""
    seed = hashlib.sha256(str(step).encode()).hexdigest()
    return seed * (1 + step % 4)


def chain(previous: str, step: int) -> str:
    """A running hash over every result so far: the self-consistency check."""
    return hashlib.sha256(f"{previous}|{step}|{payload(step)}".encode()).hexdigest()


def grow(cp: TaskCheckpoint) -> None:
    """Advance ``cp`` by one step (result, completed call, sometimes a known-bad call)."""
    step = cp.step + 1
    cp.add_result({"step": step, "payload": payload(step)})
    cp.record_success(f'tool:{{"step":{step}}}', {"step": step, "ok": True})
    if step % 7 == 0:
        cp.record_failure(
            f'bad_tool:{{"step":{step}}}',
            GovernedError(error_type=ErrorType.PERMANENT, tool="bad_tool", message=f"failed at {step}"),
        )
    previous = cp.metadata.get("chain", "")
    cp.metadata["chain"] = chain(previous if isinstance(previous, str) else "", step)
    cp.step = step


def problems(cp: TaskCheckpoint, acked: int, previous: int) -> list[str]:
    """What is wrong with a reloaded checkpoint.

    ``acked`` is the last acknowledged step, ``previous`` the step stored before this
    worker started (the worker resumed from it).
    """
    found: list[str] = []
    if cp.step != len(cp.results):
        found.append(f"step {cp.step} != {len(cp.results)} results")
    expected_chain = ""
    for i, result in enumerate(cp.results, start=1):
        if result != {"step": i, "payload": payload(i)}:
            found.append(f"result {i} is wrong")
            break
        expected_chain = chain(expected_chain, i)
    if cp.results and cp.metadata.get("chain") != expected_chain:
        found.append("metadata chain does not match the results")
    if len(cp.completed) != cp.step or len(cp.known_bad) != cp.step // 7:
        found.append("completed/known_bad do not match the step")
    base = max(acked, previous)
    if not base <= cp.step <= base + 1:
        found.append(f"stored step {cp.step}, but acknowledged {acked} and previously stored {previous}")
    return found


def file_store_state(store: FileCheckpointStore, task_id: str) -> str:
    """What a kill left for ``task_id`` in a file store, from the files alone.

    ``"stale journal"``: killed after a compaction's snapshot rename, before the journal
    was emptied; ``"torn record"``: killed mid-append; ``"torn journal start"``: killed
    while restarting the journal; ``"clean"`` otherwise. (A kill mid-snapshot-write
    shows as a new ``.tmp-*.part`` file instead: see [`temp_files`][loop_governor.checkpoint.crashcheck.temp_files].)
    """
    try:
        snapshot = snapshot_header(store.path_for(task_id).read_bytes())
        journal = store.journal_path_for(task_id).read_bytes()
    except FileNotFoundError:
        return "clean"
    if snapshot is None or not journal:
        return "clean"
    try:
        header, _ = file_journal.parse_header(journal)
    except CorruptData:
        return "damaged journal header"
    if header is None:
        return "torn journal start"
    if header != snapshot:
        return "stale journal"
    return "torn record" if not journal.endswith(b"\n") else "clean"


def temp_files(directory: Path) -> set[str]:
    """Temp files in a file store's directory (each left by a snapshot write cut short)."""
    return {p.name for p in Path(directory).iterdir() if p.name.startswith(".tmp-")}


def last_acked(ack_path: Path) -> int:
    """The last complete line of the acknowledgement file (0 if none)."""
    try:
        data = ack_path.read_bytes()
    except FileNotFoundError:
        return 0
    lines = data.split(b"\n")[:-1]  # a torn last line (no newline) does not count
    return int(lines[-1]) if lines else 0


# -- worker and zygote (child side) ----------------------------------------------------------


def _worker(store_url: str, options: dict[str, Any], task_id: str, ack_path: str) -> None:
    store = checkpoint_store_from_url(store_url, **options)
    cp = store.load(task_id) or TaskCheckpoint(task_id=task_id)
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    while True:
        grow(cp)
        store.save(cp)
        os.write(fd, b"%d\n" % cp.step)


def _zygote(store_url: str, options: dict[str, Any]) -> None:
    # Warm the backend's imports (redis-py takes ~0.5 s) so workers start in a millisecond;
    # the store is closed again so no connection or handle crosses the fork.
    checkpoint_store_from_url(store_url, **options).close()
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            return
        _, task_id, ack_path, delay_us = command
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # worker
            code = 0
            try:
                _worker(store_url, options, bytes.fromhex(task_id).decode(), ack_path)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        time.sleep(int(delay_us) / 1e6)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            print(f"signal {os.WTERMSIG(status)}", flush=True)
        else:
            print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


# -- driver (parent side) --------------------------------------------------------------------


@dataclass(frozen=True)
class KillOutcome:
    """How one worker died and the last save it acknowledged."""

    death: str  # "signal 9" when killed as intended; "exit N" when it died on its own
    acked: int


class CrashHarness:
    """Runs the zygote for one store URL; ``kill_after`` runs and kills one worker."""

    def __init__(self, store_url: str, workdir: Path, store_options: dict[str, Any] | None = None) -> None:
        self.store_url = store_url
        self.store_options = dict(store_options or {})
        self.workdir = Path(workdir)
        self.stderr_path = self.workdir / "zygote.stderr"
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> CrashHarness:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "w") as stderr:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "loop_governor.checkpoint.crashcheck",
                    self.store_url,
                    json.dumps(self.store_options),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                bufsize=1,
            )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.write("quit\n")
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def ack_path(self, task_id: str) -> Path:
        return self.workdir / f"ack-{hashlib.sha256(task_id.encode()).hexdigest()[:16]}"

    def kill_after(self, task_id: str, delay_s: float) -> KillOutcome:
        """Fork a worker growing ``task_id``, SIGKILL it after ``delay_s``, report."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("CrashHarness is not started (use it as a context manager)")
        ack = self.ack_path(task_id)
        proc.stdin.write(f"run {task_id.encode().hex()} {ack} {int(delay_s * 1e6)}\n")
        reply = proc.stdout.readline().strip()
        if not reply:
            raise RuntimeError(f"zygote died; stderr: {self.stderr_path.read_text()[-2000:]}")
        return KillOutcome(death=reply, acked=last_acked(ack))

    def worker_errors(self) -> str:
        """Whatever workers printed (tracebacks if one died on its own)."""
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""


if __name__ == "__main__":
    _zygote(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
