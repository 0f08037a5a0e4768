"""Quotas nobody can race: parallel model requests against a cap, on a real server over the stand-in model.

Each promise sends its requests at once (threads held at a barrier) to a real server on 127.0.0.1 over a
real SQLite file (and over PostgreSQL, with two servers sharing it, where SERGE_TEST_POSTGRES_URL names
one, with two `serge serve` processes on the bundled model sharing it). The server's usage clock is
pinned, so a minute's requests never straddle two minutes. Embeddings run on the bundled embedding model;
chats on the stand-in, slowed a little so a long reply is still running when the next request comes.
"""

from __future__ import annotations

import os
import re
import threading
import time
from contextlib import closing
from datetime import UTC, datetime
from types import SimpleNamespace

import httpx
import pytest
from conftest import MODEL as REAL_MODEL, POSTGRES_URL, ServerThread, fresh_database, held_port, models_dir
from standin import NAME as MODEL, standin_engine
from test_accounts_api import add_user, login
from test_chats_api import wait_for
from test_knowledge import indexed, make, put

import documents as files
from serge.accounts import Accounts
from serge.accounts.groups import Groups
from serge.accounts.usage import Usage
from serge.engine.generation.batching.scheduler import SchedulerLimits
from serge.engine import Engine
from serge.settings import RemoteModel, Settings
from serge.store.people.groups import GroupStore
from serge.store import AccountStore, QuotaRecord, UsageCount, UsageFilter, UsageStore
from serge.web.app import build_app

NOON = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
HELLO = [{"role": "user", "content": "Say hello."}]
EMBEDDER = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The stand-in at ~200 tokens/s per reply, beside the bundled embedding model."""
    own = Settings(data_dir=tmp_path_factory.mktemp("races-engine"), models_dir=models_dir(), default_model=MODEL)
    with standin_engine(own, step_s=0.005, limits=SchedulerLimits(max_running=16)) as made:
        yield made


def serve(engine, data_dir, **overrides) -> tuple[ServerThread, object]:
    own = Settings(data_dir=data_dir, models_dir=models_dir(), default_model=MODEL, port=held_port(),
                   user_max_streams=64, **overrides)
    app = build_app(own, engine)
    return ServerThread(app, own.port), app


@pytest.fixture(scope="module")
def site(engine, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("races")
    running, app = serve(engine, data_dir, user_requests_per_minute=10_000)  # polls while a file is indexed
    with running:
        app.state.services.usage.clock = lambda: NOON
        yield {"url": running.url, "data_dir": data_dir, "app": app}


def capped(site, name: str, **caps: int) -> str:
    """A new user with `caps` (a `QuotaRecord`'s fields) and an API key of theirs: the key. Made through the
    running app's own services, as `serge users add` and `serge users quota` make them, on any database."""
    app = site["app"]
    user = app.state.services.accounts.add_user(name, f"{name}-password-long")
    if caps:
        app.state.services.usage.set_user_quota(user.id, QuotaRecord(**caps))
    record, key = app.state.services.accounts.create_key(user, "k")
    site.setdefault("keys", {})[key] = record.id
    return key


def at_once(count: int, call) -> list:
    """`call(i)` in `count` threads released together; their results, in order."""
    gate, results = threading.Barrier(count), [None] * count

    def run(i: int) -> None:
        gate.wait()
        results[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return results


def chat(url: str, key: str | None, max_tokens: int, **more) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": max_tokens,
                                                          "temperature": 0, **more},
                      headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=300)


def ledger_of(site, key: str) -> tuple[int, int]:
    """(requests, prompt + generated tokens) the ledger holds for the key."""
    rows = site["app"].state.services.usage.totals("key", UsageFilter(key_id=site["keys"][key]))
    return (rows[0].requests, rows[0].prompt_tokens + rows[0].completion_tokens) if rows else (0, 0)


def four_a_minute(urls: list[str], key: str, model: str = MODEL) -> list[httpx.Response]:
    return at_once(8, lambda i: chat(urls[i % len(urls)], key, 2, model=model))


def three_hundred_a_day(urls: list[str], key: str, model: str = MODEL) -> tuple[list[httpx.Response], int, int]:
    """20 requests at once: the answers, the tokens they were served, and one reply's budget."""
    answers = at_once(20, lambda i: chat(urls[i % len(urls)], key, 20, model=model))
    served = [a.json()["usage"] for a in answers if a.status_code == 200]
    assert served, [a.text for a in answers]
    return answers, sum(u["total_tokens"] for u in served), served[0]["prompt_tokens"] + 20


def assert_refused(answers: list[httpx.Response], words: str) -> None:
    for answer in answers:
        if answer.status_code != 200:
            assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1, answer.text
            assert words in answer.json()["error"]["message"], answer.text


def test_eight_requests_at_once_against_four_a_minute_get_at_most_four_answers(site):
    key = capped(site, "rpm-four", requests_per_minute=4)
    answers = four_a_minute([site["url"]], key)
    assert sum(a.status_code == 200 for a in answers) == 4, [a.status_code for a in answers]
    assert_refused(answers, "your quota of 4 model requests a minute is used up")


def test_twenty_requests_at_once_against_a_300_token_day_serve_the_quota_plus_one_replys_budget_at_most(site):
    key = capped(site, "day-300", tokens_per_day=300)
    answers, served, budget = three_hundred_a_day([site["url"]], key)
    assert served <= 300 + budget, (served, budget, [a.status_code for a in answers])
    assert_refused(answers, "your quota of 300 tokens a day is used up")
    ok = sum(a.status_code == 200 for a in answers)
    assert ledger_of(site, key) == (ok, served)  # each settled to what it was told


def in_group(site, group: str, user: str, **caps: int) -> None:
    """`user` in `group` (made on first use, with `caps`), through the running app's services, as `serge groups`."""
    services = site["app"].state.services
    if group not in {g.name for g in services.groups.groups()}:
        made = services.groups.add(group)
        services.usage.set_group_quota(made.id, made.name, QuotaRecord(**caps))
    services.groups.join(group, user)


def test_eight_requests_at_once_against_a_groups_four_a_minute_get_at_most_four_answers(site):
    key = capped(site, "grp-rpm-four")
    in_group(site, "rpm-four-team", "grp-rpm-four", requests_per_minute=4)
    in_group(site, "rpm-two-team", "grp-rpm-four", requests_per_minute=2)  # the most generous of the two applies
    answers = four_a_minute([site["url"]], key)
    assert sum(a.status_code == 200 for a in answers) == 4, [a.status_code for a in answers]
    assert_refused(answers, "the group rpm-four-team's quota of 4 model requests a minute is used up")


def test_twenty_requests_at_once_against_a_groups_300_token_day_serve_the_cap_plus_one_replys_budget_at_most(site):
    key = capped(site, "grp-day-300")
    in_group(site, "day-300-team", "grp-day-300", tokens_per_day=300)
    answers, served, budget = three_hundred_a_day([site["url"]], key)
    assert served <= 300 + budget, (served, budget, [a.status_code for a in answers])
    assert_refused(answers, "the group day-300-team's quota of 300 tokens a day is used up")
    ok = sum(a.status_code == 200 for a in answers)
    assert 1 <= ok < 20 and ledger_of(site, key) == (ok, served)


def test_a_users_own_cap_wins_over_their_groups(site):
    key = capped(site, "grp-own-two", requests_per_minute=2)
    in_group(site, "rpm-six-team", "grp-own-two", requests_per_minute=6)
    answers = four_a_minute([site["url"]], key)
    assert sum(a.status_code == 200 for a in answers) == 2, [a.status_code for a in answers]
    assert_refused(answers, "your quota of 2 model requests a minute is used up")


def test_chat_replies_of_the_page_at_once_serve_a_token_day_plus_one_replys_budget_at_most(site):
    key = capped(site, "page-300", tokens_per_day=300)
    headers = {"Authorization": f"Bearer {key}"}
    chats = [httpx.post(f"{site['url']}/api/chats", json={"settings": {"max_new_tokens": 20, "temperature": 0}},
                        headers=headers).json()["id"] for _ in range(10)]
    answers = at_once(10, lambda i: httpx.post(f"{site['url']}/api/chats/{chats[i]}/messages",
                                               json={"content": "Say hello."}, headers=headers, timeout=300))
    saved = [httpx.Response(200, content=[line for line in a.text.splitlines() if line.startswith("data:")][-1][5:])
             .json()["message"] for a in answers if a.status_code == 200]
    assert saved, [a.text for a in answers]
    served = sum(m["prompt_tokens"] + m["completion_tokens"] for m in saved)
    assert served <= 300 + saved[0]["prompt_tokens"] + 20, (served, [a.status_code for a in answers])
    assert_refused(answers, "your quota of 300 tokens a day is used up")


def test_embeddings_at_once_past_a_token_day_are_refused_in_both_dialects(site):
    key = capped(site, "embed-100", tokens_per_day=100)
    texts = [f"line {i} of a list that an agent embeds all at once" for i in range(32)]
    headers = {"Authorization": f"Bearer {key}"}

    def embed(i: int) -> httpx.Response:
        if i % 2:
            return httpx.post(f"{site['url']}/api/embed", json={"model": EMBEDDER, "input": texts}, headers=headers,
                              timeout=300)
        return httpx.post(f"{site['url']}/v1/embeddings", json={"model": EMBEDDER, "input": texts}, headers=headers,
                          timeout=300)

    answers = at_once(6, embed)
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 1 and codes.count(429) == 5, [a.text for a in answers]
    requests, tokens = ledger_of(site, key)
    assert requests == 1 and 100 <= tokens < 1000  # the one request that crossed the line, with what it told


def test_n_choices_hold_n_replies_budgets_while_they_run(site):
    key = capped(site, "n-eight", tokens_per_day=5000)  # one reply's 1,000 fits under it; eight do not
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 1000,
            "n": 8, "stream": True}
    with httpx.stream("POST", f"{site['url']}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as running:
        assert running.status_code == 200
        lines = running.iter_lines()  # held: a reader let go of closes the connection, and the reply stops
        next(line for line in lines if '"content"' in line)  # the choices are being written
        second = chat(site["url"], key, 1)
    assert second.status_code == 429, second.text
    message = second.json()["error"]["message"]
    held = int(re.search(r"([\d,]+) of them held by requests still running", message)[1].replace(",", ""))
    assert 8 * 1000 < held < 8 * 1000 + 500, message  # the prompt once, and eight replies of 1,000


def test_a_remote_models_reply_holds_its_prompt_as_well_as_its_longest_reply(engine, tmp_path_factory):
    far, _ = serve(engine, tmp_path_factory.mktemp("far"))  # no accounts: it answers this machine
    with far:
        own = Settings(data_dir=tmp_path_factory.mktemp("front"), models_dir=models_dir(), default_model="far",
                       port=held_port(), remote_models={"far": RemoteModel(url=f"{far.url}/v1", model=MODEL)})
        with Engine(own) as front, ServerThread(app := build_app(own, front), own.port) as running:
            key = capped({"app": app}, "remote", tokens_per_day=420)  # a reply of 400 fits; with its prompt, not
            body = {"model": "far", "messages": [{"role": "user", "content": "Tell me a long story."}],
                    "max_tokens": 400, "stream": True}
            with httpx.stream("POST", f"{running.url}/v1/chat/completions", json=body, timeout=120,
                              headers={"Authorization": f"Bearer {key}"}) as first:
                assert first.status_code == 200
                lines = first.iter_lines()
                next(line for line in lines if '"content"' in line)
                second = chat(running.url, key, 1, model="far")
            assert second.status_code == 429, second.text
            assert "held by requests still running" in second.json()["error"]["message"]


def test_a_search_over_mcp_is_a_model_request_counted_and_capped(site):
    from test_mcp_server import call

    add_user(site["data_dir"], "bob")
    key_record, key = site["app"].state.services.accounts.create_key(site["app"].state.services.accounts.user("bob"), "agent")
    site.setdefault("keys", {})[key] = key_record.id
    with closing(login(site["url"], "bob")) as bob:
        own = make(bob, "own")
        assert put(bob, own["id"], "minutes.pdf", files.long_report_pdf()).status_code == 201
        indexed(bob, own["id"])
    query = "when does the ferry leave"
    answer = call(site, key, "search_knowledge", {"collection": "own", "query": query})
    assert not answer.is_error, answer.content
    assert ledger_of(site, key) == (1, len(query.encode()) + 2)  # its query, at the bound reserved for it
    refused = capped(site, "mcp-capped", tokens_per_day=0)
    capped_answer = call(site, refused, "search_knowledge", {"collection": "own", "query": "ferry"})
    assert capped_answer.is_error and "quota of 0 tokens a day is used up" in capped_answer.content[0].text


def test_model_requests_are_counted_by_the_quota_alone_not_by_a_per_process_bucket(engine, tmp_path_factory):
    running, app = serve(engine, tmp_path_factory.mktemp("bucket"), user_requests_per_minute=2)
    with running:
        key = capped({"app": app}, "many")
        assert [chat(running.url, key, 1).status_code for _ in range(5)] == [200] * 5
        listed = [httpx.get(f"{running.url}/api/chats", headers={"Authorization": f"Bearer {key}"}).status_code
                  for _ in range(3)]
        assert listed == [200, 200, 429]  # other requests: the per-process flood guard still counts them


# --- a process that dies -----------------------------------------------------------------------------------
def test_a_reservation_left_by_a_dead_process_is_counted_at_what_it_reserved(database):
    from serge.accounts.reservations import Reservations
    from serge.store.usage.reservations import ReservationStore

    usage = Usage(UsageStore(database), clock=lambda: NOON)
    dead = Reservations(usage, ReservationStore(database, "dead", lease_s=0.2))
    ticket = dead.open("u1", "k1", "openai")
    dead.reserve(ticket, MODEL, 30, 8 * 100)  # then the process dies: no heartbeat, no settling
    alive = Reservations(usage, ReservationStore(database, "alive", lease_s=0.2))
    assert alive.store.beat(NOON.date(), []) == 0  # within the lease: still the other process's
    time.sleep(0.4)
    assert alive.store.beat(NOON.date(), []) == 1
    [row] = usage.totals("key", UsageFilter(key_id="k1"))
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 30, 800)
    assert not dead.settle(ticket, [UsageCount("u1", "k1", MODEL, "openai", 30, 0, 5)])  # counted once
    assert usage.totals("key", UsageFilter(key_id="k1"))[0].completion_tokens == 800


def test_a_running_requests_reservation_is_renewed_not_settled(database):
    from serge.accounts.reservations import Reservations
    from serge.store.usage.reservations import ReservationStore

    usage = Usage(UsageStore(database), clock=lambda: NOON)
    mine = Reservations(usage, ReservationStore(database, "mine", lease_s=0.3), heartbeat_s=0.05).start()
    other = ReservationStore(database, "other", lease_s=0.3)
    try:
        ticket = mine.open("u2", "", "openai")
        mine.reserve(ticket, MODEL, 10, 100)
        time.sleep(0.8)
        assert other.beat(NOON.date(), []) == 0
        assert mine.settle(ticket, [UsageCount("u2", "", MODEL, "openai", 10, 0, 3)])
        [row] = usage.totals("user", UsageFilter(user_id="u2"))
        assert (row.prompt_tokens, row.completion_tokens) == (10, 3)
    finally:
        mine.close()


# --- two `serge serve` processes on one PostgreSQL --------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two `serge serve` processes sharing one PostgreSQL database, each with the bundled model, as behind a
    balancer; their clocks are real, so a minute's requests are sent clear of the minute's end."""
    if not POSTGRES_URL:
        pytest.skip("SERGE_TEST_POSTGRES_URL is not set (CI starts PostgreSQL)")
    from test_cluster import Serve

    database = fresh_database(POSTGRES_URL)
    site = {"app": SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(
        accounts=Accounts(AccountStore(database)), usage=Usage(UsageStore(database)),
        groups=Groups(GroupStore(database)))))}
    base = tmp_path_factory.mktemp("pair")
    env = {**os.environ, "SERGE_DATABASE_URL": POSTGRES_URL, "SERGE_DEFAULT_MODEL": REAL_MODEL,
           "SERGE_USER_MAX_STREAMS": "64"}
    processes = [Serve(name, base / f"data-{name}", env, base) for name in "ab"]
    try:
        for process in processes:
            wait_for(process.healthy, timeout=180, what=f"serge serve {process.name} to become healthy")
        for process in processes:  # the model loaded in each, so the requests race each other, not the load
            assert chat(process.url, None, 1, model=REAL_MODEL).status_code == 200
        yield {**site, "urls": [p.url for p in processes], "processes": processes}
    finally:
        for process in processes:
            process.stop()
        database.close()


def clear_of_the_minutes_end() -> None:
    while time.time() % 60 > 45:
        time.sleep(0.5)


@pytest.mark.postgres
def test_two_processes_on_postgresql_give_eight_requests_at_once_at_most_four_a_minute(pair):
    key = capped(pair, "pg-rpm-four", requests_per_minute=4)
    clear_of_the_minutes_end()
    answers = four_a_minute(pair["urls"], key, REAL_MODEL)
    assert sum(a.status_code == 200 for a in answers) == 4, [a.status_code for a in answers]
    assert_refused(answers, "your quota of 4 model requests a minute is used up")


@pytest.mark.postgres
def test_two_processes_on_postgresql_serve_a_300_token_day_plus_one_replys_budget_at_most(pair):
    key = capped(pair, "pg-day-300", tokens_per_day=300)
    answers, served, budget = three_hundred_a_day(pair["urls"], key, REAL_MODEL)
    assert served <= 300 + budget, (served, budget, [a.status_code for a in answers])
    assert_refused(answers, "your quota of 300 tokens a day is used up")
    ok = sum(a.status_code == 200 for a in answers)
    assert 1 <= ok < 20 and ledger_of(pair, key) == (ok, served)


@pytest.mark.postgres
def test_two_processes_on_postgresql_give_a_groups_members_eight_requests_at_once_at_most_four_a_minute(pair):
    key = capped(pair, "pg-grp-rpm")
    in_group(pair, "pg-rpm-four-team", "pg-grp-rpm", requests_per_minute=4)
    clear_of_the_minutes_end()
    answers = four_a_minute(pair["urls"], key, REAL_MODEL)
    assert sum(a.status_code == 200 for a in answers) == 4, [a.status_code for a in answers]
    assert_refused(answers, "the group pg-rpm-four-team's quota of 4 model requests a minute is used up")


@pytest.mark.postgres
def test_a_reply_whose_process_is_killed_is_counted_at_its_budget_by_the_other_process(pair):
    """Last in the module: it kills the first process."""
    key = capped(pair, "pg-killed")
    killed = pair["processes"][0]
    body = {"model": REAL_MODEL, "messages": [{"role": "user", "content": "Write a long story about the sea."}],
            "max_tokens": 1500, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{killed.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        lines = response.iter_lines()
        next(line for line in lines if '"content"' in line)  # the client is being streamed the reply
        killed.process.kill()
        killed.process.wait()
    assert ledger_of(pair, key) == (0, 0)  # the reply never ended where its process could settle it
    requests, tokens = wait_for(lambda: ledger_of(pair, key)[0] and ledger_of(pair, key), timeout=60,
                                what="the other process to settle the dead process's reservation")
    assert requests == 1 and 1500 < tokens < 1500 + 200  # its prompt, and the longest reply it was allowed
