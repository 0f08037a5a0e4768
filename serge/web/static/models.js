// The Models page: start a pull and follow its progress (server-sent events), cancel it, delete a model.
// The server renders the lists; this module only swaps in the fresh fragment after a change.

import { errorText } from "./sse.js";

const $ = (selector, root = document) => root.querySelector(selector);
const ui = {
  status: $("#status"),
  form: $("#pull-form"),
  source: $("#pull-source"),
  start: $("#pull-start"),
  box: $("#pull-progress"),
  name: $("#pull-name"),
  stage: $("#pull-stage"),
  bar: $("#pull-bar"),
  text: $("#pull-text"),
  cancel: $("#pull-cancel"),
  models: $("#models"),
};
const state = { pull: null, events: null };

function showStatus(text, kind = "info") {
  ui.status.hidden = !text;
  ui.status.textContent = text || "";
  ui.status.dataset.kind = text ? kind : "";
}

function size(bytes) {
  if (bytes == null) return "?";
  return bytes >= 1e9 ? `${(bytes / 1e9).toFixed(2)} GB` : `${(bytes / 1e6).toFixed(1)} MB`;
}

async function refreshModels() {
  const response = await fetch("/fragments/models");
  if (response.ok) ui.models.innerHTML = await response.text(); // server-rendered and escaped
}

// --- pulling ---------------------------------------------------------------------
function showPull(pull) {
  ui.box.hidden = false;
  ui.name.textContent = pull.name;
  ui.stage.textContent = pull.state === "running" ? pull.stage : pull.state;
  if (pull.percent == null) ui.bar.removeAttribute("value"); // not known yet: an indeterminate bar
  else ui.bar.value = pull.percent;
  ui.bar.dataset.state = pull.state;
  const total = pull.bytes_total == null ? "" : ` of ${size(pull.bytes_total)}`;
  const percent = pull.percent == null ? "" : ` (${pull.percent}%)`;
  ui.text.textContent = `${size(pull.bytes_done)}${total}${percent}`;
  ui.cancel.hidden = pull.state !== "running";
  ui.start.disabled = pull.state === "running";
}

function follow(pull) {
  state.pull = pull;
  showPull(pull);
  state.events?.close();
  const events = new EventSource(`/api/models/pulls/${pull.id}/events`);
  state.events = events;
  events.addEventListener("progress", (event) => showPull(JSON.parse(event.data)));
  for (const end of ["done", "failed", "cancelled"]) {
    events.addEventListener(end, async (event) => {
      events.close(); // the stream is over: no reconnecting
      const body = JSON.parse(event.data);
      showPull(body);
      if (end === "done") showStatus(`Installed ${body.name}. Choose it in a chat's settings.`);
      else if (end === "failed") showStatus(`The pull failed: ${body.error}`, "error");
      else showStatus(`Cancelled; nothing of ${body.name} was installed.`);
      await refreshModels();
    });
  }
  events.onerror = () => {
    if (events.readyState === EventSource.CLOSED) showStatus("Lost the connection to the server.", "error");
  };
}

ui.form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const source = ui.source.value.trim();
  if (!source) return;
  showStatus("");
  ui.start.disabled = true;
  const response = await fetch("/api/models/pulls", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ source }),
  });
  if (!response.ok) {
    ui.start.disabled = false;
    showStatus(await errorText(response), "error");
    return;
  }
  ui.source.value = "";
  follow(await response.json());
});

ui.cancel.addEventListener("click", async () => {
  if (!state.pull) return;
  ui.cancel.disabled = true;
  const response = await fetch(`/api/models/pulls/${state.pull.id}`, { method: "DELETE" });
  ui.cancel.disabled = false;
  if (!response.ok) showStatus(await errorText(response), "error");
});

// --- deleting ---------------------------------------------------------------------
ui.models.addEventListener("click", async (event) => {
  const button = event.target.closest("button.delete-model");
  if (!button) return;
  const name = button.dataset.name;
  if (!confirm(`Delete the model “${name}”? Its files are removed from this machine.`)) return;
  button.disabled = true;
  const response = await fetch(`/api/models/${name}`, { method: "DELETE" });
  if (response.ok) showStatus(`Deleted ${name}.`);
  else showStatus(await errorText(response), "error");
  await refreshModels();
});

// A pull started before this page was opened (or reloaded) is followed too.
const running = await fetch("/api/models/pulls").then((r) => (r.ok ? r.json() : { data: [] }));
const current = running.data.filter((p) => p.state === "running").pop();
if (current) follow(current);
setInterval(() => { if (!document.hidden) refreshModels(); }, 10000);
