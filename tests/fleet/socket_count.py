"""What a block of code sends to Redis, counted on redis-py's connections: shared by
tests/fleet/test_redis_store.py and benchmarks/fleet_throughput.py.

A round trip is a turn of the conversation: the client sends (one command, or a batch) and
then waits for a reply. Replies read after the first one of a turn (a pipeline's, or a
reply left unread to be read with the next request's) arrive with it, so they are not
another round trip. Counted on the connection class every redis-py client uses, so
whatever path a command takes (the client, a pipeline, a script, a hand-sent command) is
counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class SocketCount:
    """``sends``: writes to a socket (a pipeline's batch is one); ``replies``: replies read;
    ``round_trips``: reads that followed a send on the same connection."""

    sends: int = 0
    replies: int = 0
    round_trips: int = 0

    def reset(self) -> None:
        self.sends = self.replies = self.round_trips = 0


@contextmanager
def counting() -> Iterator[SocketCount]:
    """Count every connection's sends, replies and round trips inside the block."""
    from redis.connection import AbstractConnection

    count = SocketCount()
    sent: set[int] = set()  # connections that sent since their last read
    send, read = AbstractConnection.send_packed_command, AbstractConnection.read_response

    def counted_send(self: Any, command: Any, check_health: bool = True) -> None:
        count.sends += 1
        sent.add(id(self))
        send(self, command, check_health)

    def counted_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        count.replies += 1
        if id(self) in sent:
            sent.discard(id(self))
            count.round_trips += 1
        return read(self, *args, **kwargs)

    AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]
    AbstractConnection.read_response = counted_read  # type: ignore[method-assign]
    try:
        yield count
    finally:
        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        AbstractConnection.read_response = read  # type: ignore[method-assign]
