"""A person managing models in Debian's Chromium: pull from the (local) hub, chat, switch models, delete."""

from __future__ import annotations

import re
import time

import pytest
from conftest import BROWSER, MODEL, TINY_REPO, ServerThread, models_dir, set_setting, held_port

from serge.engine import Engine, ModelLibrary
from serge.settings import Settings
from serge.web.app import build_app

pytestmark = [pytest.mark.real_model, *BROWSER]
expect = pytest.importorskip("playwright.sync_api").expect
PULLED = TINY_REPO.lower()


@pytest.fixture(scope="module")
def server(tmp_path_factory, fake_hub):
    """A server with the bundled model (its checkpoint, hard-linked) that pulls from the fake hub."""
    data = tmp_path_factory.mktemp("models-page")
    checkpoint = ModelLibrary(models_dir()).find(MODEL).transformers_folder()
    ModelLibrary(data / "models").import_path(checkpoint, MODEL, log=lambda _: None)
    settings = Settings(data_dir=data, models_dir=data / "models", hf_endpoint=fake_hub.url, port=held_port())
    with Engine(settings) as engine, ServerThread(build_app(settings, engine), settings.port) as running:
        yield running.url


def reply_done(page, index: int):
    reply = page.locator('[data-role="assistant"]').nth(index)
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=180_000)
    return reply


def test_a_person_pulls_a_model_chats_with_it_switches_models_and_deletes_it(page, server, fake_hub):
    fake_hub.reset()
    fake_hub.faults.bytes_per_s = 12 * 2**20  # about 2 s for the 28 MB tiny checkpoint: the bar is seen moving
    page.goto(server + "/models")
    expect(page.locator("#loaded-list")).to_contain_text(MODEL)
    page.get_by_label("Hugging Face repo").fill(TINY_REPO)
    page.get_by_role("button", name="Pull").click()
    bar = page.locator("#pull-bar")
    expect(page.locator("#pull-name")).to_have_text(PULLED)
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and bar.get_attribute("data-state") != "done":
        seen.append(float(bar.evaluate("b => b.value")))
        time.sleep(0.1)
    expect(bar).to_have_attribute("data-state", "done")
    assert bar.evaluate("b => b.value") == 100
    assert any(0 < v < 100 for v in seen), f"the bar never showed a step between 0 and 100: {sorted(set(seen))}"
    assert seen == sorted(seen), "the bar never went back"
    expect(page.locator("#status")).to_contain_text(f"Installed {PULLED}")
    row = page.locator(f'tr[data-model="{PULLED}"]')
    expect(row).to_contain_text("LlamaForCausalLM")
    expect(row).to_contain_text("6M")  # its parameters
    fake_hub.reset()

    # chat with it
    page.goto(server + "/")
    page.get_by_role("button", name="Settings").click()
    picker = page.get_by_label("Model")
    labels = picker.locator("option").all_inner_texts()
    assert labels == [f"{MODEL} (default)", PULLED], "each model once, the default marked"
    picker.select_option(label=PULLED)
    set_setting(page, "Max tokens", "6")
    set_setting(page, "Temperature", "0")
    page.get_by_role("button", name="Close").click()
    page.get_by_label("Message").fill("Say hello.")
    page.get_by_label("Message").press("Enter")
    expect(reply_done(page, 0).locator(".model")).to_have_text(PULLED)

    # switch the same chat to the default model
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Model").select_option(label=f"{MODEL} (default)")
    expect(page.locator("#settings-saved")).to_have_text("Saved.")
    page.get_by_role("button", name="Close").click()
    page.get_by_label("Message").fill("And goodbye.")
    page.get_by_label("Message").press("Enter")
    expect(reply_done(page, 1).locator(".model")).to_have_text(MODEL)
    page.reload()
    models = page.locator('[data-role="assistant"] .model').all_inner_texts()
    assert models == [PULLED, MODEL], "each reply says which model wrote it"

    # both are loaded now; delete the pulled one
    page.goto(server + "/models")
    expect(page.locator("#loaded-list li")).to_have_count(2)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Delete {PULLED}").click()
    expect(page.locator("#status")).to_have_text(f"Deleted {PULLED}.")
    expect(page.locator(f'tr[data-model="{PULLED}"]')).to_have_count(0)
    expect(page.locator("#loaded-list li")).to_have_count(1)
    expect(page.locator("#loaded-list")).to_contain_text(MODEL)
