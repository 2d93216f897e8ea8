"""The process environment of a session: proxy URLs, the CA bundle, placeholders.

Agent runtimes and the tools they start read ``HTTPS_PROXY`` and a CA bundle variable, each
client its own (docs/design.md §7): curl ``CURL_CA_BUNDLE``, requests ``REQUESTS_CA_BUNDLE``,
OpenSSL-based clients ``SSL_CERT_FILE``, Node ``NODE_EXTRA_CA_CERTS``, git ``GIT_SSL_CAINFO``.
Setting all of them — and both spellings of the proxy variables, and an empty ``NO_PROXY`` so
nothing bypasses — is what ``ostiary run`` does for a child; :class:`EnvPatch` does the same
for a block of Python code and every subprocess it starts, and puts back exactly what was
there before (nested sessions restore in order).

``os.environ`` is process-wide: two threads in two different sessions' blocks would see
each other's variables. Threads that need their own session should use ``Session.client()``,
which carries its configuration with it, rather than the environment.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

from .models import CreatedSession

__all__ = ["CA_BUNDLE_VARS", "PROXY_VARS", "EnvPatch", "session_env", "write_ca"]

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
CA_BUNDLE_VARS = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
)
SESSION_ID_VAR = "OSTIARY_SESSION_ID"


def session_env(created: CreatedSession, ca_path: str) -> dict[str, str]:
    """The variables a process needs to send everything through the session: the same set
    the Rust SDK's ``Session::env`` gives a child."""
    env = {name: created.proxy_url for name in PROXY_VARS}
    env.update({name: "" for name in NO_PROXY_VARS})
    env.update({name: ca_path for name in CA_BUNDLE_VARS})
    env[SESSION_ID_VAR] = created.session_id
    env.update(created.placeholders)
    return env


def write_ca(ca_pem: str) -> str:
    """Write the session's CA certificate to a file of its own and return the path (the
    bundle variables name a file). The caller removes it when the session ends."""
    fd, path = tempfile.mkstemp(prefix="ostiary-ca-", suffix=".pem")
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(ca_pem)
    return path


class EnvPatch:
    """Variables set in ``os.environ`` until :meth:`restore` puts back what was there."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)
        self._saved: dict[str, str | None] | None = None

    def apply(self) -> None:
        if self._saved is not None:
            raise RuntimeError("this environment patch is already applied")
        self._saved = {name: os.environ.get(name) for name in self._values}
        os.environ.update(self._values)

    def restore(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
