"""The test rig's catalog and policies, and small helpers the tests share: they give every
outcome a test needs.

The catalog (host ``api.example.test``, paths ``/items/{id}`` on the upstream):

| tool | call | outcome |
|---|---|---|
| ``demo.read`` | ``GET /items/{id}`` | allowed (``read-ok``) |
| ``demo.write`` | ``POST /items/{id}`` | allowed (``write-ok``); DLP-checked; 3 identical calls pause the session |
| ``demo.delete`` | ``DELETE /items/{id}`` | held for approval (``irreversible-needs-human``) |
| ``demo.secret`` | ``GET /secrets/{id}`` | denied (``no-secrets``) |
| ``files.read`` / ``files.write`` / ``files.delete`` | MCP ``read_file`` / ``write_file`` / ``delete_file`` on ``mcp.example.test`` | allowed / denied (``no-mcp-writes``) / held for approval |
| ``vault.read`` | ``GET /items/{id}`` on ``secure.example.test`` | its credential's file entry is missing: ``503 credential_unavailable`` |

Plain requests to ``api.example.test`` (``/own-refusal``) are allowed (``plain-http``).
"""

from __future__ import annotations

import itertools
import os

import ostiary

API = "api.example.test"
SECURE = "secure.example.test"
MCP = "mcp.example.test"
APPROVER = "alice@example.com"


def tools(mcp_url: str) -> str:
    return f"""
[[tool]]
name = "demo.read"
tier = "read"
match = {{ host = "{API}", method = "GET", path = "/items/{{id}}" }}

[[tool]]
name = "demo.write"
tier = "write"
match = {{ host = "{API}", method = "POST", path = "/items/{{id}}" }}

[[tool]]
name = "demo.delete"
tier = "irreversible"
match = {{ host = "{API}", method = "DELETE", path = "/items/{{id}}" }}

[[tool]]
name = "demo.secret"
tier = "read"
match = {{ host = "{API}", method = "GET", path = "/secrets/{{id}}" }}

[[tool]]
name = "vault.read"
tier = "read"
match = {{ host = "{SECURE}", method = "GET", path = "/items/{{id}}" }}

[[tool]]
name = "files.read"
tier = "read"
match = {{ mcp = "{mcp_url}", tool = "read_file" }}

[[tool]]
name = "files.write"
tier = "write"
match = {{ mcp = "{mcp_url}", tool = "write_file" }}

[[tool]]
name = "files.delete"
tier = "irreversible"
match = {{ mcp = "{mcp_url}", tool = "delete_file" }}
"""


POLICIES = f"""
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("write-ok")
permit (principal, action in Ostiary::Action::"tier:write", resource);

@id("no-secrets")
forbid (principal, action == Ostiary::Action::"tool:demo.secret", resource);

@id("no-mcp-writes")
forbid (principal, action == Ostiary::Action::"tool:files.write", resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless {{ context.approval.granted }};

@id("plain-http")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"{API}");

@id("mcp-plumbing")
permit (principal, action == Ostiary::Action::"mcp", resource == Ostiary::Host::"{MCP}")
when {{
  ["initialize", "ping", "tools/list", "server/discover"].contains(context.method) ||
  context.method like "notifications/*"
}};

@id("mcp-stream")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"{MCP}")
when {{ ["GET", "DELETE"].contains(context.method) }};
"""


def url(port: int, path: str, host: str = API) -> str:
    """``https://<host>:<port><path>`` on the loopback upstream, through the proxy."""
    return f"https://{host}:{port}{path}"


_ids = itertools.count(1)


def unique(prefix: str) -> str:
    """An id no other call used: identical calls trip the watchdog (3 for writes)."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


def gone(session_id: str) -> bool:
    """Whether the control API no longer knows the session (torn down, ended)."""
    with ostiary.ControlClient() as control:
        try:
            control.session(session_id)
        except ostiary.NotFound:
            return True
    return False


def executed(session_id: str, tool: str = "files.delete") -> list[str]:
    """The approvals of ``session_id``'s held ``tool`` calls the proxy has executed, one
    entry an execution, from its audit trail: the MCP server keeps no record of its own."""
    with ostiary.ControlClient() as control:
        records = control.audit(session=session_id)
    return [
        str(r.get("approval"))
        for r in records
        if r.get("kind") == "approval"
        and r.get("tool") == tool
        and str(r.get("reason", "")).startswith("executed")
    ]
