// "Save as a preset" in the chat's settings panel: the chat's model, system prompt, settings and collections
// kept under a name (POST /api/presets), then picked as the chat's model. What a preset does is the server's.

import { errorText } from "./sse.js";

const $ = (selector) => document.querySelector(selector);

function presetsGroup(select) {
  let group = select.querySelector('optgroup[label="Presets"]');
  if (!group) {
    group = document.createElement("optgroup");
    group.label = "Presets";
    select.append(group);
  }
  return group;
}

function chosenSettings() {
  const settings = {};
  for (const input of document.querySelectorAll('#settings-form input[type="number"]')) {
    if (input.value !== "") settings[input.name] = Number(input.value);
  }
  return settings;
}

async function savePreset(event) {
  event.preventDefault();
  const select = $("#set-model"), error = $("#preset-error"), saved = $("#preset-saved");
  error.hidden = true;
  saved.textContent = "";
  const body = {
    name: $("#preset-name").value.trim(),
    model: select.selectedOptions[0]?.dataset.base || select.value || select.dataset.default,  // a preset: its model
    system_prompt: $("#set-system").value || null,
    settings: chosenSettings(),
    knowledge: [...document.querySelectorAll('#settings-form input[name="knowledge"]:checked')].map((c) => c.value),
    shared: Boolean($("#preset-shared")?.checked),
  };
  const response = await fetch("/api/presets", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!response.ok) {
    error.textContent = await errorText(response);
    error.hidden = false;
    return;
  }
  const preset = await response.json();
  const option = new Option(`${preset.name} · ${preset.model}`, preset.name);
  option.dataset.base = preset.model;
  presetsGroup(select).append(option);
  select.value = preset.name;  // the chat now uses it; its own prompt and settings stay, the same as the preset's
  $("#settings-form").dispatchEvent(new Event("input"));
  saved.textContent = `Saved “${preset.name}”; this chat uses it now.`;
}

$("#preset-form")?.addEventListener("submit", savePreset);
