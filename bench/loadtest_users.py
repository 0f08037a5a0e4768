"""The load test's simulated people, and the ledger of what each of them saw.

A `Person` is one account with its own API key, looping until the deadline: it
sends a message to a new or an earlier chat, regenerates a reply, or asks
`/v1/chat/completions` (streamed or not), then thinks a short while. At random
(seeded) it hangs up mid-reply or presses Stop. 429 and 503 answers with
Retry-After are the server pacing its callers: they are counted and honoured,
never failures; 409 (a chat still finishing a reply that was hung up on) is
counted too. Anything else that is not 2xx, a reply that ends in an error, or a
broken connection is a failure.

The `Ledger` keeps, per chat, what the server must have stored afterwards; the
checks live in bench/loadtest_checks.py. Nothing here reads the server's database.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

QUESTIONS = [
    "What is a good name for a small grey cat?",
    "Give me one tip for sleeping better.",
    "Write a haiku about autumn rain.",
    "How do I boil an egg?",
    "What is the capital of France?",
    "Suggest a quick vegetarian dinner.",
    "Explain what a rainbow is in two sentences.",
    "Tell me a short joke about computers.",
    "Why is the sky blue?",
    "List three things to pack for a picnic.",
]
ACTIONS = {"send": 5, "regenerate": 1.5, "v1_stream": 2, "v1_plain": 1.5}


@dataclass
class Plan:
    """What every person does; the random choices come from each person's own seeded generator."""

    deadline: float
    max_tokens: tuple[int, int] = (16, 48)
    think_s: tuple[float, float] = (0.5, 4.0)
    p_new_chat: float = 0.3
    p_hang_up: float = 0.12
    p_stop: float = 0.1


@dataclass
class ReplySeen:
    """One reply as the client saw it: its id from `start`, the text it read, and `done`'s message if it came."""

    kind: str  # send or regenerate
    message_id: str
    text: str = ""
    done: dict | None = None
    hung_up: bool = False


@dataclass
class ChatSeen:
    id: str
    key: str
    sent: int = 0  # user messages the server accepted (a reply started, or 503 after saving the message)
    started: int = 0  # assistant replies begun (`start`) or refused as busy after their row was made
    replies: list[ReplySeen] = field(default_factory=list)


@dataclass
class Ledger:
    requests: Counter = field(default_factory=Counter)  # "kind status" -> count
    ttft: dict[str, list[float]] = field(default_factory=lambda: {"chat": [], "v1": []})
    tokens: int = 0  # completion tokens of replies read to the end
    hang_ups: int = 0
    stops: int = 0
    regenerates: int = 0
    waits: int = 0  # Retry-After honoured
    wait_s: float = 0.0
    busy_chat: int = 0  # 409: the chat was still finishing
    failures: list[str] = field(default_factory=list)
    chats: dict[str, ChatSeen] = field(default_factory=dict)

    def fail(self, what: str) -> None:
        self.failures.append(what[:400])


async def sse(response: httpx.Response):
    """(event, data) pairs of a server-sent event stream; event is None for plain `data:` lines."""
    kind = None
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            yield kind, line[5:].strip()
            kind = None


def retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


class Person:
    def __init__(self, index: int, key: str, client: httpx.AsyncClient, ledger: Ledger, plan: Plan,
                 seed: int) -> None:
        self.index = index
        self.key = key
        self.auth = {"Authorization": f"Bearer {key}"}
        self.client = client
        self.ledger = ledger
        self.plan = plan
        self.rng = random.Random(seed * 100_003 + index)
        self.chats: list[ChatSeen] = []

    async def run(self) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.plan.think_s[1]))  # people do not all start in one instant
        while time.monotonic() < self.plan.deadline:
            action = self.rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
            try:
                if action == "send":
                    await self.send()
                elif action == "regenerate":
                    await self.regenerate()
                else:
                    await self.ask_v1(stream=action == "v1_stream")
            except (httpx.HTTPError, TimeoutError) as exc:
                self.ledger.fail(f"person {self.index} {action}: {type(exc).__name__}: {exc}")
            await asyncio.sleep(self.rng.uniform(*self.plan.think_s))

    # --- answers that are not 2xx ------------------------------------------------------------
    async def refused(self, kind: str, response: httpx.Response) -> str | None:
        """Count a refusal, honour its Retry-After; returns its error code when it was expected."""
        body = (await response.aread()).decode(errors="replace")
        try:
            code = json.loads(body)["error"].get("code")
        except (ValueError, KeyError, TypeError, AttributeError):
            code = None
        wait = retry_after(response)
        if response.status_code in (429, 503) and wait is not None:
            self.ledger.waits += 1
            wait = min(wait, max(0.0, self.plan.deadline - time.monotonic()))
            self.ledger.wait_s += wait
            await asyncio.sleep(wait)
            return code
        if response.status_code == 409 and code == "chat_busy":
            self.ledger.busy_chat += 1
            await asyncio.sleep(1.0)
            return code
        self.ledger.fail(f"{kind}: HTTP {response.status_code}: {body[:300]}")
        return None

    # --- the chat API ------------------------------------------------------------------------
    async def new_chat(self) -> ChatSeen | None:
        settings = {"max_new_tokens": self.rng.randint(*self.plan.max_tokens), "temperature": 0.8}
        r = await self.client.post("/api/chats", json={"settings": settings}, headers=self.auth)
        self.ledger.requests[f"chat.create {r.status_code}"] += 1
        if r.status_code != 201:
            await self.refused("chat.create", r)
            return None
        chat = ChatSeen(r.json()["id"], self.key)
        self.ledger.chats[chat.id] = chat
        self.chats.append(chat)
        return chat

    async def send(self) -> None:
        chat = None if not self.chats or self.rng.random() < self.plan.p_new_chat else self.rng.choice(self.chats)
        chat = chat or await self.new_chat()
        if chat is not None:
            await self.reply(chat, "send", f"/api/chats/{chat.id}/messages",
                             {"content": self.rng.choice(QUESTIONS)})

    async def regenerate(self) -> None:
        answered = [c for c in self.chats if c.sent]
        if not answered:
            return await self.send()
        chat = self.rng.choice(answered)
        self.ledger.regenerates += 1
        await self.reply(chat, "regenerate", f"/api/chats/{chat.id}/regenerate", None)

    async def reply(self, chat: ChatSeen, kind: str, path: str, body: dict | None) -> None:
        """One reply through the chat API, read as the page reads it, unless this person hangs up or stops."""
        fate = self.rng.random()
        fate = "hang_up" if fate < self.plan.p_hang_up else "stop" if fate < self.plan.p_hang_up + self.plan.p_stop \
            else "read"
        after = self.rng.randint(1, 6)  # deltas read before hanging up or pressing Stop
        stopper = None
        t0 = time.perf_counter()
        async with self.client.stream("POST", path, json=body, headers=self.auth) as r:
            self.ledger.requests[f"chat.{kind} {r.status_code}"] += 1
            if r.status_code != 200:
                if await self.refused(f"chat.{kind}", r) == "engine_busy":  # the server saved a failed reply row
                    chat.sent += kind == "send"
                    chat.started += 1
                return
            seen, deltas = None, 0
            async for event, data in sse(r):
                payload = json.loads(data)
                if event == "start":
                    seen = ReplySeen(kind, payload["message_id"])
                    chat.replies.append(seen)
                    chat.sent += kind == "send"
                    chat.started += 1
                elif event == "delta":
                    if not deltas:
                        self.ledger.ttft["chat"].append(time.perf_counter() - t0)
                    deltas += 1
                    seen.text += payload["text"]
                    if fate == "hang_up" and deltas >= after:
                        seen.hung_up = True
                        self.ledger.hang_ups += 1
                        break  # leaving the block closes the connection mid-reply
                    if fate == "stop" and deltas >= after and stopper is None:
                        stopper = asyncio.create_task(self.stop(chat))
                elif event == "done":
                    seen.done = payload["message"]
                    self.ledger.tokens += seen.done.get("completion_tokens") or 0
                    if seen.done["status"] not in ("complete", "length", "stopped"):
                        self.ledger.fail(f"chat.{kind} {chat.id}: reply ended {seen.done['status']}: "
                                         f"{seen.done.get('error')}")
        if stopper is not None:
            await stopper
        if seen is not None and seen.done is None and not seen.hung_up:
            self.ledger.fail(f"chat.{kind} {chat.id}: the stream ended without `done`")

    async def stop(self, chat: ChatSeen) -> None:
        r = await self.client.post(f"/api/chats/{chat.id}/stop", headers=self.auth)
        self.ledger.requests[f"chat.stop {r.status_code}"] += 1
        self.ledger.stops += 1
        if r.status_code != 200:
            await self.refused("chat.stop", r)

    # --- the OpenAI API (not stored) -----------------------------------------------------------
    async def ask_v1(self, stream: bool) -> None:
        kind = "v1.stream" if stream else "v1.plain"
        body: dict[str, Any] = {"messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}],
                                "max_tokens": self.rng.randint(*self.plan.max_tokens), "temperature": 0.8,
                                "stream": stream}
        t0 = time.perf_counter()
        if not stream:
            r = await self.client.post("/v1/chat/completions", json=body, headers=self.auth)
            self.ledger.requests[f"{kind} {r.status_code}"] += 1
            if r.status_code != 200:
                await self.refused(kind, r)
                return
            self.ledger.tokens += r.json()["usage"]["completion_tokens"]
            return
        body["stream_options"] = {"include_usage": True}
        hang_up_after = self.rng.randint(1, 6) if self.rng.random() < self.plan.p_hang_up else None
        async with self.client.stream("POST", "/v1/chat/completions", json=body, headers=self.auth) as r:
            self.ledger.requests[f"{kind} {r.status_code}"] += 1
            if r.status_code != 200:
                await self.refused(kind, r)
                return
            chunks, finished = 0, False
            async for _, data in sse(r):
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    self.ledger.fail(f"{kind}: error in the stream: {chunk['error']}")
                    return
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        if not chunks:
                            self.ledger.ttft["v1"].append(time.perf_counter() - t0)
                        chunks += 1
                    finished = finished or bool(choice.get("finish_reason"))
                if chunk.get("usage"):
                    self.ledger.tokens += chunk["usage"]["completion_tokens"]
                if hang_up_after is not None and chunks >= hang_up_after:
                    self.ledger.hang_ups += 1
                    return
            if not finished:
                self.ledger.fail(f"{kind}: the stream ended without a finish_reason")
