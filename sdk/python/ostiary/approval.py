"""Waiting for a held request, the one way all the transports do it.

A request that policy escalates is answered ``202 approval_pending`` and stored; once a human
approves, the proxy executes the stored request exactly once and keeps the upstream's answer.
The agent collects it by re-sending the *same* request (method, URL and body must match) with
``Ostiary-Approval: <id>``; ``Prefer: wait=<s>`` holds that retry open until the outcome is
known or the wait runs out (the proxy honours at most ``approvals.max_wait``, 60 s by
default). So waiting is a loop of such retries until a deadline, each asking to wait for what
is left of it; the outcome is the stored answer, an :class:`~ostiary.errors.ApprovalDenied`,
or — once the deadline passes — the last :class:`~ostiary.errors.ApprovalPending`, whose id
can be collected later.

Re-sending means never sending anything new: a retry is only ever the held request itself,
so the exactly-once promise holds however often the loop asks.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta

from .errors import APPROVAL_HEADER

__all__ = ["ApprovalWait", "MAX_WAIT_SECONDS"]

#: The longest single ``Prefer: wait`` asked for (the proxy's default ``max_wait``).
MAX_WAIT_SECONDS = 60
#: How long the transport lets a retry take beyond the wait it asked for, before the
#: client's own read timeout would cut it.
READ_SLACK_SECONDS = 15.0
#: A retry answered sooner than this while still pending is followed by a pause of this
#: length, so a proxy that does not hold retries open is not asked in a tight loop.
MIN_ROUND_SECONDS = 0.5


class ApprovalWait:
    """The deadline of one wait and the retries it still allows."""

    def __init__(self, wait: timedelta) -> None:
        if wait.total_seconds() < 0:
            raise ValueError("wait_for_approval must not be negative")
        self._deadline = time.monotonic() + wait.total_seconds()
        self._round_start = time.monotonic()

    def remaining(self) -> float:
        return self._deadline - time.monotonic()

    def next_wait(self) -> int | None:
        """Seconds to ask the next retry to wait, or ``None`` when the deadline passed."""
        left = self.remaining()
        if left <= 0:
            return None
        self._round_start = time.monotonic()
        return max(1, min(MAX_WAIT_SECONDS, math.ceil(left)))

    def pause(self) -> float:
        """How long to sleep before the next retry (0 when the last one did wait)."""
        took = time.monotonic() - self._round_start
        if took >= MIN_ROUND_SECONDS:
            return 0.0
        return max(0.0, min(MIN_ROUND_SECONDS - took, self.remaining()))

    @staticmethod
    def headers(approval_id: str, wait_seconds: int) -> dict[str, str]:
        """The headers that turn the held request into its collecting retry."""
        return {APPROVAL_HEADER: approval_id, "prefer": f"wait={wait_seconds}"}

    @staticmethod
    def read_timeout(current: float | None, wait_seconds: int) -> float | None:
        """A read timeout long enough for the proxy to hold the retry ``wait_seconds``."""
        if current is None:
            return None
        return max(current, wait_seconds + READ_SLACK_SECONDS)
