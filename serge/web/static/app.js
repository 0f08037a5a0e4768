// The chat page's behaviour. The server renders every message; this module only
// streams a reply's text and thoughts (as plain text) and swaps in server-rendered fragments.

import { readEvents, errorOf, errorText } from "./sse.js";
import { messageBubble, noteDropped, thoughtsOf, toolCallOf } from "./bubbles.js";
import { attachments } from "./attach.js";
import { hashtags } from "./hashtags.js";
import { sidebar } from "./sidebar.js";
import { settingsPanel } from "./settings.js";

const $ = (selector, root = document) => root.querySelector(selector);
const JSON_HEADERS = { "Content-Type": "application/json" };

const ui = {
  app: $(".app"),
  conversation: $("#conversation"),
  composer: $("#composer"),
  message: $("#message"),
  send: $("#send"),
  stop: $("#stop"),
  status: $("#status"),
};

const state = { chatId: document.body.dataset.chatId || null, busy: false };
const files = attachments({
  composer: $("#composer"), input: $("#attach-input"), picker: $("#attach"), list: $("#attachments"),
  onError: (text) => showStatus(text, "error"),
});
const chats = sidebar({
  app: ui.app, list: $("#chat-list"), search: $("#search"), title: $("#chat-title"),
  chatId: () => state.chatId, onError: (text) => showStatus(text, "error"),
});
const settings = settingsPanel({
  panel: $("#settings"), form: $("#settings-form"), error: $("#settings-error"), saved: $("#settings-saved"),
  toggle: $("#toggle-settings"), chatId: () => state.chatId,
});
const tags = hashtags({
  box: $("#message"), list: $("#knowledge-list"), names: JSON.parse($("#knowledge-list").dataset.names || "[]"),
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// --- status line: model loading, busy, errors ------------------------------------
function showStatus(text, kind = "info") {
  ui.status.hidden = !text;
  ui.status.textContent = text || "";
  ui.status.dataset.kind = text ? kind : "";
}

async function watchHealth() {
  for (;;) {
    let body;
    try {
      body = await (await fetch("/api/health")).json();
    } catch (err) {
      showStatus("Cannot reach the Serge server; retrying…", "error");
      await sleep(3000);
      continue;
    }
    if (body.status === "ok") {
      if (ui.status.dataset.kind === "loading") showStatus("");
      return;
    }
    if (body.status === "error") {
      showStatus(`The model could not be loaded: ${body.error || "unknown error"}`, "error");
      return;
    }
    if (body.status === "draining") {  // this process stops soon: behind a balancer, another answers next
      await sleep(1000);
      continue;
    }
    showStatus(`Loading the model ${body.default_model}… replies start once it is ready.`, "loading");
    await sleep(2000);
  }
}

// --- rendering helpers ------------------------------------------------------------
function scrollToEnd() {
  ui.conversation.scrollTop = ui.conversation.scrollHeight;
}

function addCodeCopyButtons(root) {
  for (const pre of root.querySelectorAll(".md pre")) {
    if (pre.querySelector(".code-copy")) continue;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "code-copy";
    button.textContent = "Copy code";
    pre.prepend(button);
  }
}

function appendMessage(role, content) {
  $(".empty-chat", ui.conversation)?.remove();
  const article = messageBubble(role, content);
  ui.conversation.append(article);
  scrollToEnd();
  return article;
}

async function refreshConversation() {
  if (!state.chatId) return;
  const response = await fetch(`/c/${state.chatId}/conversation`);
  if (!response.ok) return;
  ui.conversation.innerHTML = await response.text(); // server-rendered and escaped
  addCodeCopyButtons(ui.conversation);
  scrollToEnd();
  const streaming = $('[data-status="streaming"]', ui.conversation);
  if (!state.busy && streaming) {
    await showWaitingCalls(streaming);
    showStatus(streaming.querySelector(".tool-call[data-state=waiting]")
      ? "A tool call of this reply waits for your answer." : "A reply to this chat is still being written…", "info");
    setTimeout(refreshConversation, 2000);
  } else if (ui.status.dataset.kind === "info") {
    showStatus("");
  }
}

// The calls of a reply running elsewhere (another tab, another process, before a reload) that wait for an answer:
// each with its buttons, whichever tab answers first.
async function showWaitingCalls(bubble) {
  const response = await fetch(`/api/chats/${state.chatId}/tool-calls`);
  if (!response.ok) return;
  for (const call of (await response.json()).data) toolCallOf(bubble, call);
}

// --- sending and streaming --------------------------------------------------------
function setBusy(busy) {
  state.busy = busy;
  ui.send.disabled = busy;
  ui.stop.hidden = !busy;
  ui.stop.disabled = false;
  ui.conversation.setAttribute("aria-busy", busy ? "true" : "false");
  if (!busy && document.activeElement === ui.stop) ui.message.focus();
}

async function ensureChat() {
  if (state.chatId) return true;
  const response = await fetch("/api/chats", {
    method: "POST", headers: JSON_HEADERS, body: JSON.stringify(settings.collect()),
  });
  if (!response.ok) {
    showStatus(await errorText(response), "error");
    return false;
  }
  const chat = await response.json();
  state.chatId = chat.id;
  document.body.dataset.chatId = chat.id;
  history.pushState({ chatId: chat.id }, "", `/c/${chat.id}`);
  return true;
}

// Resolves to true when the server refused the request before any reply began (a quota, a full queue, ...).
async function streamReply(url, body) {
  setBusy(true);
  await settings.flush(); // settings changed a moment ago apply to this reply
  const bubble = appendMessage("assistant", "");
  bubble.dataset.status = "streaming";
  const text = $(".msg-body", bubble);
  try {
    const response = await fetch(url, {
      method: "POST", headers: JSON_HEADERS, body: body ? JSON.stringify(body) : undefined,
    });
    if (!response.ok) {
      const { message: reason, code } = await errorOf(response);
      // a 503 is "busy" only for a full queue: a model that will not load or a database fault says so itself
      const busy = code === "engine_busy" || response.status === 429 || response.status === 409;
      const told = code === "quota_exceeded" ? `Quota reached: ${reason}` // which cap, and when it resets
        : busy ? `The model is busy: ${reason}` : `Error: ${reason}`;
      showStatus(told, "error");
      return true;
    }
    showStatus("");
    for await (const { event, data } of readEvents(response)) {
      if (event === "start" && data.dropped_messages) {
        noteDropped(bubble, data.dropped_messages);
      } else if (event === "queued") {
        const ahead = data.ahead === 0 ? "next in line" : `${data.ahead} ahead of you`;
        showStatus(`Waiting for a free slot: ${ahead}.`, "queue");
      } else if (event === "reasoning") {
        if (ui.status.dataset.kind === "queue") showStatus("");
        $(".thoughts-body", thoughtsOf(bubble)).textContent += data.text; // as text, never as markup
        scrollToEnd();
      } else if (event === "delta") {
        if (ui.status.dataset.kind === "queue") showStatus("");
        const thoughts = $(".thoughts", bubble);
        if (thoughts && !text.textContent) {  // the answer begins: the thoughts fold away
          thoughts.open = false;
          $("summary", thoughts).textContent = "Thought";
        }
        text.textContent += data.text; // as text, never as markup
        scrollToEnd();
      } else if (event === "tool") {
        if (ui.status.dataset.kind === "queue") showStatus("");
        toolCallOf(bubble, data.call);
        scrollToEnd();
      } else if (event === "done" && data.message.status === "error") {
        showStatus(`The reply failed: ${data.message.error || "unknown error"}`, "error");
      }
    }
  } catch (err) {
    showStatus(`Lost the connection to the server: ${err.message}`, "error");
  } finally {
    setBusy(false);
    await refreshConversation();
    await chats.refresh();
  }
}

async function send() {
  const content = ui.message.value;
  if (state.busy || !content.trim()) return;
  await settings.flush();
  const created = !state.chatId;
  if (!(await ensureChat())) return;
  const attached = files.count ? await files.upload(state.chatId) : [];
  if (attached === null) return; // a file was refused: the message stays in the box
  ui.message.value = "";
  const asked = appendMessage("user", content);
  const refused = await streamReply(`/api/chats/${state.chatId}/messages`,
                                    { content, attachments: attached, knowledge: tags.named(content) });
  if (refused) await keepWhatWasTyped(content, asked, created);
}

// A refused message goes back in the box, and a chat made for it alone goes away (no empty "New chat" left).
async function keepWhatWasTyped(content, asked, created) {
  if (!ui.message.value) ui.message.value = content;
  asked.remove();
  if (!created || !state.chatId) return;
  const response = await fetch(`/api/chats/${state.chatId}`, { method: "DELETE" });
  if (!response.ok) return;
  state.chatId = null;
  delete document.body.dataset.chatId;
  history.replaceState(null, "", "/");
  await chats.refresh();
}

async function stop() {
  if (!state.chatId) return;
  ui.stop.disabled = true;
  const response = await fetch(`/api/chats/${state.chatId}/stop`, { method: "POST" });
  if (!response.ok) showStatus(await errorText(response), "error");
}

// A tool call waiting for the user: Allow (once or always in this chat) or Deny.
async function decideToolCall(button) {
  const details = button.closest(".tool-call");
  for (const b of details.querySelectorAll(".tool-approval button")) b.disabled = true;
  const response = await fetch(`/api/chats/${state.chatId}/tool-calls/${encodeURIComponent(details.dataset.callId)}`, {
    method: "POST", headers: JSON_HEADERS,
    body: JSON.stringify({ allow: button.dataset.allow === "true", always: button.dataset.always === "true" }),
  });
  if (!response.ok) showStatus(await errorText(response), "error");
}

// --- message actions: copy, edit, regenerate, versions ----------------------------
async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  const label = button.textContent;
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = label; }, 1200);
}

function rawText(article) {
  return $("template.raw", article)?.content.textContent ?? $(".msg-body", article).textContent;
}

function startEdit(article) {
  if (state.busy) return;
  const body = $(".msg-body", article);
  const form = document.createElement("form");
  form.className = "edit-form";
  const area = document.createElement("textarea");
  area.value = rawText(article);
  area.rows = 3;
  area.setAttribute("aria-label", "Edited text");
  const save = document.createElement("button");
  save.type = "submit";
  save.className = "primary";
  save.textContent = "Ask again";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.textContent = "Cancel";
  form.append(area, save, cancel);
  body.replaceWith(form);
  area.focus();
  cancel.addEventListener("click", refreshConversation);
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") refreshConversation();
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const content = area.value;
    if (!content.trim()) return;
    while (article.nextElementSibling) article.nextElementSibling.remove();
    article.remove();
    appendMessage("user", content);
    await streamReply(`/api/chats/${state.chatId}/messages/${article.dataset.id}/edit`, { content });
  });
}

async function regenerate(article) {
  if (state.busy) return;
  if (article.dataset.role === "assistant") article.remove();
  await streamReply(`/api/chats/${state.chatId}/regenerate`);
}

async function selectVersion(messageId) {
  if (state.busy || !messageId) return;
  const response = await fetch(`/api/chats/${state.chatId}/messages/${messageId}/select`, { method: "POST" });
  if (!response.ok) showStatus(await errorText(response), "error");
  await refreshConversation();
}

ui.conversation.addEventListener("click", (event) => {
  const button = event.target.closest("button");
  if (!button) return;
  const article = button.closest("article.msg");
  if (button.classList.contains("code-copy")) {
    const code = button.parentElement.querySelector("code") || button.parentElement;
    copyText(code.textContent, button);
  } else if (button.classList.contains("copy")) {
    copyText(rawText(article), button);
  } else if (button.classList.contains("edit")) {
    startEdit(article);
  } else if (button.classList.contains("regenerate")) {
    regenerate(article);
  } else if (button.classList.contains("version")) {
    selectVersion(button.dataset.target);
  } else if (button.closest(".tool-approval")) {
    decideToolCall(button);
  }
});

// --- the message box ------------------------------------------------------------------
ui.composer.addEventListener("submit", (event) => { event.preventDefault(); send(); });
ui.message.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
ui.stop.addEventListener("click", stop);

// Closing or leaving the page stops a reply in progress (its text so far is kept), unless it waits for the
// person's Allow or Deny: that call keeps waiting, for this page reloaded or another tab to answer.
window.addEventListener("pagehide", () => {
  const waiting = $(".tool-call[data-state=waiting]", ui.conversation);
  if (state.busy && state.chatId && !waiting) navigator.sendBeacon(`/api/chats/${state.chatId}/stop`);
});
window.addEventListener("popstate", () => location.reload());

addCodeCopyButtons(ui.conversation);
scrollToEnd();
if ($('[data-status="streaming"]', ui.conversation)) refreshConversation();
ui.message.focus();
watchHealth();
