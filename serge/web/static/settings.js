// The chat's settings panel: model, system prompt, collections and the sampling fields, saved to the chat
// as they change (before a chat starts, kept for the request that creates it).

import { errorText } from "./sse.js";
import { debounce } from "./debounce.js";

const $ = (selector, root = document) => root.querySelector(selector);

// `chatId()`: the chat on screen (null before it starts). Returns `collect()` (the chat's fields as the
// chat API takes them) and `flush()` (save a change still waiting, so the next reply has it).
export function settingsPanel({ panel, form, error, saved, toggle, chatId }) {
  function collect() {
    const data = new FormData(form);
    const settings = {};
    for (const input of form.querySelectorAll('input[type="number"]')) {
      if (input.value !== "") settings[input.name] = Number(input.value);
    }
    return {
      model: data.get("model") || null,
      system_prompt: data.get("system_prompt") || null,
      settings,
      knowledge: data.getAll("knowledge"),
      tools: data.getAll("tools"),
      tool_choice: data.get("tool_choice") || "auto",
    };
  }

  const save = debounce(async () => {
    error.hidden = true;
    if (!chatId()) {
      saved.textContent = "These settings apply when the chat starts.";
      return;
    }
    const response = await fetch(`/api/chats/${chatId()}`, {
      method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify(collect()),
    });
    if (response.ok) {
      saved.textContent = "Saved.";
    } else {
      saved.textContent = "";
      error.textContent = await errorText(response);
      error.hidden = false;
    }
  }, 400);

  // Each tickable server's tools, named under its box (asked once, when the panel first opens).
  let toolsListed = false;
  async function listTools() {
    if (toolsListed) return;
    toolsListed = true;
    const notes = [...form.querySelectorAll(".tool-names")];
    for (const note of notes) {  // a server not started yet may take a while to list its tools
      note.textContent = "Listing its tools…";
      note.setAttribute("aria-busy", "true");
    }
    const response = await fetch("/api/tools");
    for (const note of notes) note.removeAttribute("aria-busy");
    if (!response.ok) {
      for (const note of notes) note.textContent = "";
      return;
    }
    for (const server of (await response.json()).servers) {
      const note = [...form.querySelectorAll(".tool-names")].find((n) => n.dataset.server === server.name);
      if (!note) continue;
      note.textContent = server.error
        ? `Unavailable: ${server.error}`
        : server.tools.map((t) => t.name + (t.read_only ? "" : " (asks first)")).join(", ") || "no tools";
      if (server.error) unavailable(form.querySelector(`input[name="tools"][value="${CSS.escape(server.name)}"]`));
    }
  }

  // A server that cannot list its tools cannot be ticked; one the chat already has ticked can still be unticked.
  function unavailable(box) {
    if (!box) return;
    box.closest("label").classList.add("unavailable");
    box.disabled = !box.checked;
    box.addEventListener("change", () => { box.disabled = !box.checked; });
  }

  function show(open) {
    panel.hidden = !open;
    if (open) listTools();
    toggle.setAttribute("aria-expanded", String(open));
    if (open) $("#set-model").focus();
    else toggle.focus();
  }

  // "Always allow" answers, listed in the panel: Revoke makes that tool ask again in this chat.
  form.addEventListener("click", async (event) => {
    const button = event.target.closest("button.revoke");
    if (!button || !chatId()) return;
    const kept = [...form.querySelectorAll(".approval")].map((a) => a.dataset.key)
      .filter((key) => key !== button.dataset.key);
    const response = await fetch(`/api/chats/${chatId()}`, {
      method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ tool_approvals: kept }),
    });
    if (response.ok) {
      button.closest(".approval").remove();
      saved.textContent = `${button.dataset.key} asks again before it runs.`;
    } else {
      error.textContent = await errorText(response);
      error.hidden = false;
    }
  });

  form.addEventListener("input", save);
  form.addEventListener("submit", (event) => event.preventDefault());
  toggle.addEventListener("click", () => show(panel.hidden));
  $("#close-settings").addEventListener("click", () => show(false));
  panel.addEventListener("keydown", (event) => { if (event.key === "Escape") show(false); });

  return { collect, flush: save.flush };
}
