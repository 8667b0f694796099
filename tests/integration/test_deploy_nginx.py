"""deploy/nginx/uma.conf in a real nginx (Debian's package, installed by `make install`) in
front of two gateway + umad pairs: a session key keeps its pair, and a pair whose core or
whose gateway is stopped is routed around."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .gateway_helpers import Gateway, free_port, start_gateway
from .helpers import Daemon, start_daemon

CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "uma.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = pytest.mark.skipif(
    not Path(NGINX).exists(), reason="nginx not installed (make install installs it)"
)


class Nginx:
    def __init__(self, gateways: list[Gateway], tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ports = [g.url.rsplit(":", 1)[1] for g in gateways]
        self.upstreams = [f"127.0.0.1:{p}" for p in ports]
        site = CONF.read_text()
        servers = re.findall(r"^\s*server 10\.0\.0\.\d+:8000 .*$", site, re.M)
        assert len(servers) == len(gateways), "uma.conf lists two example gateways"
        for line, upstream in zip(servers, self.upstreams, strict=True):
            site = site.replace(line, re.sub(r"10\.0\.0\.\d+:8000", upstream, line))
        site = site.replace("listen 80;", f"listen 127.0.0.1:{self.port};")
        (tmp / "uma.conf").write_text(site)
        (tmp / "nginx.conf").write_text(
            f"daemon off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log warn;\n"
            "events {}\n"
            f"http {{\n  access_log off;\n  client_body_temp_path {tmp}/body;\n"
            f"  proxy_temp_path {tmp}/proxy;\n  include {tmp}/uma.conf;\n}}\n"
        )
        check = subprocess.run(
            [NGINX, "-t", "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", "stderr"],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stderr
        self.log = tmp / "nginx.out"
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", "stderr"],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{self.url}/health", timeout=2)
                return
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start:\n{self.log.read_text()}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)


@pytest.fixture
def pairs() -> Iterator[tuple[list[Daemon], list[Gateway], Path]]:
    with tempfile.TemporaryDirectory(prefix="uma-nginx-") as tmp:
        root = Path(tmp)
        cores, gateways = [], []
        try:
            for name in ("a", "b"):
                (root / name).mkdir()
                core = start_daemon(
                    root / name, "--threads", "1", "--n-seq", "2", "--n-ctx", "1024"
                )
                cores.append(core)
                gateways.append(start_gateway(core.socket, log_dir=root / name))
            yield cores, gateways, root
        finally:
            for g in gateways:
                g.stop()
            for c in cores:
                if c.proc.poll() is None:
                    c.stop()


def ask(nginx: Nginx, session: str) -> httpx.Response:
    return httpx.post(
        f"{nginx.url}/v1/completions",
        json={"prompt": f"Hello from {session}", "max_tokens": 2, "temperature": 0},
        headers={"X-Session-Id": session},
        timeout=120,
    )


def test_nginx_keeps_sessions_on_a_pair_and_routes_around_a_stopped_one(pairs):
    cores, gateways, root = pairs
    nginx = Nginx(gateways, root)
    try:
        sessions = [f"conversation-{i}" for i in range(20)]
        home = {}
        for s in sessions:
            answers = [ask(nginx, s) for _ in range(3)]
            assert all(r.status_code == 200 for r in answers), answers[0].text
            where = {r.headers["x-uma-upstream"] for r in answers}
            assert len(where) == 1, f"{s} moved between {where}"  # affinity
            home[s] = where.pop()
        assert set(home.values()) == set(nginx.upstreams)  # both pairs take sessions

        # an SSE stream passes through unbuffered, to its [DONE]
        with httpx.stream(
            "POST",
            f"{nginx.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
            timeout=120,
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) >= 2

        a_sessions = [s for s in sessions if home[s] == nginx.upstreams[0]]
        # pair A's core stops: its gateway answers 503, nginx passes the request to B
        cores[0].stop()
        for s in a_sessions:
            r = ask(nginx, s)
            assert r.status_code == 200, r.text
            assert r.headers["x-uma-upstream"].split(", ")[-1] == nginx.upstreams[1]
        # pair A's gateway stops too: the connection is refused, nginx goes to B
        gateways[0].stop()
        for s in sessions:
            r = ask(nginx, s)
            assert r.status_code == 200, r.text
            assert r.headers["x-uma-upstream"].split(", ")[-1] == nginx.upstreams[1]
        # B's own sessions never left it
        for s in sessions:
            if home[s] == nginx.upstreams[1]:
                assert ask(nginx, s).headers["x-uma-upstream"] == nginx.upstreams[1]
    finally:
        nginx.stop()
