"""Child sessions: created with the parent's own token, budgets carved out of the parent's,
their own environment inside their block, and never outliving the parent."""

from __future__ import annotations

import os

import pytest

import ostiary
from _proxy import Proxy
from _rig import gone, unique, url
from _upstream import Upstream


def test_a_child_is_carved_out_of_its_parent(control_env: Proxy, upstream: Upstream) -> None:
    with ostiary.session(agent="planner", max_calls=4) as parent:
        with parent.child(max_calls=1) as child:
            assert child.created.parent == parent.id
            assert child.created.depth == 1
            assert child.agent == "planner", "a child runs as its parent's agent"
            assert child.token != parent.token
            # The block is the child's now; the parent's comes back after.
            assert os.environ["HTTPS_PROXY"] == child.proxy_url
            assert parent.status().children == (child.id,)
            with child.client() as http:
                assert http.get(url(upstream.port, f"/items/{unique('c')}")).status_code == 200
                with pytest.raises(ostiary.LimitExceeded) as caught:
                    http.get(url(upstream.port, f"/items/{unique('c')}"))
            assert (caught.value.limit, caught.value.used, caught.value.max) == ("calls", 1, 1)
            child_id = child.id
        assert os.environ["HTTPS_PROXY"] == parent.proxy_url
        assert gone(child_id), "leaving the child's block ended it"
        assert not gone(parent.id)
        # What the child did not use went back; what it used is gone: 4 - 1 = 3 left.
        with parent.client() as http:
            for _ in range(3):
                assert http.get(url(upstream.port, f"/items/{unique('p')}")).status_code == 200
            with pytest.raises(ostiary.LimitExceeded):
                http.get(url(upstream.port, f"/items/{unique('p')}"))


def test_a_child_asking_more_than_is_left_is_refused(control_env: Proxy) -> None:
    with ostiary.session(agent="frugal", max_calls=2) as parent:
        with pytest.raises(ostiary.LimitExceeded) as caught:
            with parent.child(max_calls=5):
                pytest.fail("the child must not be created")
        assert caught.value.status == 429
        assert caught.value.limit == "calls"
        assert caught.value.max == 2, "max is what the parent has left"
        assert parent.status().children == ()
        assert os.environ["HTTPS_PROXY"] == parent.proxy_url, "the parent's block is intact"


def test_a_session_spawns_without_the_admin_token_and_its_children_end_with_it(
    control_env: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ostiary.session(agent="spawner", max_calls=10) as parent:
        monkeypatch.delenv("OSTIARY_ADMIN_TOKEN")
        # What a sub-agent process has: the control URL and its parent's session.
        with ostiary.ControlClient() as agent_side:
            child = agent_side.create_session(parent=parent.created, max_calls=2)
            with pytest.raises(ostiary.ConfigurationError, match="admin token"):
                agent_side.teardown(child.session_id)
        monkeypatch.setenv("OSTIARY_ADMIN_TOKEN", control_env.admin_token)
        assert child.parent == parent.id and child.limits["max_calls"] == 2
        assert not gone(child.session_id)
    assert gone(child.session_id), "tearing down the parent tears down its children"


def test_a_paused_parent_spawns_nothing(control_env: Proxy, upstream: Upstream) -> None:
    same = url(upstream.port, f"/items/{unique('ploop')}")
    with ostiary.session(agent="paused-parent") as parent:
        with parent.client() as http:
            for _ in range(3):
                http.post(same, json={})
            with pytest.raises(ostiary.SessionPaused):
                http.post(same, json={})
        with pytest.raises(ostiary.SessionPaused) as caught:
            with parent.child():
                pytest.fail("a paused session must not spawn")
        assert caught.value.status == 423
