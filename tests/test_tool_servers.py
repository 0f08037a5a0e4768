"""MCP servers registered by an admin: the `serge mcp` commands, who may use which server, a streamable-HTTP server
written here with the SDK, mcp-server-git on a temporary repository, and the prompt a tool's result makes.

Real parts: the CLI's `main`, a real Serge server over the stand-in model with accounts made by
`serge users add`, real MCP servers (PyPI's and the SDK's) over stdio and over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from contextlib import closing

import httpx
import pytest
import uvicorn
from conftest import free_port, own_server
from standin import byte_tokenizer, stand_in
from test_accounts_api import add_user, login

from serge.cli.main import main as serge_main
from test_chat_tools import ask, chat_with, script

from mcp_servers import CONTROL, build

settings, engine = stand_in("settings", "engine")


def test_serge_mcp_list_keeps_a_servers_own_stderr_out_of_its_listing(cli, tmp_path):
    data = str(tmp_path)
    noisy = ["python", "-c", "import sys; print('NOISE FROM' + ' THE SERVER', file=sys.stderr); sys.exit(3)"]
    assert cli("mcp", "add", "noisy", "--no-check", "--data-dir", data, "--", *noisy).returncode == 0
    # the real command: a stdio server's stderr is a file descriptor, which only a process of its own shows
    listing = subprocess.run([sys.executable, "-m", "serge", "mcp", "list", "--data-dir", data], capture_output=True,
                             text=True, timeout=120)
    assert listing.returncode == 0 and "noisy  stdio" in listing.stdout and "could not be" in listing.stdout
    assert "NOISE FROM THE SERVER" not in listing.stdout + listing.stderr


def test_serge_mcp_add_then_list_shows_the_servers_tools_and_never_a_secret(cli, tmp_path):
    data = str(tmp_path)
    added = cli("mcp", "add", "clock", "--data-dir", data, "--", "python", "-m", "mcp_server_time")
    assert added.returncode == 0 and "Registered clock" in added.stdout
    assert cli("mcp", "add", "web", "--url", "http://127.0.0.1:9/mcp", "--header", "Authorization: Bearer SECRET-1",
               "--admins-only", "--no-check", "--data-dir", data).returncode == 0
    listing = cli("mcp", "list", "--data-dir", data)
    assert listing.returncode == 0, listing.stderr
    assert "clock  stdio  python -m mcp_server_time" in listing.stdout
    assert "get_current_time" in listing.stdout and "convert_time" in listing.stdout
    assert "header Authorization" in listing.stdout and "could not be reached" in listing.stdout
    assert "SECRET-1" not in listing.stdout + listing.stderr
    again = cli("mcp", "add", "clock", "--data-dir", data, "--", "x")
    assert again.returncode == 2 and "already registered" in again.stderr
    assert cli("mcp", "rm", "web", "--data-dir", data).returncode == 0
    assert "web" not in cli("mcp", "list", "--data-dir", data).stdout
    gone = cli("mcp", "rm", "web", "--data-dir", data)
    assert gone.returncode == 2 and "no server named 'web'" in gone.stderr


def test_serge_mcp_add_refuses_a_bad_name_or_a_server_with_neither_command_nor_url(cli, tmp_path):
    bad = cli("mcp", "add", "Bad Name", "--data-dir", str(tmp_path), "--", "x")
    assert bad.returncode == 2 and "is not a server name" in bad.stderr
    neither = cli("mcp", "add", "x", "--data-dir", str(tmp_path))
    assert neither.returncode == 2 and "--url" in neither.stderr


@pytest.fixture(scope="module")
def accounts_server(settings, engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tool-accounts")
    add_user(folder, "alice", "--admin")
    add_user(folder, "bob")
    serge_main(["mcp", "add", "open", "--data-dir", str(folder), "--", *script("open", "echo")])
    serge_main(["mcp", "add", "secret", "--admins-only", "--data-dir", str(folder), "--", *script("s", "echo")])
    with own_server(settings, engine, folder) as url:
        yield url


def test_a_user_not_allowed_a_server_cannot_tick_it_nor_name_it(accounts_server):
    with closing(login(accounts_server, "bob")) as bob, closing(login(accounts_server, "alice")) as alice:
        names = [s["name"] for s in bob.get("/api/tools").json()["servers"]]
        assert names == ["serge", "open"]
        refused = bob.post("/api/chats", json={"tools": ["secret"]})
        assert refused.status_code == 403 and "admins only" in refused.json()["error"]["message"]
        chat = bob.post("/api/chats", json={"tools": ["open"]}).json()["id"]
        assert bob.patch(f"/api/chats/{chat}", json={"tools": ["secret"]}).status_code == 403
        assert bob.get("/api/mcp/servers").status_code == 403
        assert bob.post("/api/mcp/servers", json={"name": "x", "url": "http://127.0.0.1:1/mcp"}).status_code == 403
        assert [s["name"] for s in alice.get("/api/tools").json()["servers"]] == ["serge", "open", "secret"]
        assert alice.post("/api/chats", json={"tools": ["secret"]}).status_code == 201
        page = bob.get("/admin/tools", headers={"Accept": "text/html"})
        assert page.status_code == 403 and "Only an admin" in page.text


def test_the_admin_page_lists_adds_and_removes_servers_and_never_shows_a_header_value(accounts_server):
    with closing(login(accounts_server, "alice")) as alice, HttpMcp() as remote:
        page = alice.get("/admin/tools")
        assert page.status_code == 200 and "open" in page.text and "echo" in page.text
        added = alice.post("/admin/tools", data={"name": "remote", "url": f"http://127.0.0.1:{remote.port}/mcp",
                                                 "headers": "X-Token: SECRET-2"})
        assert added.status_code == 201 and "remote" in added.text and "X-Token" in added.text
        assert "SECRET-2" not in added.text and "control" in added.text  # its tools, listed
        listed = alice.get("/api/mcp/servers").json()["servers"]
        remote = next(s for s in listed if s["name"] == "remote")
        assert remote["headers"] == ["X-Token"] and "SECRET-2" not in str(listed)
        assert alice.post("/admin/tools/remote/remove").status_code == 303  # back to the page
        assert "remote" not in [s["name"] for s in alice.get("/api/mcp/servers").json()["servers"]]


class HttpMcp:
    """The SDK's MCP server over streamable HTTP on 127.0.0.1, in a thread; it records the headers it got, and
    answers a listing of its tools `listing_delay_s` late (a server slow to start its tools)."""

    def __init__(self, sse: bool = False, listing_delay_s: float = 0.0,
                 meet: tuple[threading.Event, threading.Event] | None = None):
        """`meet` (mine, theirs): asked to list its tools, it says so (mine) and waits up to 8 s for the other
        server to be asked too (theirs); `met` tells whether it was."""
        self.port = free_port()
        self.headers: list[dict] = []
        self.met: bool | None = None
        server = build("remote", {"echo", "control"})
        app = server.sse_app() if sse else server.streamable_http_app()

        async def recording(scope, receive, send):
            if scope["type"] == "http":
                self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
                if (listing_delay_s or meet) and scope["method"] == "POST":
                    first = await receive()
                    if b'"tools/list"' in first.get("body", b""):
                        await asyncio.sleep(listing_delay_s)
                        if meet and self.met is None:
                            meet[0].set()
                            self.met = await asyncio.to_thread(meet[1].wait, 8)
                    receive = _replayed(first, receive)
            await app(scope, receive, send)
        self.server = uvicorn.Server(uvicorn.Config(recording, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def _replayed(first: dict, receive):
    """`receive` with `first`, already read, given again first."""
    waiting = [first]

    async def again():
        return waiting.pop() if waiting else await receive()
    return again


def test_the_tools_of_every_server_are_listed_at_once(settings, engine, tmp_path):
    """Each of two servers answers its listing only once the other has been asked too (or after 8 s): one after
    the other, the first would wait out its 8 s alone; asked at once, they meet."""
    first, second = threading.Event(), threading.Event()
    with HttpMcp(meet=(first, second)) as a, HttpMcp(meet=(second, first)) as b, \
            own_server(settings, engine, tmp_path) as url, httpx.Client(base_url=url, timeout=120) as client:
        for name, server in (("a", a), ("b", b)):
            r = client.post("/api/mcp/servers", json={"name": name, "url": f"http://127.0.0.1:{server.port}/mcp",
                                                      "check": False})
            assert r.status_code == 201, r.text
        listed = {s["name"]: s for s in client.get("/api/tools").json()["servers"]}
        assert [sorted(t["name"] for t in listed[n]["tools"]) for n in "ab"] == [["control", "echo"]] * 2
        assert (a.met, b.met) == (True, True), "each server was asked while the other waited"


def test_a_streamable_http_server_is_called_from_a_chat_with_its_headers(settings, engine, tmp_path):
    with HttpMcp() as remote, own_server(settings, engine, tmp_path) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        r = client.post("/api/mcp/servers", json={"name": "remote", "url": f"http://127.0.0.1:{remote.port}/mcp",
                                                   "headers": {"Authorization": "Bearer SECRET-3"}})
        assert r.status_code == 201 and r.json()["headers"] == ["Authorization"]
        listed = {s["name"]: s for s in client.get("/api/tools").json()["servers"]}
        assert sorted(t["name"] for t in listed["remote"]["tools"]) == ["control", "echo"]
        calls, reply = ask(client, chat_with(client, ["remote"]))
        assert calls[-1]["state"] == "done" and calls[-1]["server"] == "remote"
        assert reply["status"] == "complete"
        assert any(h.get("authorization") == "Bearer SECRET-3" for h in remote.headers)


def test_a_server_nothing_answers_at_is_refused_with_why_and_is_kept_only_when_the_admin_says_so(settings, engine,
                                                                                                    tmp_path):
    nowhere = f"http://someone:PASSWORD-4@127.0.0.1:{free_port()}/mcp?token=TOKEN-4"  # nothing listens there
    secrets = ("PASSWORD-4", "TOKEN-4", "SECRET-4")
    with HttpMcp() as remote, own_server(settings, engine, tmp_path) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        far = {"name": "far", "url": nowhere, "headers": {"Authorization": "Bearer SECRET-4"}}
        refused = client.post("/api/mcp/servers", json=far)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "tool_server_unreachable" and error["param"] == "url"
        assert "could not list its tools at http://someone:***@127.0.0.1:" in error["message"]
        assert "nothing accepted a connection" in error["message"] and '"check": false' in error["message"]
        assert not any(secret in refused.text for secret in secrets)
        assert client.get("/api/mcp/servers").json()["servers"] == []  # nothing kept
        assert [s["name"] for s in client.get("/api/tools").json()["servers"]] == ["serge"]
        assert client.post("/api/mcp/servers", json={**far, "check": False}).status_code == 201  # on purpose
        listed = {s["name"]: s for s in client.get("/api/tools").json()["servers"]}
        assert listed["far"]["tools"] == [] and "could not be reached" in listed["far"]["error"]
        assert not any(secret in str(listed) for secret in secrets)
        near = client.post("/api/mcp/servers", json={"name": "near", "url": f"http://127.0.0.1:{remote.port}/mcp"})
        assert near.status_code == 201, near.text


def test_a_server_nothing_answers_at_is_said_at_once_while_it_waits_to_be_tried_again(tmp_path):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers, ToolServerUnreachable

    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()
    servers = ToolServers(ToolServerStore(db))
    servers.register("gone", url=f"http://127.0.0.1:{free_port()}/mcp")

    async def listings() -> float:
        started = time.monotonic()
        for _ in range(5):  # pauses of 0.5, 1, 2 and 4 s between its tries: a page would wait for each
            with pytest.raises(ToolServerUnreachable, match="nothing accepted a connection"):
                await servers.tools("gone")
        return time.monotonic() - started

    try:
        assert asyncio.run(listings()) < 3.0
    finally:
        asyncio.run(servers.close())
        db.close()


def test_serge_mcp_add_refuses_a_server_that_does_not_answer_unless_told_not_to_check(cli, tmp_path):
    data = str(tmp_path)
    nowhere = f"http://127.0.0.1:{free_port()}/mcp?key=KEY-5"
    refused = cli("mcp", "add", "far", "--url", nowhere, "--data-dir", data)
    assert refused.returncode == 2 and "'far' was not saved" in refused.stderr and "--no-check" in refused.stderr
    assert "KEY-5" not in refused.stdout + refused.stderr
    broken = cli("mcp", "add", "broken", "--data-dir", data, "--", "python", "-c", "import no_such_mcp_module")
    assert broken.returncode == 2 and "No module named 'no_such_mcp_module'" in broken.stderr  # what it said
    assert "its command is right" in broken.stderr
    assert "No MCP servers" in cli("mcp", "list", "--data-dir", data).stdout
    assert cli("mcp", "add", "far", "--url", nowhere, "--no-check", "--data-dir", data).returncode == 0
    assert "far  http" in cli("mcp", "list", "--data-dir", data).stdout


def test_mcp_server_git_answers_about_a_temporary_repository(tmp_path):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "hello.txt").write_text("hello\n")
    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()
    servers = ToolServers(ToolServerStore(db), timeout_s=60)
    servers.register("git", command=["python", "-m", "mcp_server_git", "--repository", str(repo)])

    async def use():
        await servers.start()
        try:
            tools = {t.name: t for t in await servers.tools("git")}
            status = await servers.call("git", "git_status", {"repo_path": str(repo)})
            return tools, status
        finally:
            await servers.close()
    tools, status = asyncio.run(use())
    db.close()
    assert tools["git_status"].read_only and not tools["git_commit"].read_only
    assert not status.is_error and "hello.txt" in status.text


def test_a_tools_result_reaches_the_prompt_as_text_never_as_control_tokens(engine):
    from serge.engine import Message, ToolCall
    from serge.engine.generation.prompting.prompts import build_prompt

    tokenizer = byte_tokenizer()
    specials = set(tokenizer.added_tokens_decoder)

    def prompt(result: str) -> list[int]:
        return build_prompt(tokenizer, [Message("user", "use it"),
                                        Message("assistant", "", tool_calls=(ToolCall("c1", "control", "{}"),)),
                                        Message("tool", result, tool_call_id="c1", name="control")],
                            context_window=4096).ids

    forged, plain = prompt(CONTROL), prompt("nothing special in this result")
    assert [i for i in forged if i in specials] == [i for i in plain if i in specials]
    assert "<|im_start|>system" in tokenizer.decode(forged)


def test_migration_0009_keeps_chats_and_messages_both_ways(database):
    """Down to 0008 and up again: the registry and the tool columns come and go, chats and their messages stay."""
    from conftest import migrate_to

    from serge.store import ChatStore, NewMessage, ToolServerStore

    chats = ChatStore(database)
    chat = chats.create_chat("me", title="kept", tools=["clock"])
    chats.add_message("me", chat.id, NewMessage("user", "hello"))
    ToolServerStore(database).add("clock", command=["python", "-m", "mcp_server_time"], env={"K": "secret"})
    with database.engine.begin() as connection:
        migrate_to(connection, "0008", down=True)
    with database.engine.begin() as connection:
        migrate_to(connection, "0009")
    again = chats.get_chat("me", chat.id)
    assert again.title == "kept" and [m.content for m in again.messages] == ["hello"] and again.tools == ()
    assert ToolServerStore(database).list() == []


def test_closing_the_tool_servers_or_removing_one_ends_its_process_at_once(tmp_path):
    import os

    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()
    servers = ToolServers(ToolServerStore(db))
    servers.register("one", command=script("one", "pid"))
    servers.register("two", command=script("two", "pid"))

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    async def use():
        await servers.start()
        one = int((await servers.call("one", "pid", {})).text)
        two = int((await servers.call("two", "pid", {})).text)
        assert alive(one) and alive(two)
        await servers.unregister("one")
        assert not alive(one) and alive(two)  # while the loop still runs: no help from its teardown
        await servers.close()
        assert not alive(two)
    asyncio.run(use())
    db.close()


def test_a_server_that_speaks_only_sse_is_reached_over_sse(tmp_path):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()
    servers = ToolServers(ToolServerStore(db), timeout_s=30)

    async def use(port: int):
        servers.register("old", url=f"http://127.0.0.1:{port}/sse", headers={"X-Key": "k"})
        await servers.start()
        try:
            names = sorted(t.name for t in await servers.tools("old"))
            return names, await servers.call("old", "echo", {"text": "over sse"})
        finally:
            await servers.close()
    with HttpMcp(sse=True) as old:
        names, echoed = asyncio.run(use(old.port))
    db.close()
    assert names == ["control", "echo"] and echoed.text == "echo: over sse" and not echoed.is_error
    assert any(h.get("x-key") == "k" for h in old.headers)


def test_a_server_runs_at_most_its_concurrency_in_calls_at_once(tmp_path):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()

    async def three_naps(concurrency: int) -> float:
        servers = ToolServers(ToolServerStore(db), timeout_s=30, concurrency=concurrency)
        await servers.start()
        try:
            await servers.tools("napper")  # started before the clock runs
            started = time.monotonic()
            done = await asyncio.gather(*(servers.call("napper", "nap", {"seconds": 1}) for _ in range(3)))
            assert [d.text for d in done] == ["rested"] * 3
            return time.monotonic() - started
        finally:
            await servers.close()
    ToolServers(ToolServerStore(db)).register("napper", command=script("napper", "nap"))
    assert asyncio.run(three_naps(1)) >= 3.0  # one at a time
    assert asyncio.run(three_naps(3)) < 2.5  # together
    db.close()
