"""The real ``ostiary serve``, started as a child process on free loopback ports with its
own config, policies and state directory, and the real CLI run against it.

The binary is ``$OSTIARY_BIN`` (the Rust test ``tests/tests/sdk_python.rs`` passes the one it
built), else ``<repo>/target/debug/ostiary``. Proxy and CA variables are scrubbed from every
child, so the machine's settings cannot leak into a test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]

SCRUBBED = (
    "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
    "no_proxy", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "OSTIARY_CONFIG",
    "OSTIARY_ADMIN_TOKEN", "OSTIARY_CONTROL_URL", "OSTIARY_SESSION_ID", "OSTIARY_LOG_FORMAT",
)


def ostiary_bin() -> Path:
    named = os.environ.get("OSTIARY_BIN")
    path = Path(named) if named else REPO / "target" / "debug" / "ostiary"
    if not path.is_file():
        raise RuntimeError(
            f"the ostiary binary is not at {path}: set OSTIARY_BIN, or build it "
            "(cargo build -p ostiary-cli); the Rust test tests/tests/sdk_python.rs does both"
        )
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Proxy:
    """``ostiary --config <dir>/ostiary.toml serve``."""

    def __init__(self, dir: Path, config_body: str, policies: dict[str, str]) -> None:
        self.dir = dir
        self.state = dir / "state"
        self.config = dir / "ostiary.toml"
        self.log = dir / "serve.log"
        policy_dir = dir / "policies"
        policy_dir.mkdir(parents=True, exist_ok=True)
        for name, text in policies.items():
            (policy_dir / name).write_text(text)
        last = ""
        for _ in range(3):
            self.proxy_port, self.control_port = free_port(), free_port()
            self.config.write_text(
                f'[listen]\nproxy = "127.0.0.1:{self.proxy_port}"\n'
                f'control = "127.0.0.1:{self.control_port}"\n\n'
                f'[state]\ndir = "{self.state}"\n\n[policy]\ndir = "{policy_dir}"\n\n'
                + config_body
            )
            with open(self.log, "wb") as log:
                self.process = subprocess.Popen(
                    [str(ostiary_bin()), "--config", str(self.config), "serve"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=clean_env(OSTIARY_LOG="info"),
                )
            if self._wait_healthy():
                self.admin_token = (self.state / "admin.token").read_text().strip()
                return
            last = self.log.read_text(errors="replace")
            self._kill()
            if "binding" not in last:
                break
        raise RuntimeError(f"ostiary serve did not become healthy:\n{last}")

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    def _healthy(self) -> bool:
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"{self.control_url}/healthz", timeout=2
            ) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._healthy():
                return True
            time.sleep(0.05)
        return False

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``ostiary --config <config> <args>``, as an operator would run it."""
        return subprocess.run(
            [str(ostiary_bin()), "--config", str(self.config), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=clean_env(OSTIARY_LOG="warn"),
            check=False,
        )

    def cli_json(self, *args: str) -> Any:
        done = self.cli(*args, "--json")
        assert done.returncode == 0, f"ostiary {' '.join(args)}: {done.stderr}"
        return json.loads(done.stdout)

    def _kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM and a clean exit (every audit record committed), else a kill."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill()
