"""Core test fixtures."""

from __future__ import annotations

import pytest
from lg_testing import VirtualClock

import loop_governor as lg


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def gov(clock: VirtualClock) -> lg.Governor:
    return lg.Governor(clock=clock, sleep=clock.sleep, asleep=clock.asleep, random=lambda: 0.5)
