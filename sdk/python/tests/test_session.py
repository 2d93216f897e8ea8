"""``with ostiary.session(...)`` and ``async with``: the environment the block and its
subprocesses get, what is put back afterwards, and the teardown — also when the block raises."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

import ostiary
from _proxy import Proxy
from _rig import gone, unique, url
from _upstream import Upstream

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")


def test_the_block_and_its_subprocesses_go_through_the_proxy(
    control_env: Proxy, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://before.invalid:1")
    monkeypatch.setenv("NO_PROXY", "*")
    item = unique("env")
    with ostiary.session(agent="env-agent", ttl="10m") as s:
        for name in PROXY_VARS:
            assert os.environ[name] == s.proxy_url
        assert s.token in os.environ["HTTPS_PROXY"], "the proxy URL carries the token"
        for name in CA_VARS:
            assert os.environ[name] == s.ca_path
        assert Path(s.ca_path).read_text() == s.ca_pem
        assert s.ca_pem.startswith("-----BEGIN CERTIFICATE-----")
        assert os.environ["NO_PROXY"] == "" and os.environ["no_proxy"] == ""
        assert os.environ["OSTIARY_SESSION_ID"] == s.id
        ca_path = s.ca_path
        # curl reads HTTPS_PROXY and CURL_CA_BUNDLE from the environment it inherited.
        curl = subprocess.run(
            ["curl", "-q", "-sS", url(upstream.port, f"/items/{item}")],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert curl.returncode == 0, curl.stderr
        assert json.loads(curl.stdout) == {"id": item, "method": "GET"}
        # So does a Python tool using requests (REQUESTS_CA_BUNDLE).
        code = (
            "import requests, sys; r = requests.get(sys.argv[1], timeout=30); "
            "print(r.status_code, r.json()['id'])"
        )
        tool = subprocess.run(
            [sys.executable, "-c", code, url(upstream.port, f"/items/{item}-py")],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert tool.stdout.split() == ["200", f"{item}-py"], tool.stderr
        # And a refusal reaches the subprocess as Ostiary's JSON.
        refused = subprocess.run(
            ["curl", "-q", "-sS", url(upstream.port, f"/secrets/{item}")],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert json.loads(refused.stdout)["policies"] == ["no-secrets"]
        session_id = s.id
    # Everything is put back as it was, the CA file removed, the session ended.
    assert os.environ["HTTPS_PROXY"] == "http://before.invalid:1"
    assert os.environ["NO_PROXY"] == "*"
    for name in ("HTTP_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "no_proxy"):
        assert name not in os.environ, name
    for name in (*CA_VARS, "OSTIARY_SESSION_ID"):
        assert name not in os.environ, name
    assert not Path(ca_path).exists()
    assert gone(session_id)
    assert upstream.count("GET", f"/items/{item}") == 1


def test_the_session_is_torn_down_even_when_the_block_raises(control_env: Proxy) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with ostiary.session(agent="crashy") as s:
            session_id, ca_path = s.id, s.ca_path
            assert not gone(session_id)
            raise Boom("the agent failed")
    assert gone(session_id)
    assert not Path(ca_path).exists()
    assert "HTTPS_PROXY" not in os.environ
    # Its token is refused by the proxy from now on.
    shown = control_env.cli("sessions", "show", session_id)
    assert shown.returncode == 1, shown.stdout


def test_async_with_tears_down_too(control_env: Proxy, upstream: Upstream) -> None:
    class Boom(Exception):
        pass

    seen: dict[str, str] = {}

    async def main() -> None:
        async with ostiary.session(agent="async-env") as s:
            seen["id"] = s.id
            assert os.environ["HTTPS_PROXY"] == s.proxy_url
            async with s.async_client() as http:
                item = unique("aenv")
                assert (await http.get(url(upstream.port, f"/items/{item}"))).status_code == 200
        assert gone(seen["id"])
        with pytest.raises(Boom):
            async with ostiary.session(agent="async-crashy") as s:
                seen["crashed"] = s.id
                raise Boom()

    asyncio.run(main())
    assert gone(seen["crashed"])
    assert "HTTPS_PROXY" not in os.environ


def test_a_session_ended_from_the_cli_inside_the_block_exits_cleanly(control_env: Proxy) -> None:
    with ostiary.session(agent="terminated") as s:
        done = control_env.cli("sessions", "terminate", s.id)
        assert done.returncode == 0, done.stderr
    # Leaving did not raise: the session is gone, which is what a teardown wants.
    assert gone(s.id)


def test_set_env_false_leaves_the_environment_alone(control_env: Proxy, upstream: Upstream) -> None:
    with ostiary.session(agent="quiet", set_env=False) as s:
        assert "HTTPS_PROXY" not in os.environ
        env = s.env
        assert env["HTTPS_PROXY"] == s.proxy_url and env["SSL_CERT_FILE"] == s.ca_path
        item = unique("quiet")
        curl = subprocess.run(
            ["curl", "-q", "-sS", url(upstream.port, f"/items/{item}")],
            capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **env},
        )
        assert json.loads(curl.stdout)["id"] == item, curl.stderr


def test_the_session_object_outside_its_block(control_env: Proxy) -> None:
    s = ostiary.session(agent="lazy")
    assert "not started" in repr(s)
    with pytest.raises(RuntimeError, match="not started"):
        s.token  # noqa: B018
    with s:
        with pytest.raises(RuntimeError, match="already started"):
            s.__enter__()
        assert repr(s) == f"Session(id={s.id!r}, agent='lazy', proxy={s.created.proxy_address!r})"
        assert s.token not in repr(s) and s.token not in repr(s.created)
        assert s.created.proxy_address.startswith("http://127.0.0.1:")


def test_a_budget_and_ttl_given_to_the_session_are_the_sessions(control_env: Proxy) -> None:
    with ostiary.session(agent="bounded", max_calls=7, max_cost=1.5, ttl=timedelta(minutes=5)) as s:
        assert s.created.limits["max_calls"] == 7
        assert s.created.limits["max_cost"] == 1.5
        status = s.status()
        assert status.state == "live" and status.agent == "bounded"
        assert status.limits["max_calls"] == 7
