// Files for the next message: taken by the picker, by dropping them on the message box
// or by pasting them, shown as chips until sent, then uploaded to the chat (one request
// each) so the message can name them by id. The server reads them; this only carries bytes.

import { errorText } from "./sse.js";

const $ = (selector, root = document) => root.querySelector(selector);

export function attachments({ composer, input, picker, list, onError }) {
  const pending = [];

  function render() {
    list.replaceChildren();
    list.hidden = pending.length === 0;
    pending.forEach((file, index) => {
      const item = document.createElement("li");
      item.className = "attachment";
      const name = document.createElement("span");
      name.textContent = file.name; // as text, never as markup
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "icon";
      remove.textContent = "✕";
      remove.setAttribute("aria-label", `Remove ${file.name}`);
      remove.addEventListener("click", () => { pending.splice(index, 1); render(); });
      item.append(name, remove);
      list.append(item);
    });
  }

  function add(files) {
    for (const file of files) pending.push(file);
    render();
  }

  picker.addEventListener("click", () => input.click());
  input.addEventListener("change", () => { add(input.files); input.value = ""; });
  composer.addEventListener("dragover", (event) => {
    if (!event.dataTransfer?.types.includes("Files")) return;
    event.preventDefault();
    composer.classList.add("dropping");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dropping"));
  composer.addEventListener("drop", (event) => {
    composer.classList.remove("dropping");
    if (!event.dataTransfer?.files.length) return;
    event.preventDefault();
    add(event.dataTransfer.files);
  });
  composer.addEventListener("paste", (event) => {
    const files = event.clipboardData?.files;
    if (!files?.length) return; // plain text pastes as usual
    event.preventDefault();
    add(files);
  });

  return {
    get count() { return pending.length; },
    // Upload every pending file to the chat; their ids, or null (and the reason shown) when one is refused.
    async upload(chatId) {
      const ids = [];
      for (const file of pending) {
        const form = new FormData();
        form.append("file", file, file.name);
        const response = await fetch(`/api/chats/${chatId}/files`, { method: "POST", body: form });
        if (!response.ok) {
          onError(`${file.name}: ${await errorText(response)}`);
          return null;
        }
        ids.push((await response.json()).id);
      }
      pending.length = 0;
      render();
      return ids;
    },
  };
}
