// The Knowledge page: make, rename and delete collections, upload files with a progress bar, follow
// their indexing (asked again every second while a file waits), and share one with groups or everyone
// (a collection shared with you is listed read-only). Everything shown comes from
// /api/knowledge and is set as text, never as markup.

import { errorText } from "./sse.js";

const $ = (selector, root = document) => root.querySelector(selector);
const POLL_MS = 1000;
const ui = { status: $("#status"), form: $("#new-form"), name: $("#new-name"), list: $("#collections"),
             empty: $("#empty") };
const uploads = new Map(); // collection id -> { name, percent } of the file being sent
let timer = null;

function showStatus(text, kind = "info") {
  ui.status.hidden = !text;
  ui.status.textContent = text || "";
  ui.status.dataset.kind = text ? kind : "";
}

function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

function button(text, onClick, label) {
  const b = el("button", { type: "button", textContent: text });
  if (label) b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

async function call(method, path, body) {
  const response = await fetch(path, {
    method, headers: body ? { "Content-Type": "application/json" } : {}, body: body ? JSON.stringify(body) : undefined,
  });
  if (!response.ok) {
    showStatus(await errorText(response), "error");
    return null;
  }
  showStatus("");
  return response.status === 204 ? {} : response.json();
}

function upload(collection, file) {
  // XMLHttpRequest, for the upload's progress events (fetch has none)
  return new Promise((resolve) => {
    const request = new XMLHttpRequest();
    const form = new FormData();
    form.append("file", file, file.name);
    uploads.set(collection.id, { name: file.name, percent: 0 });
    request.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) uploads.set(collection.id, { name: file.name, percent: event.loaded / event.total * 100 });
      refresh();
    });
    request.addEventListener("loadend", () => {
      uploads.delete(collection.id);
      if (request.status !== 201) {
        let message = `${file.name}: the upload failed`;
        try { message = `${file.name}: ${JSON.parse(request.responseText).error.message}`; } catch (_) { /* as is */ }
        showStatus(message, "error");
      }
      resolve();
    });
    request.open("POST", `/api/knowledge/${collection.id}/files`);
    request.send(form);
  });
}

function fileRow(collection, file) {
  const passages = file.passages_total == null ? `${file.passages}` : `${file.passages} of ${file.passages_total}`;
  const state = el("td", { className: "state", textContent: file.state });
  if (file.error) state.append(el("div", { className: "help", textContent: file.error }));
  return el("tr", { className: `file ${file.state}` },
    el("td", { className: "source", textContent: file.name }), state,
    el("td", { textContent: passages }), el("td", { textContent: file.pages ?? "" }),
    el("td", {}, collection.read_only ? "" : button("Delete", async () => {
      if (await call("DELETE", `/api/knowledge/${collection.id}/files/${file.id}`)) refresh();
    }, `Delete ${file.name}`)));
}

function sharing(collection) {
  // a small form: the groups (by name, commas between) and everyone; saved as the collection's whole list
  const shared = collection.shared_with;
  const groups = el("input", { name: "groups", value: shared.groups.join(", "), size: 24, placeholder: "group, group" });
  groups.setAttribute("aria-label", `Groups to share ${collection.name} with`);
  const everyone = el("input", { type: "checkbox", name: "everyone", checked: shared.everyone });
  const form = el("form", { className: "inline share-form" }, groups,
    el("label", {}, everyone, " everyone"), el("button", { type: "submit", textContent: "Share" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const names = groups.value.split(",").map((g) => g.trim()).filter(Boolean);
    if (await call("PUT", `/api/knowledge/${collection.id}/shares`, { groups: names, everyone: everyone.checked })) {
      showStatus(names.length || everyone.checked ? `${collection.name} is shared.` : `${collection.name} is yours alone.`);
      refresh();
    }
  });
  return el("details", { className: "share" }, el("summary", { textContent:
    shared.everyone ? "Shared with everyone" : shared.groups.length ? `Shared with ${shared.groups.join(", ")}`
      : "Share" }), form);
}

function card(collection) {
  const head = el("div", { className: "pull-head" }, el("span", { className: "pull-name", textContent: collection.name }),
    el("span", { className: "help summary", textContent:
      `${collection.files_indexed} of ${collection.files} file(s) indexed · ${collection.passages} passages` }));
  const picker = el("input", { type: "file", multiple: true, hidden: true });
  picker.addEventListener("change", async () => {
    for (const file of [...picker.files]) await upload(collection, file);
    picker.value = "";
    refresh();
  });
  const actions = el("div", { className: "actions" }, picker,
    button("Upload", () => picker.click(), `Upload files to ${collection.name}`),
    button("Re-index", async () => { if (await call("POST", `/api/knowledge/${collection.id}/reindex`)) refresh(); }),
    button("Rename", async () => {
      const name = prompt("New name", collection.name);
      if (name && (await call("PATCH", `/api/knowledge/${collection.id}`, { name }))) refresh();
    }),
    button("Delete", async () => {
      if (confirm(`Delete ${collection.name} and its files?`)
          && (await call("DELETE", `/api/knowledge/${collection.id}`))) refresh();
    }, `Delete ${collection.name}`));
  if (collection.read_only) {
    // shared with this user: read and searched, never changed
    head.append(el("span", { className: "help", textContent: "shared with you · read-only" }));
    actions.replaceChildren();
  } else {
    actions.append(sharing(collection));
  }
  const box = el("article", { className: "pull collection" }, head);
  box.dataset.name = collection.name;
  box.dataset.state = collection.state;
  const sending = uploads.get(collection.id);
  if (sending) {
    box.append(el("div", { className: "help", textContent: `Uploading ${sending.name}` }),
      el("progress", { className: "upload", max: 100, value: sending.percent }));
  }
  if (collection.state === "indexing") {
    box.append(el("progress", { className: "indexing", max: collection.files, value: collection.files_indexed }),
      button("Cancel", async () => { if (await call("POST", `/api/knowledge/${collection.id}/cancel`)) refresh(); }));
  }
  box.append(actions);
  if (collection.data.length) {
    const head = el("tr", {}, ...["File", "State", "Passages", "Pages", ""].map((t) => el("th", { textContent: t })));
    box.append(el("div", { className: "table-wrap" }, el("table", { className: "models-table" },
      el("thead", {}, head), el("tbody", {}, ...collection.data.map((f) => fileRow(collection, f))))));
  }
  return box;
}

async function refresh() {
  clearTimeout(timer);
  const listed = await call("GET", "/api/knowledge");
  if (!listed) return;
  const full = await Promise.all(listed.data.map((c) => call("GET", `/api/knowledge/${c.id}`)));
  const found = full.filter(Boolean);
  ui.list.replaceChildren(...found.map(card));
  ui.empty.hidden = found.length > 0;
  if (found.some((c) => c.state === "indexing") || uploads.size) timer = setTimeout(refresh, POLL_MS);
}

ui.form.addEventListener("submit", async (event) => {
  event.preventDefault();
  if (await call("POST", "/api/knowledge", { name: ui.name.value.trim() })) {
    ui.name.value = "";
    refresh();
  }
});

refresh();
