"""Sign-in with OpenID Connect on a real server over the stand-in model, against a provider the test controls
(oidc_fake.py): a good ID token signs a person in, and every forged one is refused with a clear error,
no account made and no session started.

The test plays the browser: it follows Serge to the provider's authorization URL, reads the state, nonce
and PKCE challenge Serge put there, has the provider's token endpoint answer with the token under test,
and calls Serge's callback with the cookie the start set.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import shlex
import sys
import time
from contextlib import closing, redirect_stdout
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from conftest import ServerThread, held_port, own_server
from oidc_fake import CLIENT_ID, CLIENT_SECRET, FakeProvider
from pydantic import ValidationError
from standin import stand_in

from serge.cli.main import main as serge_main
from serge.settings import Settings
from serge.store import AccountStore, Database

settings, engine = stand_in("settings", "engine")

ADMINS = "serge-admins"


@pytest.fixture(scope="module")
def provider():
    fake = FakeProvider()
    port = held_port()
    fake.url = f"http://127.0.0.1:{port}"
    with ServerThread(fake.app, port):
        yield fake


@pytest.fixture(scope="module")
def site(settings, engine, provider, tmp_path_factory):
    """A server whose first account (an admin, with a password) was made with `serge users add`."""
    folder = tmp_path_factory.mktemp("sign-in-oidc")
    saved, sys.stdin = sys.stdin, io.StringIO("root-password\n")
    try:
        with redirect_stdout(io.StringIO()):
            serge_main(["users", "add", "root", "--password-stdin", "--data-dir", str(folder)])
    finally:
        sys.stdin = saved
    with own_server(settings, engine, folder, oidc_issuer=provider.url, oidc_client_id=CLIENT_ID,
                    oidc_client_secret=CLIENT_SECRET, oidc_provider_name="Example ID", oidc_admin_claim="groups",
                    oidc_admin_value=ADMINS) as url:
        yield {"url": url, "data_dir": folder}


def users(site) -> dict[str, object]:
    """The accounts in the server's database, by name."""
    db = Database(f"sqlite:///{Path(site['data_dir']) / 'serge.db'}")
    try:
        return {u.name: u for u in AccountStore(db).users()}
    finally:
        db.close()


def start(client: httpx.Client, next_path: str = "/") -> dict[str, str]:
    """Press the sign-in button: the parameters Serge sends the provider."""
    response = client.get("/auth/oidc/start", params={"next": next_path})
    assert response.status_code == 303, response.text
    return {k: v[0] for k, v in parse_qs(urlsplit(response.headers["location"]).query).items()}


def sign_in(site, provider, mint, next_path: str = "/", client: httpx.Client | None = None):
    """A whole sign-in whose token endpoint answers with `mint(nonce)`: (the callback's answer, the client)."""
    client = client or httpx.Client(base_url=site["url"], timeout=60)
    sent = start(client, next_path)
    provider.mint = lambda: mint(sent["nonce"])
    answer = client.get("/auth/oidc/callback", params={"state": sent["state"], "code": "good-code"})
    return answer, client


def test_the_sign_in_button_sends_the_browser_to_the_provider_with_pkce_state_and_nonce(site, provider):
    with httpx.Client(base_url=site["url"]) as client:
        assert 'Sign in with Example ID' in client.get("/login").text
        sent = start(client, "/chat/abc")
    assert sent["client_id"] == CLIENT_ID and sent["response_type"] == "code"
    assert sent["redirect_uri"] == site["url"] + "/auth/oidc/callback"
    assert sent["code_challenge_method"] == "S256" and len(sent["code_challenge"]) == 43
    assert len(sent["state"]) >= 20 and len(sent["nonce"]) >= 20
    assert sent["scope"].split() == ["openid", "profile", "email"]


def test_a_good_id_token_signs_in_makes_the_account_once_and_goes_back_to_the_page_asked_for(site, provider):
    answer, client = sign_in(site, provider, provider.token, "/chat/abc")
    with closing(client):
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/chat/abc"
        me = client.get("/api/me").json()
        assert me | {"id": None} == {"id": None, "name": "ada", "admin": False, "email": "ada@example.org",
                                     "signed_in_by": "oidc", "groups": ["staff"], "pending": False,
                                     "by_api_key": False}
        assert provider.token_requests[-1]["authorization"].startswith("Basic ")  # the client's secret went too
        first = me["id"]
    again, other = sign_in(site, provider, provider.token)
    with closing(other):
        assert again.status_code == 303 and other.get("/api/me").json()["id"] == first
    assert [n for n in users(site) if n.startswith("ada")] == ["ada"]


def test_the_verifier_sent_for_the_code_matches_the_challenge_sent_to_the_browser(site, provider):
    with httpx.Client(base_url=site["url"], timeout=60) as client:
        sent = start(client)
        provider.mint = lambda: provider.token(sent["nonce"])
        assert client.get("/auth/oidc/callback", params={"state": sent["state"], "code": "good-code"}
                          ).status_code == 303
    verifier = provider.token_requests[-1]["code_verifier"]
    digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert digest == sent["code_challenge"]


FORGERIES = {
    "signed with a key the provider never published": (lambda p, n: p.token(n, key=p.other_key), "signature"),
    "alg none": (lambda p, n: p.unsigned(n), "ID token was refused"),
    "HS256 keyed with the public key": (lambda p, n: p.hmac_with_public_key(n), "ID token was refused"),
    "for another client": (lambda p, n: p.token(n, aud="another-app"), "another client (aud)"),
    "from another issuer": (lambda p, n: p.token(n, iss="https://evil.example"), "another issuer (iss)"),
    "expired": (lambda p, n: p.token(n, iat=int(time.time()) - 7200, exp=int(time.time()) - 3600), "expired"),
    "with another sign-in's nonce": (lambda p, n: p.token("a-nonce-from-before"), "nonce"),
    "without a nonce": (lambda p, n: p.token(None), "nonce"),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_id_token_is_refused_with_why_and_nobody_is_signed_in_or_made(site, provider, forgery):
    mint, why = FORGERIES[forgery]
    before = set(users(site))
    answer, client = sign_in(site, provider, lambda nonce: mint(provider, nonce), "/")
    with closing(client):
        assert answer.status_code == 400, answer.text
        assert "Sign-in failed" in answer.text and why in answer.text
        assert "serge_session" not in answer.cookies
        assert client.get("/api/me").status_code == 401
    assert set(users(site)) == before


def test_a_used_state_is_refused_when_replayed(site, provider):
    with httpx.Client(base_url=site["url"], timeout=60) as client:
        sent = start(client)
        provider.mint = lambda: provider.token(sent["nonce"])
        callback = {"state": sent["state"], "code": "good-code"}
        assert client.get("/auth/oidc/callback", params=callback).status_code == 303
        client.cookies.set("serge_sign_in", sent["state"], path="/auth/oidc")  # as a replaying attacker would
        replayed = client.get("/auth/oidc/callback", params=callback)
    assert replayed.status_code == 400 and "already used" in replayed.text


def test_a_callback_link_from_someone_elses_sign_in_does_not_sign_this_browser_in(site, provider):
    with httpx.Client(base_url=site["url"], timeout=60) as attacker, \
            httpx.Client(base_url=site["url"], timeout=60) as victim:
        sent = start(attacker)
        provider.mint = lambda: provider.token(sent["nonce"], sub="u-mallory", preferred_username="mallory")
        answer = victim.get("/auth/oidc/callback", params={"state": sent["state"], "code": "good-code"})
        assert answer.status_code == 400 and "not for a sign-in started in this browser" in answer.text
        assert victim.get("/api/me").status_code == 401
    assert "mallory" not in users(site)


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:x"])
def test_after_sign_in_the_browser_stays_on_this_site(site, provider, target):
    answer, client = sign_in(site, provider, provider.token, target)
    client.close()
    assert answer.status_code == 303 and answer.headers["location"] == "/"


def test_a_provider_that_says_no_is_a_clear_refusal(site, provider):
    with httpx.Client(base_url=site["url"], timeout=60) as client:
        sent = start(client)
        answer = client.get("/auth/oidc/callback", params={"state": sent["state"], "error": "access_denied",
                                                           "error_description": "the user said no"})
        assert answer.status_code == 400
        assert "Example ID did not sign you in: access_denied (the user said no)" in answer.text


def test_an_answer_naming_another_issuer_is_refused(site, provider):
    with httpx.Client(base_url=site["url"], timeout=60) as client:
        sent = start(client)
        provider.mint = lambda: provider.token(sent["nonce"])
        answer = client.get("/auth/oidc/callback", params={"state": sent["state"], "code": "good-code",
                                                           "iss": "https://evil.example"})
    assert answer.status_code == 400 and "names the issuer" in answer.text


def test_a_code_the_provider_refuses_is_a_clear_refusal(site, provider):
    with httpx.Client(base_url=site["url"], timeout=60) as client:
        sent = start(client)
        answer = client.get("/auth/oidc/callback", params={"state": sent["state"], "code": "stolen-code"})
    assert answer.status_code == 400 and "refused the code: invalid_grant" in answer.text


def test_a_provider_user_never_takes_over_a_local_account_of_the_same_name(site, provider, cli):
    assert cli("users", "add", "bo", "--password-stdin", "--data-dir", str(site["data_dir"]),
               stdin="bo-password\n").returncode == 0
    answer, client = sign_in(site, provider, lambda n: provider.token(n, sub="u-bo", preferred_username="bo"))
    with closing(client):
        me = client.get("/api/me").json()
    assert answer.status_code == 303
    assert me["name"].startswith("bo-") and len(me["name"]) == len("bo-") + 8
    assert users(site)["bo"].signed_in_by == "password"


def test_the_admin_claim_makes_and_unmakes_an_admin_at_each_sign_in_but_never_the_last_one(site, provider, cli):
    admin = lambda n: provider.token(n, sub="u-cy", preferred_username="cy", groups=["staff", ADMINS])  # noqa: E731
    plain = lambda n: provider.token(n, sub="u-cy", preferred_username="cy", groups=["staff"])  # noqa: E731

    def signs_in_as_admin(mint) -> bool:
        answer, client = sign_in(site, provider, mint)
        with closing(client):
            assert answer.status_code == 303
            return client.get("/api/me").json()["admin"]

    assert signs_in_as_admin(admin) is True
    assert signs_in_as_admin(plain) is False
    assert signs_in_as_admin(admin) is True
    assert cli("users", "rm", "root", "--data-dir", str(site["data_dir"])).returncode == 0
    assert signs_in_as_admin(plain) is True, "the only admin stays one: someone must manage the users"


def test_the_groups_claim_sets_the_persons_groups_at_each_sign_in_and_leaves_an_admins_own(site, provider, cli):
    def groups_after(groups) -> list[str]:
        answer, client = sign_in(site, provider, lambda n: provider.token(n, sub="u-dee", preferred_username="dee",
                                                                          groups=groups))
        with closing(client):
            assert answer.status_code == 303
            return client.get("/api/me").json()["groups"]

    assert groups_after(["staff", "ml", "ml"]) == ["ml", "staff"]
    assert cli("groups", "add", "helpdesk", "--data-dir", str(site["data_dir"])).returncode == 0
    assert cli("groups", "join", "helpdesk", "dee", "--data-dir", str(site["data_dir"])).returncode == 0
    assert groups_after(["staff"]) == ["helpdesk", "staff"], "ml is gone; the admin's own group stays"
    assert groups_after(None) == ["helpdesk", "staff"], "no claim at all leaves the groups as they were"
    listed = cli("groups", "list", "--data-dir", str(site["data_dir"])).stdout
    assert "ml                       oidc   (no members)" in listed


def test_an_api_key_works_for_someone_who_signs_in_with_the_provider(site, provider):
    answer, client = sign_in(site, provider, provider.token)
    with closing(client):
        made = client.post("/api/keys", json={"name": "laptop"})
        assert made.status_code == 201, made.text
        key = made.json()["key"]
    listed = httpx.get(site["url"] + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert listed.status_code == 200
    me = httpx.get(site["url"] + "/api/me", headers={"Authorization": f"Bearer {key}"}).json()
    assert me["name"] == "ada" and me["by_api_key"] is True


def test_logging_out_ends_the_session_here_and_at_the_provider(site, provider):
    answer, client = sign_in(site, provider, provider.token)
    with closing(client):
        out = client.post("/logout")
        assert out.status_code == 200 and "Logged out of Serge" in out.text
        link = re.search(r'content="0; url=([^"]+)"', out.text).group(1).replace("&amp;", "&")
        assert f'href="{link.replace("&", "&amp;")}"' in out.text
        ended = urlsplit(link)
        assert f"{ended.scheme}://{ended.netloc}{ended.path}" == provider.url + "/session/end"
        assert parse_qs(ended.query) == {"client_id": [CLIENT_ID], "post_logout_redirect_uri": [site["url"] + "/login"]}
        assert client.get("/api/me").status_code == 401


@pytest.mark.parametrize("changes, says", [
    ({"oidc_issuer": "http://id.example"}, "https:// URL"),
    ({"oidc_issuer": "https://id.example"}, "SERGE_OIDC_CLIENT_ID"),
    ({"oidc_issuer": "https://id.example", "oidc_client_id": "x", "oidc_scopes": "profile"}, "'openid'"),
])
def test_settings_that_cannot_work_are_refused_at_start_with_what_to_fix(changes, says):
    with pytest.raises(ValidationError, match=says):
        Settings(**changes)


DOC = Path(__file__).parent.parent / "docs" / "sign-in-oidc.md"


def test_the_docs_settings_block_is_what_serge_reads_and_its_table_names_every_oidc_setting(monkeypatch):
    text = DOC.read_text()
    block = re.search(r"```sh\n(SERGE_OIDC_ISSUER=.*?)```", text, re.S).group(1)
    for line in block.strip().splitlines():
        name, _, value = line.partition("=")
        monkeypatch.setenv(name, shlex.split(value)[0])
    read = Settings()
    assert (read.oidc_issuer, read.oidc_client_id, read.oidc_provider_name, read.public_url) == (
        "https://id.example/realms/staff", "serge", "Example ID", "https://serge.example")
    assert read.oidc_client_secret.get_secret_value() == "the-secret-the-provider-gave"
    named = set(re.findall(r"SERGE_(OIDC_[A-Z_]+)", text))
    assert named == {f.upper() for f in Settings.model_fields if f.startswith("oidc_")}
