"""A browser app against the gateway: a real headless Chromium (Debian's package) loads a
page, served from another origin, that calls the gateway with the `openai` JS package from
npm (installed by `make install` into .venv/js). Its preflight carries the SDK's own
x-stainless-* headers: with --cors-origin the gateway allows them and the call succeeds."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .gateway_helpers import free_port, start_gateway

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / ".venv" / "js" / "node_modules" / "openai"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PAGE = """<!doctype html><html><body><pre id="out">pending</pre>
<script type="module">
import OpenAI from "/node_modules/openai/index.mjs";
const out = document.getElementById("out");
try {
  const client = new OpenAI({baseURL: "%(base)s", apiKey: "sk-browser", maxRetries: 0,
                             dangerouslyAllowBrowser: true});
  const r = await client.chat.completions.create(
    {model: "any", messages: [{role: "user", content: "Hi"}], max_tokens: 3});
  out.textContent = "OK " + r.choices[0].finish_reason + " " + r.usage.completion_tokens;
} catch (e) {
  out.textContent = "ERR " + e;
}
</script></body></html>"""


def _serve(folder: Path, port: int) -> ThreadingHTTPServer:
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _page_result(url: str) -> str:
    """The page's verdict once its script ran: Chromium waits for the fetches (virtual time)
    and then prints the DOM."""
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--virtual-time-budget=60000", "--dump-dom", url],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    m = re.search(r'<pre id="out">(.*?)</pre>', out.stdout, re.S)
    return m.group(1) if m else f"no page: {out.stdout[-500:]} {out.stderr[-2000:]}"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium missing (make install installs it)")
@pytest.mark.skipif(not JS.is_dir(), reason="the openai npm package is missing (make install)")
def test_openai_js_sdk_from_a_page_of_another_origin(umad, tmp_path) -> None:
    page_port = free_port()
    origin = f"http://127.0.0.1:{page_port}"
    for cors in (["--cors-origin", origin], []):
        gw = start_gateway(umad.socket, "--api-key", "sk-browser", *cors)
        site = tmp_path / ("cors" if cors else "plain")
        (site / "node_modules").mkdir(parents=True)
        (site / "node_modules" / "openai").symlink_to(JS)
        (site / "index.html").write_text(PAGE % {"base": f"{gw.url}/v1"})
        server = _serve(site, page_port)
        try:
            verdict = _page_result(f"{origin}/index.html")
        finally:
            server.shutdown()
            server.server_close()
            gw.stop()
        if cors:
            assert verdict.startswith("OK "), verdict
        else:  # without --cors-origin the browser refuses the answer
            assert verdict.startswith("ERR "), verdict
