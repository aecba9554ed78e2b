"""Tests that assert exactly what the governor changes on purpose.

Keyed by (suite, mode) -- mode "*" for every mode of the suite -- then test id (JUnit
``classname::name``) with the reason. Keep it short: anything else that passes unchanged
and fails with the governor in is a bug in the governor.
"""

from __future__ import annotations

ALLOWED: dict[tuple[str, str], dict[str, str]] = {}
