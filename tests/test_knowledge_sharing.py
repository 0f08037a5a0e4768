"""Knowledge collections shared with groups, on a real server over the stand-in model and embedder: alice shares
her collection with a group; bob, in it, lists it, names it in a chat and searches it over Serge's `/mcp`,
read-only; carol, in no such group, finds it absent everywhere (a 404 in each route's own shape) until alice
shares it with everyone. The shares are in the audit log; `serge groups share ... collection` does the same."""

from __future__ import annotations

import re
from contextlib import closing

import pytest

import documents as files
from conftest import BROWSER, own_server
from test_accounts_api import add_user, login, serge
from test_chat_documents import QUESTION, asked_text, documents_engine, new_chat, recorder  # noqa: F401
from test_chats_api import send
from test_knowledge import indexed, make, put
from test_mcp_server import call, structured


@pytest.fixture(scope="module")
def site(standin_settings, recorder, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("sharing-data")
    with documents_engine(standin_settings, recorder) as (settings, engine), \
            own_server(settings, engine, data_dir) as url:
        add_user(data_dir, "dave", "--admin")
        for name in ("alice", "bob", "carol"):
            add_user(data_dir, name)
        serge(data_dir, "groups", "add", "harbour-crew")
        serge(data_dir, "groups", "join", "harbour-crew", "bob")
        with closing(login(url, "alice")) as alice:
            harbour = make(alice, "harbour")
            assert put(alice, harbour["id"], "minutes.pdf", files.long_report_pdf()).status_code == 201
            indexed(alice, harbour["id"])
        yield {"url": url, "data_dir": data_dir, "collection": harbour["id"],
               "bob": serge(data_dir, "keys", "create", "bob", "--name", "agent").strip(),
               "carol": serge(data_dir, "keys", "create", "carol", "--name", "agent").strip()}


def shares(client, collection: str, groups: list[str], everyone: bool = False):
    return client.put(f"/api/knowledge/{collection}/shares", json={"groups": groups, "everyone": everyone})


def test_a_collection_shared_with_a_group_is_read_and_searched_by_its_members_only(site, recorder):
    url, collection = site["url"], site["collection"]
    with closing(login(url, "alice")) as alice, closing(login(url, "bob")) as bob, \
            closing(login(url, "carol")) as carol:
        assert [c["name"] for c in bob.get("/api/knowledge").json()["data"]] == []  # hers alone, at first
        made = shares(alice, collection, ["harbour-crew"])
        assert made.status_code == 200, made.text
        assert made.json()["shared_with"] == {"groups": ["harbour-crew"], "everyone": False} and made.json()["mine"]

        # bob lists it (read-only), reads its files, names it in a chat by name and by id, and searches it
        [listed] = bob.get("/api/knowledge").json()["data"]
        assert (listed["id"], listed["mine"], listed["read_only"]) == (collection, False, True)
        assert bob.get(f"/api/knowledge/{collection}/files").json()["data"][0]["name"] == "minutes.pdf"
        chat = new_chat(bob)
        _, reply = send(bob, f"/api/chats/{chat}/messages", {"content": QUESTION, "knowledge": ["harbour"]})
        assert files.PAGE_THREE_FACT in " ".join(asked_text(recorder).split())
        assert (reply["sources"][0]["file"], reply["sources"][0]["collection"]) == ("minutes.pdf", "harbour")
        second = bob.post("/api/chats", json={"knowledge": [collection], "settings": {"max_new_tokens": 4}})
        assert second.status_code == 201, second.text
        assert [c["name"] for c in structured(call(site, site["bob"], "list_collections", {}))] == ["harbour"]
        found = structured(call(site, site["bob"], "search_knowledge", {"collection": "harbour", "query": QUESTION}))
        assert found and found[0]["file"] == "minutes.pdf"

        # read-only for him: every change is a 403
        for method, path, body in (("PATCH", "", {"name": "mine"}), ("POST", "/reindex", None),
                                   ("POST", "/cancel", None), ("DELETE", "", None),
                                   ("PUT", "/shares", {"groups": [], "everyone": True})):
            answer = bob.request(method, f"/api/knowledge/{collection}{path}", json=body)
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "collection_read_only", answer.text
        assert put(bob, collection, "x.md", b"x").status_code == 403
        file_id = alice.get(f"/api/knowledge/{collection}/files").json()["data"][0]["id"]
        assert bob.delete(f"/api/knowledge/{collection}/files/{file_id}").status_code == 403

        # carol, in no group it is shared with: absent from her list, a 404 wherever she names it
        assert carol.get("/api/knowledge").json()["data"] == []
        assert carol.get(f"/api/knowledge/{collection}").status_code == 404
        assert carol.get(f"/api/knowledge/{collection}/files").status_code == 404
        answer = carol.post(f"/api/chats/{new_chat(carol)}/messages", json={"content": "?", "knowledge": ["harbour"]})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "collection_not_found"
        assert carol.post("/api/chats", json={"knowledge": [collection]}).status_code == 404
        assert structured(call(site, site["carol"], "list_collections", {})) == []
        refused = call(site, site["carol"], "search_knowledge", {"collection": "harbour", "query": QUESTION})
        assert refused.is_error and "no collection 'harbour'" in refused.content[0].text

        # an unknown group is a 404; shared with everyone, carol reads it too; unshared, bob's chat no longer searches it
        assert shares(alice, collection, ["no-such-group"]).status_code == 404
        assert shares(alice, collection, [], everyone=True).json()["shared_with"] == {"groups": [], "everyone": True}
        assert [c["name"] for c in carol.get("/api/knowledge").json()["data"]] == ["harbour"]
        assert shares(alice, collection, []).status_code == 200
        assert bob.get("/api/knowledge").json()["data"] == [] and carol.get("/api/knowledge").json()["data"] == []
        _, reply = send(bob, f"/api/chats/{second.json()['id']}/messages", {"content": QUESTION})
        assert not any(s["collection"] == "harbour" for s in reply.get("sources") or [])

    with closing(login(url, "dave")) as dave:
        audit = dave.get("/api/audit").json()["data"]
        said = [(e["actor"], e["action"], e["target"]) for e in audit if "collection harbour" in e["target"]]
        assert ("alice", "share", f"collection harbour ({collection}) with harbour-crew") in said, said
        assert ("alice", "unshare", f"collection harbour ({collection}) from everyone") in said, said


def test_an_admin_shares_a_collection_with_serge_groups_and_changes_one_shared_with_them(site):
    data_dir, collection = site["data_dir"], site["collection"]
    said = serge(data_dir, "groups", "share", "harbour-crew", "collection", "alice/harbour")
    assert "alice/harbour" in said
    assert "collection alice/harbour harbour-crew" in " ".join(serge(data_dir, "groups", "shares").split())
    with closing(login(site["url"], "bob")) as bob, closing(login(site["url"], "dave")) as dave:
        assert [c["id"] for c in bob.get("/api/knowledge").json()["data"]] == [collection]
        assert dave.get(f"/api/knowledge/{collection}").status_code == 404  # an admin too sees only what is shared
        serge(data_dir, "groups", "join", "harbour-crew", "dave")
        renamed = dave.patch(f"/api/knowledge/{collection}", json={"name": "harbour-minutes"})
        assert renamed.status_code == 200 and renamed.json()["name"] == "harbour-minutes"  # admins change it
        audit = dave.get("/api/audit").json()["data"]
        assert any(e["actor"].startswith("cli:") and e["action"] == "share"
                   and e["target"] == "collection alice/harbour with harbour-crew" for e in audit), audit
    serge(data_dir, "groups", "unshare", "harbour-crew", "collection", "alice/harbour-minutes")
    with closing(login(site["url"], "bob")) as bob:
        assert bob.get("/api/knowledge").json()["data"] == []


def sign_in(page, url: str, name: str) -> None:
    from test_accounts_api import PASSWORDS

    page.goto(url + "/login")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Password").fill(PASSWORDS[name])
    page.get_by_role("button", name=re.compile("Log in|Sign in")).click()


@BROWSER[0]
@BROWSER[1]
def test_the_owner_shares_from_the_knowledge_page_and_a_member_sees_it_read_only(site, browser):
    expect = pytest.importorskip("playwright.sync_api").expect
    for name, steps in (("alice", "share"), ("bob", "read")):
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        try:
            sign_in(page, site["url"], name)
            page.goto(site["url"] + "/knowledge")
            card = page.locator("article.collection").first
            if steps == "share":
                card.locator("summary", has_text="Share").click()
                card.get_by_label(re.compile("Groups to share")).fill("harbour-crew")
                card.get_by_role("button", name="Share", exact=True).click()
                expect(card.locator("summary")).to_have_text("Shared with harbour-crew")
            else:
                expect(card).to_contain_text("shared with you · read-only")
                expect(card.get_by_role("button", name="Re-index")).to_have_count(0)
        finally:
            context.close()
