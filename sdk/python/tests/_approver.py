"""A human at the CLI, in a thread: waits until the session has a pending approval, then
decides it with the real ``ostiary approvals approve|deny ID --as alice@example.com`` —
while the agent's call is blocked waiting for the outcome."""

from __future__ import annotations

import threading
import time

import ostiary
from _proxy import Proxy
from _rig import APPROVER


class CliApprover:
    def __init__(self, proxy: Proxy, session_id: str, verdict: str = "approve") -> None:
        self.proxy = proxy
        self.session_id = session_id
        self.verdict = verdict
        self.approval_id: str | None = None
        self.output = ""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CliApprover:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=60)
        if self.error is not None and exc[0] is None:
            raise self.error

    def _run(self) -> None:
        try:
            with ostiary.ControlClient(self.proxy.control_url, self.proxy.admin_token) as control:
                deadline = time.monotonic() + 30
                while True:
                    pending = control.approvals("pending", session=self.session_id)
                    if pending:
                        break
                    if time.monotonic() > deadline:
                        raise AssertionError(f"no approval was ever held for {self.session_id}")
                    time.sleep(0.1)
            self.approval_id = pending[0].approval_id
            done = self.proxy.cli(
                "approvals", self.verdict, self.approval_id, "--as", APPROVER,
                "--reason", "checked by the test",
            )
            self.output = done.stdout + done.stderr
            if done.returncode != 0:
                raise AssertionError(f"ostiary approvals {self.verdict} failed: {self.output}")
        except BaseException as exc:  # noqa: BLE001 - reported by __exit__
            self.error = exc
