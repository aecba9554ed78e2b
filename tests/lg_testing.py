"""Test helpers importable from any test (``tests`` is on pythonpath): a virtual clock,
sleeps that return at once, HTTP-like errors and a fault-injecting backend."""

from __future__ import annotations


def no_sleep(_seconds: float) -> None:
    """A ``sleep`` that returns at once (retries back off on virtual time)."""
    return None


async def no_asleep(_seconds: float) -> None:
    """An ``asleep`` that returns at once."""
    return None


class VirtualClock:
    """Time that moves only when something sleeps (or the test advances it)."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def advance(self, seconds: float) -> None:
        self.now += seconds


class HTTPError(Exception):
    """Shaped like SDK status errors: a ``status_code`` and optional headers."""

    def __init__(self, status: int, message: str = "", headers: dict[str, str] | None = None) -> None:
        super().__init__(message or f"HTTP {status}")
        self.status_code = status
        self.headers = headers or {}


class Backend:
    """A fault-injecting tool: raises the scripted errors in order, then returns 'ok'."""

    def __init__(self, *faults: BaseException | None, forever: BaseException | None = None) -> None:
        self.faults = list(faults)
        self.forever = forever
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> str:
        self.calls += 1
        if self.faults:
            fault = self.faults.pop(0)
            if fault is not None:
                raise fault
            return "ok"
        if self.forever is not None:
            raise self.forever
        return "ok"

    async def acall(self, *args: object, **kwargs: object) -> str:
        return self(*args, **kwargs)


def governed(text: object) -> dict[str, object]:
    """The governed failure a tool result carries (either rendering): ``type``,
    ``message``, ``advice`` and, in the plain text, ``outcome``; fails the test if none."""
    from loop_governor.errors import read_model_text

    fields = read_model_text(str(text))
    assert fields is not None, f"no governed failure in {text!r}"
    return fields


class Car:
    """``start_engine`` needs the brake pressed first (a precondition another tool fixes)."""

    def __init__(self) -> None:
        self.brake = False
        self.starts = 0

    def start_engine(self) -> str:
        self.starts += 1
        if not self.brake:
            raise ValueError("Brake pedal must be pressed when starting the engine")
        return "engine running"

    def press_brake(self) -> str:
        self.brake = True
        return "brake pressed"
