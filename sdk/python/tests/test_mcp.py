"""The official MCP Python SDK's client through the proxy, to a real MCP server: the tool
list is filtered, an allowed call answers, a forbidden one raises ``Denied`` with its policy,
a held one ``ApprovalPending``, and collecting it on the same connection after the CLI approval
runs it once (the proxy's audit trail counts the executions)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from mcp.shared.exceptions import MCPError

import ostiary
import ostiary.mcp
from _approver import CliApprover
from _proxy import Proxy
from _rig import MCP, executed
from _upstream import McpUpstream


def test_mcp_calls_through_the_proxy(control_env: Proxy, mcp_upstream: McpUpstream) -> None:
    endpoint = mcp_upstream.url(MCP)

    async def main() -> None:
        async with ostiary.session(agent="mcp-agent") as s:
            async with ostiary.mcp.connect(s, endpoint, mode="legacy") as mcp:
                listed = await mcp.client.list_tools()
                # The forbidden tool is not even offered; the escalatable one is.
                assert sorted(t.name for t in listed.tools) == ["delete_file", "read_file"]
                result = await mcp.call_tool("read_file", {"path": "/notes.txt"})
                assert [getattr(c, "text", None) for c in result.content] == ["hello"]

                with pytest.raises(ostiary.Denied) as denied:
                    await mcp.call_tool("write_file", {"path": "/x", "content": "y"})
                assert denied.value.policies == ("no-mcp-writes",)
                assert denied.value.action == 'Ostiary::Action::"tool:files.write"'
                assert denied.value.request_id

                # The raw SDK error carries the same body; refusal() reads it.
                with pytest.raises(MCPError) as raw:
                    await mcp.client.call_tool("write_file", {"path": "/x", "content": "y"})
                assert raw.value.code == -32001
                assert isinstance(ostiary.mcp.refusal(raw.value), ostiary.Denied)

                with pytest.raises(ostiary.ApprovalPending) as held:
                    await mcp.call_tool("delete_file", {"path": "/gone.txt"})
                pending = held.value
                assert pending.approval_id and pending.approval_id.startswith("apr_")
                # The session stays usable after refusals.
                again = await mcp.call_tool("read_file", {"path": "/notes.txt"})
                assert not again.is_error

                assert executed(s.id) == []
                with CliApprover(control_env, s.id) as human:
                    result = await mcp.collect(
                        pending, "delete_file", {"path": "/gone.txt"}, timeout=timedelta(seconds=60)
                    )
                assert human.approval_id == pending.approval_id
                assert [getattr(c, "text", None) for c in result.content] == ["deleted"]
                assert executed(s.id) == [pending.approval_id], "executed exactly once"
                # The approval header is gone again: a new call is decided afresh.
                assert "ostiary-approval" not in mcp.http.headers
                with pytest.raises(ostiary.Denied):
                    await mcp.call_tool("write_file", {"path": "/x", "content": "y"})

    asyncio.run(main())


def test_an_mcp_call_waits_for_the_cli_approval(
    control_env: Proxy, mcp_upstream: McpUpstream
) -> None:
    endpoint = mcp_upstream.url(MCP)

    async def main() -> None:
        async with ostiary.session(agent="mcp-waiter", wait_for_approval=timedelta(seconds=60)) as s:
            async with ostiary.mcp.connect(s, endpoint, mode="legacy") as mcp:
                with CliApprover(control_env, s.id) as human:
                    result = await mcp.call_tool("delete_file", {"path": "/waited.txt"})
                assert [getattr(c, "text", None) for c in result.content] == ["deleted"]
            assert executed(s.id) == [human.approval_id], "executed exactly once"

    asyncio.run(main())


def test_mcp_collect_gives_up_at_its_deadline(control_env: Proxy, mcp_upstream: McpUpstream) -> None:
    endpoint = mcp_upstream.url(MCP)

    async def main() -> str:
        async with ostiary.session(agent="mcp-patient") as s:
            async with ostiary.mcp.connect(s, endpoint, mode="legacy") as mcp:
                with pytest.raises(ostiary.ApprovalPending) as held:
                    await mcp.call_tool("delete_file", {"path": "/later.txt"})
                started = time.monotonic()
                with pytest.raises(ostiary.ApprovalPending) as still:
                    await mcp.collect(
                        held.value, "delete_file", {"path": "/later.txt"},
                        timeout=timedelta(seconds=1),
                    )
                assert time.monotonic() - started >= 1
                assert still.value.approval_id == held.value.approval_id
                return s.id

    assert executed(asyncio.run(main())) == []


def test_an_mcp_servers_own_error_is_not_a_refusal() -> None:
    assert ostiary.mcp.refusal(MCPError(-32601, "Method not found")) is None
    assert ostiary.mcp.refusal(MCPError(-32001, "x", {"error": 7})) is None
    assert ostiary.mcp.refusal(ValueError("not an MCP error")) is None
    refused = ostiary.mcp.refusal(
        MCPError(-32001, "m", {"error": "limit_exceeded", "limit": "calls", "used": 1, "max": 1})
    )
    assert isinstance(refused, ostiary.LimitExceeded) and refused.max == 1
