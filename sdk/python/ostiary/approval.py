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

:class:`Collecting` is that loop's state and decisions, apart from any I/O; :func:`settle` is
the loop itself for the blocking clients (``httpx`` and ``requests``), given how to send a
retry and how to read an answer. The ``async`` transport runs the same loop, awaited.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from .errors import APPROVAL_HEADER, ApprovalPending, OstiaryError

__all__ = ["ApprovalWait", "Collecting", "MAX_WAIT_SECONDS", "settle"]

#: An HTTP client's response (``httpx`` or ``requests``).
R = TypeVar("R")

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


class Collecting:
    """A held request being collected: its approval, the last word on it, and the wait left.

    Made from the refusal of the first answer, which it raises unless the request is held
    and to be waited for (a ``wait`` given, an approval id to collect with)."""

    def __init__(self, refusal: OstiaryError, wait: timedelta | None) -> None:
        if not (isinstance(refusal, ApprovalPending) and wait is not None and refusal.approval_id):
            raise refusal
        self.pending = refusal
        self.approval_id: str = refusal.approval_id
        self._wait = ApprovalWait(wait)

    def next_wait(self) -> int | None:
        """Seconds the next retry asks to wait, or ``None``: raise :attr:`pending`."""
        return self._wait.next_wait()

    def pause_after(self, refusal: OstiaryError) -> float:
        """After a retry refused with ``refusal``: raises it unless the request is still
        held, else how long to pause before the next retry."""
        if not isinstance(refusal, ApprovalPending):
            raise refusal
        self.pending = refusal
        return self._wait.pause()


def settle(
    response: R,
    refusal: Callable[[R], OstiaryError | None],
    retry: Callable[[str, int], R],
    wait: timedelta | None,
) -> R:
    """``response`` unless Ostiary refused it (``refusal`` reads that), which is raised —
    but for a held request with a ``wait``: ``retry(approval_id, seconds)`` re-sends it to
    collect its outcome until it is known or the wait is over."""
    error = refusal(response)
    if error is None:
        return response
    held = Collecting(error, wait)
    while (seconds := held.next_wait()) is not None:
        response = retry(held.approval_id, seconds)
        error = refusal(response)
        if error is None:
            return response
        pause = held.pause_after(error)
        if pause > 0:
            time.sleep(pause)
    raise held.pending
