"""Fixtures: one real ``ostiary serve`` for the whole run, in front of a loopback HTTPS
upstream and a real MCP server (``tests/clients/mcp_server.py``, the Rust MCP tests' own;
catalog and policies in ``_rig.py``), and a clean environment for each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _pki import Certs, make_certs
from _proxy import SCRUBBED, Proxy
from _rig import API, APPROVER, MCP, POLICIES, SECURE, tools
from _upstream import McpUpstream, Upstream


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"), [API, SECURE, MCP])


@pytest.fixture(scope="session")
def upstream(certs: Certs) -> Iterator[Upstream]:
    server = Upstream(certs)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mcp_upstream(
    tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[McpUpstream]:
    server = McpUpstream(certs, tmp_path_factory.mktemp("mcp"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def proxy(
    tmp_path_factory: pytest.TempPathFactory,
    certs: Certs,
    upstream: Upstream,
    mcp_upstream: McpUpstream,
) -> Iterator[Proxy]:
    dir = tmp_path_factory.mktemp("ostiary")
    secrets = dir / "secrets.toml"
    secrets.write_text('present = "not-used"\n')
    config = f"""
[egress]
ports = [{upstream.port}, {mcp_upstream.port}]
allow_private = ["127.0.0.1/32"]
resolve = {{ "{API}" = "127.0.0.1", "{SECURE}" = "127.0.0.1", "{MCP}" = "127.0.0.1" }}
ca_file = "{certs.ca}"

[approvals]
approvers = ["{APPROVER}"]
tick = "100ms"

[tiers.write]
repeat_max = 3

[broker]
backend = "file"
file = "{secrets}"

[[credential]]
name = "vaulted"
source = {{ file = "absent" }}
hosts = ["{SECURE}"]
inject = {{ header = "X-Api-Key", value = "{{secret}}" }}
"""
    files = {"test.cedar": POLICIES, "tools.toml": tools(mcp_upstream.url(MCP))}
    server = Proxy(dir, config, files)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy, CA or Ostiary variable from the machine: each test sets what it means."""
    for name in SCRUBBED:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def control_env(proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> Proxy:
    """The control API named the way users name it: ``OSTIARY_CONTROL_URL`` and
    ``OSTIARY_ADMIN_TOKEN``."""
    monkeypatch.setenv("OSTIARY_CONTROL_URL", proxy.control_url)
    monkeypatch.setenv("OSTIARY_ADMIN_TOKEN", proxy.admin_token)
    return proxy

