// The chat list in the sidebar: search, rename and delete, and showing or hiding it on a narrow screen.
// The list is server-rendered (/fragments/chats); this swaps it in and calls the chat API, nothing more.

import { errorText } from "./sse.js";
import { debounce } from "./debounce.js";

const $ = (selector, root = document) => root.querySelector(selector);

// `chatId()`: the chat on screen (null before it starts); `title`: the page's heading, kept to its name.
export function sidebar({ app, list, search, title, chatId, onError }) {
  async function refresh() {
    const params = new URLSearchParams({ q: search.value.trim(), current: chatId() || "" });
    const response = await fetch(`/fragments/chats?${params}`);
    if (!response.ok) return;
    list.innerHTML = await response.text();
    const current = $('[aria-current="page"] .chat-name', list);
    if (current) {
      title.textContent = current.textContent;
      document.title = `${current.textContent} · Serge`;
    }
  }

  function startRename(item) {
    const link = $(".chat-link", item);
    const name = $(".chat-name", item).textContent;
    const input = document.createElement("input");
    input.type = "text";
    input.value = name;
    input.maxLength = 200;
    input.className = "rename-input";
    input.setAttribute("aria-label", "Chat title");
    link.replaceWith(input);
    input.focus();
    input.select();
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title && title !== name) {
        const response = await fetch(`/api/chats/${item.dataset.chatId}`, {
          method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ title }),
        });
        if (!response.ok) onError(await errorText(response));
      }
      await refresh();
      $(`[data-chat-id="${item.dataset.chatId}"] .rename`, list)?.focus();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); finish(true); }
      if (event.key === "Escape") { event.preventDefault(); finish(false); }
    });
    input.addEventListener("blur", () => finish(true));
  }

  async function deleteChat(item) {
    const name = $(".chat-name", item).textContent;
    if (!confirm(`Delete the chat “${name}”? This cannot be undone.`)) return;
    const response = await fetch(`/api/chats/${item.dataset.chatId}`, { method: "DELETE" });
    if (!response.ok && response.status !== 404) {
      onError(await errorText(response));
      return;
    }
    if (item.dataset.chatId === chatId()) location.assign("/");
    else await refresh();
  }

  list.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    const item = event.target.closest(".chat-item");
    if (!button || !item) return;
    if (button.classList.contains("rename")) startRename(item);
    if (button.classList.contains("delete")) deleteChat(item);
  });
  search.addEventListener("input", debounce(refresh, 250));
  $("#new-chat").addEventListener("click", () => location.assign("/"));
  $("#open-sidebar").addEventListener("click", () => app.classList.add("show-sidebar"));
  $("#close-sidebar").addEventListener("click", () => app.classList.remove("show-sidebar"));

  return { refresh };
}
