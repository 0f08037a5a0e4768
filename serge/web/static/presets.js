// "Save as a preset" in the chat's settings panel: the chat's model, system prompt, settings, collections, ticked
// tools and tool choice kept under a name (POST /api/presets), then picked as the chat's model; and, for the
// preset picked, what it brings (its system prompt and tools) shown under the picker. What a preset does is the
// server's.

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
    tools: [...document.querySelectorAll('#settings-form input[name="tools"]:checked')].map((c) => c.value),
    tool_choice: $("#set-tool-choice")?.value || "auto",
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
  option.dataset.system = preset.system_prompt || "";
  option.dataset.tools = preset.tools.join(",");
  option.dataset.toolChoice = preset.tool_choice;
  presetsGroup(select).append(option);
  select.value = preset.name;  // the chat now uses it; its own prompt and settings stay, the same as the preset's
  $("#settings-form").dispatchEvent(new Event("input"));
  saved.textContent = `Saved “${preset.name}”; this chat uses it now.`;
  showPreset();
}

const CHOICES = { first: "a tool call first in every reply", always: "a tool call at every step" };

// What the preset picked brings, in words: its system prompt and its tools (the chat's own win where it has any).
function showPreset() {
  const info = $("#preset-info"), option = $("#set-model")?.selectedOptions[0];
  if (!info) return;
  if (!option?.dataset.base) {
    info.hidden = true;
    info.textContent = "";
    return;
  }
  const { system, tools, toolChoice } = option.dataset;
  const shown = system.length > 300 ? `${system.slice(0, 300)}…` : system;
  const choice = CHOICES[toolChoice] ? ` (${CHOICES[toolChoice]})` : "";
  const parts = [system ? `System prompt: “${shown}”` : "No system prompt",
                 tools ? `Tools: ${tools.split(",").join(", ")}${choice}` : "No tools"];
  info.textContent = `Preset ${option.value}. ${parts.join(". ")}.`;  // as text, never as markup
  info.hidden = false;
}

$("#preset-form")?.addEventListener("submit", savePreset);
$("#set-model")?.addEventListener("change", showPreset);
showPreset();
