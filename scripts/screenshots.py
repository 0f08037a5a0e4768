#!/usr/bin/env python3
"""Retake the README's screenshots from a real run: `serge serve` on the bundled model, driven in Chromium.

    python scripts/screenshots.py [--out docs] [--model smollm2-135m-instruct] [--port N]

Starts `serge serve` on a free port with a data dir of its own (a temporary one: never
your chats), then, in Debian's Chromium through Playwright (never a browser Playwright
downloads): asks a question and keeps the page with its real reply and this machine's
tokens/s (docs/screenshot.png); attaches a 32-page PDF made here, longer than the model's
window, whose one fact is on page 3, asks about it and keeps the reply with its sources (file
and pages) listed under it (docs/screenshot-sources.png); and builds a collection from the
same PDF on the Knowledge page (docs/screenshot-knowledge.png). Needs the dev extra (playwright, reportlab), the
bundled chat and embedding models installed (`make model`), and /usr/bin/chromium.
Stops the server and removes its data dir at the end, also on failure.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 800}
FIRST_QUESTION = "Give me three tips for keeping a basil plant alive on a windowsill."
QUESTION = "Who is the lighthouse keeper on Skerry Island?"
FACT = ("The lighthouse keeper on Skerry Island is Ottoline Vance. Ottoline Vance took over the post in April "
        "and lives in the keeper's cottage beside the tower.")
TOPICS = ["the harbour budget", "the ferry timetable", "the island's lighthouse", "road repairs",
          "the spring festival", "the school roof", "waste collection", "the museum's opening hours",
          "winter storm damage", "the library's new wing", "parking by the quay", "the fishing quotas",
          "the footpath to the north beach", "street lighting", "the market square", "the bus shelter",
          "the sea wall", "the allotments", "the swimming pool", "dog fouling", "the war memorial",
          "the bowling green", "broadband", "the lifeboat station", "the village hall", "the tourist office",
          "the cemetery", "the harbour dredging", "the youth club", "the post office", "the wind farm",
          "next year's plans"]


def minutes_pdf() -> bytes:
    """Council minutes of 32 pages of about 2,400 characters each (some 12,000 tokens): more than the model's
    window, so they go in as the passages best for the question and the reply lists their pages; the one fact
    asked about is on page 3 alone."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate

    styles, story = getSampleStyleSheet(), []
    for number, topic in enumerate(TOPICS, start=1):
        story.append(Paragraph(f"Harbour council minutes, item {number}: {topic}", styles["Heading2"]))
        if number == 3:
            story.append(Paragraph(FACT, styles["BodyText"]))
        for month in ("January", "February", "March", "April", "May", "June", "July", "August"):
            story.append(Paragraph(f"In {month} the council heard a report on {topic}. Members asked for the "
                                   f"figures of {month} to be set beside last year's, and agreed to return "
                                   f"to {topic} at the next meeting.", styles["BodyText"]))
        story.append(PageBreak())
    out = io.BytesIO()
    SimpleDocTemplate(out, pagesize=A4, title="Harbour council minutes").build(story)
    return out.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serge serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"serge serve did not answer {url}/api/health in {timeout_s:.0f} s")


def ask(page, question: str) -> None:
    """Send `question` and wait for the whole reply."""
    import re

    from playwright.sync_api import expect

    box = page.get_by_label("Message")
    box.fill(question)
    box.press("Enter")
    reply = page.locator('[data-role="assistant"]').last
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=300_000)


def keep(page, path: Path) -> None:
    """A screenshot of the viewport, as a small PNG (256 colours where that is smaller)."""
    from PIL import Image

    page.mouse.move(0, VIEWPORT["height"] - 1)  # no hover left on a button
    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    full, fewer = io.BytesIO(), io.BytesIO()
    image.save(full, "PNG", optimize=True)
    image.quantize(colors=256).save(fewer, "PNG", optimize=True)
    path.write_bytes(min(full.getvalue(), fewer.getvalue(), key=len))
    print(f"wrote {path} ({path.stat().st_size // 1024} KB)")


def take(url: str, out: Path, pdf: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.goto(url + "/")
        ask(page, FIRST_QUESTION)
        keep(page, out / "screenshot.png")

        page.get_by_role("button", name="New chat").click()
        page.set_input_files("#attach-input", str(pdf))
        expect(page.locator("#attachments .attachment")).to_have_count(1)
        ask(page, QUESTION)
        expect(page.locator('[data-role="assistant"] .sources .source').first).to_be_visible()
        keep(page, out / "screenshot-sources.png")

        page.goto(url + "/knowledge")
        page.get_by_label("Name").fill("harbour")
        page.get_by_role("button", name="Create").click()
        card = page.locator('.collection[data-name="harbour"]')
        with page.expect_file_chooser() as chooser:
            card.get_by_role("button", name="Upload files to harbour").click()
        chooser.value.set_files(str(pdf))
        expect(card.locator("tr.file .state")).to_have_text("indexed", timeout=300_000)
        keep(page, out / "screenshot-knowledge.png")
        browser.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python scripts/screenshots.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs", help="where the PNGs go (default docs/)")
    ap.add_argument("--model", default=None, help="the chat model (default: the server's default)")
    ap.add_argument("--port", type=int, default=0, help="of the server (default: a free one)")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install chromium")
    from serge.settings import Settings

    data = Path(tempfile.mkdtemp(prefix="serge-screenshots-"))
    port = args.port or free_port()
    pdf = data / "harbour-minutes.pdf"
    pdf.write_bytes(minutes_pdf())
    command = [sys.executable, "-c", "from serge.cli.main import main; main()", "serve", "--port", str(port),
               "--data-dir", str(data / "serge"), "--models-dir", str(Settings().models_path)]
    command += ["--model", args.model] if args.model else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen(command, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        args.out.mkdir(parents=True, exist_ok=True)
        take(url, args.out, pdf)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
