"""Usage and quotas on a real server over the stand-in model, with the official clients of each dialect.

Accounts, keys and caps are made the way an administrator makes them (`serge users`, `serge keys`,
`serge users quota`), on the server's data dir while it runs. The server's usage clock is pinned
where a promise needs a known time (the Retry-After to midnight); a cap's reset is tested on the
service itself with an injected clock, over a real SQLite file.
"""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, date, datetime, timedelta

import httpx
import ollama
import openai
import pytest
from conftest import ServerThread, held_port
from standin import NAME as MODEL, stand_in
from test_accounts_api import add_user, login, serge
from test_chats_api import wait_for
from test_anthropic_api import anthropic_client

from serge.accounts import QuotaExceeded, Usage
from serge.accounts.reservations import Reservations
from serge.settings import Settings
from serge.store import QuotaRecord, UsageCount, UsageFilter, UsageStore
from serge.store.usage.reservations import ReservationStore
from serge.web.app import build_app

settings, engine = stand_in("settings", "engine")

HELLO = [{"role": "user", "content": "Say hello."}]
NOON = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)  # the server's usage clock: 12 h to the day's end
TO_MIDNIGHT = 12 * 3600


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("usage"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads, port=held_port())
    app = build_app(own, engine)
    with ServerThread(app, own.port) as running:
        for name in ("alice", "bob", "carol", "dave"):
            add_user(own.data_dir, name, *(["--admin"] if name == "alice" else []))
        app.state.services.usage.clock = lambda: NOON
        yield {"url": running.url, "data_dir": own.data_dir, "app": app}


def key_of(site, user: str, name: str = "k") -> str:
    return serge(site["data_dir"], "keys", "create", user, "--name", name).strip()


def key_id(site, user: str, key: str) -> str:
    listing = serge(site["data_dir"], "keys", "list", user)
    return next(line.split()[0] for line in listing.splitlines() if key[:17] in line)


def chat_api_turn(url: str, key: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    chat = httpx.post(f"{url}/api/chats", json={"settings": {"max_new_tokens": 5, "temperature": 0}},
                      headers=headers, timeout=60)
    assert chat.status_code == 201, chat.text
    return httpx.post(f"{url}/api/chats/{chat.json()['id']}/messages", json={"content": "Say hello."},
                      headers=headers, timeout=60)


def reported(url: str, key: str) -> dict[str, tuple[int, int]]:
    """One request in each dialect with `key`: the (prompt, generated) tokens each reply told its client."""
    o = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    told: dict[str, list[tuple[int, int]]] = {}
    cached: dict[str, int] = {}

    def tell(dialect: str, prompt: int, generated: int, details=None) -> None:
        told.setdefault(dialect, []).append((prompt, generated))
        if details is not None:
            cached[dialect] = cached.get(dialect, 0) + details.cached_tokens

    for _ in range(2):  # the second's prompt comes from the prefix cache: its cached tokens are told
        reply = o.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=7, n=2, temperature=1)
        tell("openai", reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.prompt_tokens_details)
    streamed = list(o.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, stream=True,
                                              stream_options={"include_usage": True}))
    tell("openai", streamed[-1].usage.prompt_tokens, streamed[-1].usage.completion_tokens,
         streamed[-1].usage.prompt_tokens_details)
    text = o.completions.create(model=MODEL, prompt=["Once upon", "a time"], max_tokens=3)
    tell("openai", text.usage.prompt_tokens, text.usage.completion_tokens, text.usage.prompt_tokens_details)
    response = o.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16)
    tell("responses", response.usage.input_tokens, response.usage.output_tokens,
         response.usage.input_tokens_details)
    message = anthropic_client(url, api_key=key).messages.create(model=MODEL, messages=HELLO, max_tokens=6)
    tell("anthropic", message.usage.input_tokens, message.usage.output_tokens)
    answer = ollama.Client(host=url, headers={"Authorization": f"Bearer {key}"}).chat(
        model=MODEL, messages=HELLO, options={"num_predict": 5})
    tell("ollama", answer.prompt_eval_count, answer.eval_count)
    turn = chat_api_turn(url, key)
    assert turn.status_code == 200, turn.text
    done = [line for line in turn.text.splitlines() if line.startswith("data:")][-1]
    saved = httpx.Response(200, content=done[5:]).json()["message"]
    tell("serge", saved["prompt_tokens"], saved["completion_tokens"])
    return {d: (sum(p for p, _ in pairs), sum(g for _, g in pairs)) for d, pairs in told.items()}, cached


def test_usage_totals_equal_the_usage_each_reply_reported_in_every_dialect(site):
    key = key_of(site, "bob")
    told, cached = reported(site["url"], key)
    assert cached["openai"] > 0  # the same conversation twice: the second's prompt was reused
    with closing(login(site["url"], "bob")) as bob:
        rows = bob.get("/api/usage", params={"by": "dialect"}).json()["rows"]
        kept = {r["dialect"]: (r["prompt_tokens"], r["completion_tokens"]) for r in rows}
        assert kept == told
        for dialect in ("openai", "responses"):  # the dialects whose usage tells the cached tokens
            assert next(r["cached_tokens"] for r in rows if r["dialect"] == dialect) == cached[dialect]
        by_key = bob.get("/api/usage", params={"by": "key"}).json()["rows"]
        assert [r["key"] for r in by_key] == [key_id(site, "bob", key)]
        assert by_key[0]["requests"] == 9  # openai 4, responses, anthropic, ollama, and the chat API's reply
        day = bob.get("/api/usage").json()["rows"]
        assert day == [{"day": NOON.date().isoformat(), "name": NOON.date().isoformat(), "requests": 9,
                        "prompt_tokens": sum(p for p, _ in told.values()),
                        "cached_tokens": sum(r["cached_tokens"] for r in rows),
                        "completion_tokens": sum(g for _, g in told.values()),
                        "total_tokens": sum(p + g for p, g in told.values())}]
        assert bob.get("/api/usage", params={"user": "alice"}).status_code == 403  # not his to read
    out = serge(site["data_dir"], "usage", "--user", "bob", "--by", "dialect", "--csv")
    lines = out.splitlines()
    assert lines[0] == "dialect,name,requests,prompt_tokens,cached_tokens,completion_tokens,total_tokens"
    assert {line.split(",")[0]: (int(line.split(",")[3]), int(line.split(",")[5])) for line in lines[1:]} == told


def test_a_reply_whose_client_left_is_recorded_with_the_tokens_it_made(site):
    key = key_of(site, "bob", "leaver")
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4000, "stream": True}
    with httpx.stream("POST", f"{site['url']}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while '"content":' not in (line := next(lines)) or '"content":""' in line.replace(" ", ""):
            pass  # until the first token's text arrives, then the client hangs up
    wanted = {"key": key_id(site, "bob", key)}

    def recorded():
        with closing(login(site["url"], "alice")) as alice:
            return alice.get("/api/usage", params={"by": "key", "key": wanted["key"]}).json()["rows"]

    row = wait_for(recorded, timeout=20, what="the usage of a reply whose client left")[0]
    assert row["requests"] == 1 and 0 < row["completion_tokens"] < 4000


def refusals(url: str, key: str) -> dict[str, tuple[int, str, str]]:
    """(status, Retry-After, message) of one request in each dialect, through the official clients."""
    found = {}
    o = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as refused:
        o.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    found["openai"] = (refused.value.status_code, refused.value.response.headers["retry-after"],
                       refused.value.body["message"])
    import anthropic

    with pytest.raises(anthropic.RateLimitError) as refused:
        anthropic_client(url, api_key=key).messages.create(model=MODEL, messages=HELLO, max_tokens=3)
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    found["anthropic"] = (refused.value.status_code, refused.value.response.headers["retry-after"],
                          refused.value.body["error"]["message"])
    client = ollama.Client(host=url, headers={"Authorization": f"Bearer {key}"})
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=MODEL, messages=HELLO, options={"num_predict": 3})
    raw = httpx.post(f"{url}/api/generate", json={"model": MODEL, "prompt": "hi", "stream": False},
                     headers={"Authorization": f"Bearer {key}"})
    assert raw.json() == {"error": refused.value.error}
    found["ollama"] = (refused.value.status_code, raw.headers["retry-after"], refused.value.error)
    turn = chat_api_turn(url, key)
    found["serge"] = (turn.status_code, turn.headers["retry-after"], turn.json()["error"]["message"])
    return found


def test_a_user_past_their_tokens_a_day_is_refused_in_every_dialect_until_midnight(site):
    serge(site["data_dir"], "users", "quota", "carol", "--tokens-per-day", "10")
    key = key_of(site, "carol")
    o = openai.OpenAI(base_url=f"{site['url']}/v1", api_key=key, max_retries=0)
    crossing = o.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=20)
    assert crossing.usage.completion_tokens == 20  # the request that crosses the line finishes
    for dialect, (status, retry, message) in refusals(site["url"], key).items():
        assert status == 429, dialect
        assert retry == str(TO_MIDNIGHT), dialect
        assert "your quota of 10 tokens a day is used up" in message, dialect
        assert "resets at 2026-12-04 00:00 UTC" in message, dialect
    with closing(login(site["url"], "carol")) as carol:  # only model requests are refused: she can still read her chats
        assert carol.get("/api/chats").status_code == 200
        assert carol.get("/api/quota").json()["applied"]["tokens_per_day"] == 10


def test_a_keys_quota_holds_within_its_users(site):
    first, second = key_of(site, "dave", "one"), key_of(site, "dave", "two")
    serge(site["data_dir"], "keys", "quota", "dave", key_id(site, "dave", first), "--requests-per-minute", "1")
    one = openai.OpenAI(base_url=f"{site['url']}/v1", api_key=first, max_retries=0)
    two = openai.OpenAI(base_url=f"{site['url']}/v1", api_key=second, max_retries=0)
    one.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as refused:
        one.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert "this API key's quota of 1 model requests a minute is used up" in refused.value.body["message"]
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60
    two.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)  # the other key is not capped
    serge(site["data_dir"], "users", "quota", "dave", "--requests-per-minute", "3")  # dave: 2 used this minute
    two.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as refused:  # the user's cap counts the requests of all his keys
        two.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert "your quota of 3 model requests a minute is used up" in refused.value.body["message"]


def test_an_admin_sets_caps_over_the_api_and_a_plain_user_may_not(site):
    with closing(login(site["url"], "alice")) as alice, closing(login(site["url"], "bob")) as bob:
        assert bob.put("/api/users/bob/quota", json={"tokens_per_day": 1}).status_code == 403
        set_ = alice.put("/api/users/bob/quota", json={"tokens_per_month": 5000})
        assert set_.status_code == 200, set_.text
        assert set_.json()["own"]["tokens_per_month"] == 5000
        bad = alice.put("/api/users/bob/quota", json={"tokens_per_day": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens_per_day"
        assert alice.put("/api/users/bob/quota", json={}).json()["own"] is None  # back to the default
        key = key_of(site, "bob", "capped")
        capped = alice.put(f"/api/users/bob/keys/{key_id(site, 'bob', key)}/quota", json={"tokens_per_day": 0})
        assert capped.status_code == 200 and capped.json()["own"]["tokens_per_day"] == 0
        with pytest.raises(openai.RateLimitError) as refused:  # a cap of 0: nothing runs with that key
            openai.OpenAI(base_url=f"{site['url']}/v1", api_key=key, max_retries=0).embeddings.create(
                model="all-minilm-l6-v2", input="hello")
        assert "this API key's quota of 0 tokens a day" in refused.value.body["message"]
        assert alice.put("/api/users/bob/keys/nope/quota", json={}).status_code == 404
        assert bob.put(f"/api/users/bob/keys/{key_id(site, 'bob', key)}/quota", json={}).status_code == 403
        assert alice.get("/api/usage", params={"by": "user"}).status_code == 200


# --- the service itself, with an injected clock ---------------------------------------------------------
@pytest.fixture
def ledger(database):
    """The service over a real database (SQLite; PostgreSQL too where one is named), with a clock of the test's."""
    clock = [datetime(2026, 1, 31, 23, 59, 30, tzinfo=UTC)]
    return Usage(UsageStore(database), clock=lambda: clock[0]), clock


def admit(usage: Usage, user_id: str = "u1") -> None:
    """Admit a model request of the user as every route's is: its caps checked, the request counted."""
    Reservations(usage, ReservationStore(usage.store.db, "test", lease_s=20)).open(user_id)


def spend(usage: Usage, tokens: int, key: str = "") -> None:
    usage.record(UsageCount("u1", key, MODEL, "openai", tokens, 0, 0))


def test_a_days_cap_resets_at_utc_midnight_and_a_months_at_the_months_end(ledger):
    usage, clock = ledger
    usage.set_user_quota("u1", QuotaRecord(tokens_per_day=100, tokens_per_month=150))
    admit(usage)
    spend(usage, 100)
    with pytest.raises(QuotaExceeded) as refused:
        admit(usage)
    assert refused.value.retry_after_s == 30 and refused.value.quota == "tokens_per_day"
    clock[0] = datetime(2026, 2, 1, 0, 0, 0, tzinfo=UTC)  # a new day, and a new month
    admit(usage)
    spend(usage, 100)
    clock[0] = datetime(2026, 2, 2, 0, 0, 1, tzinfo=UTC)
    admit(usage)  # 100 this month: under 150
    spend(usage, 60)
    with pytest.raises(QuotaExceeded) as refused:
        admit(usage)
    assert refused.value.quota == "tokens_per_month"
    assert refused.value.retry_after_s == (datetime(2026, 3, 1, tzinfo=UTC) - clock[0]).total_seconds()
    assert "resets at 2026-03-01 00:00 UTC" in str(refused.value)


def test_a_requests_a_minute_cap_resets_at_the_next_minute(ledger):
    usage, clock = ledger
    usage.set_default_quota(QuotaRecord(requests_per_minute=2))  # the account-wide default applies to u1
    admit(usage)
    admit(usage)
    with pytest.raises(QuotaExceeded) as refused:
        admit(usage)
    assert refused.value.retry_after_s == 30
    clock[0] += timedelta(seconds=30)
    admit(usage)


def test_the_day_a_request_is_recorded_on_is_utcs(ledger):
    usage, clock = ledger
    spend(usage, 7)
    clock[0] += timedelta(minutes=1)  # past midnight UTC
    spend(usage, 5)
    rows = usage.store.totals("day", UsageFilter())
    assert [(r.group, r.prompt_tokens, r.requests) for r in rows] == [("2026-01-31", 7, 1), ("2026-02-01", 5, 1)]
    assert date.fromisoformat(rows[1].group) == clock[0].date()


# --- the admin's pages ------------------------------------------------------------------------------------
def test_the_usage_page_draws_each_days_tokens_as_an_svg_bar_for_admins_only(site):
    key = key_of(site, "bob", "page")
    reply = openai.OpenAI(base_url=f"{site['url']}/v1", api_key=key, max_retries=0).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=4)
    assert reply.usage.completion_tokens == 4
    with closing(login(site["url"], "alice")) as alice, closing(login(site["url"], "bob")) as bob:
        day = alice.get("/api/usage", params={"to": NOON.date().isoformat()}).json()["rows"][0]
        page = alice.get("/admin/usage")
        assert page.status_code == 200
        html = page.text
        svg = html[html.index("<svg"):html.index("</svg>")]
        tip = (f"{NOON.date()}: {day['prompt_tokens']:,} prompt + {day['completion_tokens']:,} generated tokens, "
               f"{day['requests']:,} requests")
        assert f"<title>{tip}</title>" in svg
        assert svg.count('<rect class="prompt"') == 1 and svg.count('<rect class="generated"') == 1
        assert "<script" not in html and "http" not in svg.replace("http://www.w3.org/2000/svg", "")
        for name in ("bob", "Per API key", "(page, bob)", MODEL):
            assert name in html
        assert bob.get("/admin/usage").status_code == 403


def test_an_admin_sets_a_users_caps_on_the_users_page(site):
    with closing(login(site["url"], "alice")) as alice:
        set_ = alice.post("/admin/users/bob/quota", data={"tokens_per_day": "250,000", "tokens_per_month": "",
                                                           "requests_per_minute": "30"})
        assert set_.status_code == 303
        assert 'value="250000"' in alice.get("/admin/users").text
        bad = alice.post("/admin/users/bob/quota", data={"tokens_per_day": "lots"})
        assert bad.status_code == 400 and "tokens per day: give a whole number" in bad.text
        assert alice.post("/admin/users/bob/quota", data={}).status_code == 303  # all empty: the default's again
    out = serge(site["data_dir"], "users", "quota", "bob")
    assert out.startswith("bob: no caps")


def test_requests_of_several_processes_add_up_in_one_row_a_day(ledger):
    usage, clock = ledger
    for tokens in (3, 4):
        usage.record(UsageCount("u1", "k1", MODEL, "openai", tokens, 1, 2))
    usage.record(UsageCount("u1", "k1", MODEL, "ollama", 5, 0, 1))
    rows = usage.totals("dialect", UsageFilter(user_id="u1"))
    assert [(r.group, r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in rows] == [
        ("openai", 2, 7, 2, 4), ("ollama", 1, 5, 0, 1)]
    assert usage.store.tokens_since("u1", "k1", clock[0].date()) == 17  # prompt + generated: 5 + 6 + 6
    assert usage.store.tokens_since("u1", "other", clock[0].date()) == 0


def test_the_usage_migration_goes_down_and_up_again(database):
    from conftest import migrate_to
    from sqlalchemy import inspect

    usage = Usage(UsageStore(database))
    usage.record(UsageCount("u1", "", MODEL, "openai", 1, 0, 1))
    with database.engine.begin() as connection:
        migrate_to(connection, "0008", down=True)
    assert not {"usage_days", "usage_minutes", "quotas", "usage_reservations"} & set(
        inspect(database.engine).get_table_names())
    database.migrate()
    assert usage.totals("day", UsageFilter()) == []
    usage.set_user_quota("u1", QuotaRecord(tokens_per_day=5))
    assert usage.user_quota("u1").applied.tokens_per_day == 5


@pytest.mark.real_model
def test_on_the_real_model_the_ledger_keeps_what_each_reply_told_its_cached_tokens_included(real_server):
    from conftest import MODEL as REAL

    o = openai.OpenAI(base_url=f"{real_server}/v1", api_key="unused", max_retries=0)

    def kept() -> dict:
        rows = httpx.get(f"{real_server}/api/usage", params={"by": "model", "model": REAL}).json()["rows"]
        return rows[0] if rows else {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}

    before = kept()
    system = {"role": "system", "content": "You are a terse assistant who answers in one short sentence. " * 8}
    told = [o.chat.completions.create(model=REAL, messages=[system, {"role": "user", "content": question}],
                                      max_tokens=8, temperature=0).usage
            for question in ("What is the capital of France?", "What is the capital of Spain?")]
    assert told[1].prompt_tokens_details.cached_tokens > 0  # the long system prompt came from the prefix cache
    after = kept()
    assert after["requests"] - before["requests"] == 2
    for field, reported in (("prompt_tokens", lambda u: u.prompt_tokens),
                            ("completion_tokens", lambda u: u.completion_tokens),
                            ("cached_tokens", lambda u: u.prompt_tokens_details.cached_tokens)):
        assert after[field] - before[field] == sum(reported(u) for u in told), field


@pytest.mark.real_model
def test_an_embedding_request_is_recorded_with_the_input_tokens_it_told(real_server):
    o = openai.OpenAI(base_url=f"{real_server}/v1", api_key="unused", max_retries=0)
    told = o.embeddings.create(model="all-minilm-l6-v2", input=["one line", "and another, a little longer"])
    answer = ollama.Client(host=real_server).embed(model="all-minilm-l6-v2", input="a third")
    rows = httpx.get(f"{real_server}/api/usage", params={"by": "dialect", "model": "all-minilm-l6-v2"}).json()["rows"]
    kept = {r["dialect"]: (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows}
    assert kept["openai"][1:] == (told.usage.prompt_tokens, 0)
    assert kept["ollama"][1:] == (answer.prompt_eval_count, 0)


def test_the_api_docs_describe_usage_and_the_caps(site):
    with closing(login(site["url"], "bob")) as bob:
        paths = bob.get("/openapi.json").json()["paths"]
    usage = paths["/api/usage"]["get"]
    assert usage["summary"] and {"user", "key", "model", "from", "to", "by"} <= {p["name"] for p in usage["parameters"]}
    for path, method in [("/api/quota", "get"), ("/api/quotas/default", "put"), ("/api/users/{name}/quota", "put"),
                         ("/api/users/{name}/keys/{key_id}/quota", "put")]:
        assert paths[path][method]["summary"], (path, method)


def test_a_cap_reached_through_one_server_holds_on_another_sharing_its_database(site, settings, engine):
    other = Settings(data_dir=site["data_dir"], models_dir=settings.models_dir, torch_threads=settings.torch_threads,
                     port=held_port())  # the same database and secret: a second Serge behind a balancer
    app = build_app(other, engine)
    later = NOON + timedelta(minutes=5)  # a minute of their own, on both servers' clocks
    try:
        with ServerThread(app, other.port) as second:
            app.state.services.usage.clock = site["app"].state.services.usage.clock = lambda: later
            serge(site["data_dir"], "users", "quota", "carol", "--tokens-per-day", "none", "--requests-per-minute", "2")
            key = key_of(site, "carol", "two-servers")
            for url in (site["url"], second.url):  # one request on each: carol's two this minute
                openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).chat.completions.create(
                    model=MODEL, messages=HELLO, max_tokens=1)
            for url in (site["url"], second.url):
                with pytest.raises(openai.RateLimitError) as refused:
                    openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).chat.completions.create(
                        model=MODEL, messages=HELLO, max_tokens=1)
                assert "your quota of 2 model requests a minute is used up" in refused.value.body["message"]
    finally:
        site["app"].state.services.usage.clock = lambda: NOON
        serge(site["data_dir"], "users", "quota", "carol", "--clear")
