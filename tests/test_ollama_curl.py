"""Ollama's README examples as they are typed: `curl -d '{...}'`, which curl sends as a form, answered as JSON
on Ollama's routes (as Ollama does), while a form that another site's page posts through a real Chromium is
still refused and generates nothing. On the stand-in model, a real server, the real curl."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conftest import BROWSER, server_of_its_own
from standin import NAME as MODEL, stand_in

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

CURL = shutil.which("curl")
needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed")
QUICK = {"temperature": 0, "num_predict": 8}


def requests_of(engine) -> int:
    return engine.metrics.snapshot()[MODEL].requests if MODEL in engine.metrics.snapshot() else 0


def curl(url: str, body: dict) -> tuple[int, str]:
    """`curl URL -d BODY` as Ollama's README has it; (status, body)."""
    done = subprocess.run([CURL, "-sS", "-o", "-", "-w", "\n%{http_code}", url, "-d", json.dumps(body)],
                          capture_output=True, text=True, timeout=120, check=True)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), text


@needs_curl
def test_curl_d_to_ollama_chat_is_answered_as_json(server):
    status, text = curl(f"{server}/api/chat", {"model": MODEL, "stream": False, "options": QUICK,
                                               "messages": [{"role": "user", "content": "Why is the sky blue?"}]})
    assert status == 200, text
    reply = json.loads(text)
    assert reply["done"] is True and reply["message"]["role"] == "assistant" and reply["message"]["content"]


@needs_curl
def test_curl_d_to_ollama_generate_streams_its_records(server):
    status, text = curl(f"{server}/api/generate", {"model": MODEL, "prompt": "Why is the sky blue?", "options": QUICK})
    assert status == 200, text
    records = [json.loads(line) for line in text.splitlines() if line]
    assert len(records) > 1 and records[-1]["done"] is True


@needs_curl
def test_a_curl_d_body_that_is_not_json_is_a_400_in_ollamas_shape(server):
    done = subprocess.run([CURL, "-sS", "-w", "\n%{http_code}", f"{server}/api/chat", "-d", "model=x"],
                          capture_output=True, text=True, timeout=60, check=True)
    text, _, status = done.stdout.rpartition("\n")
    assert status == "400" and "not valid JSON" in json.loads(text)["error"]


def test_a_form_body_is_still_refused_on_serges_own_json_apis(server):
    answer = httpx.post(f"{server}/api/chats", content=b'{"title": "x"}',
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 415 and "send application/json" in answer.json()["error"]["message"]


@pytest.mark.parametrize("browser_says", [{"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                                          {"Sec-Fetch-Site": "same-origin"}])
def test_a_form_body_that_a_browser_marks_is_not_read_as_json(server, engine, browser_says):
    before = requests_of(engine)
    body = json.dumps({"model": MODEL, "prompt": "hi", "stream": False, "options": QUICK})
    answer = httpx.post(f"{server}/api/generate", content=body,
                        headers={"Content-Type": "application/x-www-form-urlencoded", **browser_says})
    assert answer.status_code in (403, 415) and set(answer.json()) == {"error"}, answer.text
    assert requests_of(engine) == before, "nothing was generated"


class _Attacker(BaseHTTPRequestHandler):
    """Another site: one page whose script posts Ollama's JSON to Serge's /api/generate as a form (the one way a
    page can send JSON text under a form type: `fetch` in no-cors mode), and one that submits a real form."""

    target = ""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"model": MODEL, "prompt": "hi", "stream": False})
        if self.path == "/fetch":
            script = (f"fetch({json.dumps(self.target + '/api/generate')}, {{method: 'POST', mode: 'no-cors', "
                      f"headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: {json.dumps(body)}}})")
            page = f"<script>{script}</script>"
        else:
            page = (f'<form id="f" method="post" action="{self.target}/api/generate">'
                    f'<input name="prompt" value="hi"><input name="model" value="{MODEL}"></form>'
                    '<script>document.getElementById("f").submit()</script>')
        data = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@BROWSER[0]
@BROWSER[1]
@pytest.mark.parametrize(("width", "how"), [(1280, "/fetch"), (390, "/fetch"), (1280, "/form"), (390, "/form")])
def test_a_form_type_post_from_another_sites_page_to_ollama_is_refused(browser, server, engine, width, how):
    handler = type("Attacker", (_Attacker,), {"target": server})
    site = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    context = browser.new_context(viewport={"width": width, "height": 860})
    try:
        page = context.new_page()
        before = requests_of(engine)
        with page.expect_request(lambda r: r.url.endswith("/api/generate")) as sent:
            page.goto(f"http://localhost:{site.server_address[1]}{how}")
        assert sent.value.headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
        answer = sent.value.response()  # None for fetch: Serge's Cross-Origin-Resource-Policy hides it from the page
        assert answer is None if how == "/fetch" else answer.status == 403
        assert requests_of(engine) == before, "nothing was generated"
    finally:
        context.close()
        site.shutdown()
