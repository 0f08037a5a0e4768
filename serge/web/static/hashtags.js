// `#name` in the message box names one of your knowledge collections for that message. Typing `#` offers
// the names that match in a small list under the box (arrows move, Enter or Tab picks, Escape closes); on
// send, the names typed are the message's `knowledge`. The text goes as typed. Names come from the page.

const WORD = /(?:^|\s)#([\p{L}\p{N}_.-]*)$/u;
const TAGS = /(?:^|\s)#([\p{L}\p{N}_.-]+)/gu;

export function hashtags({ box, list, names }) {
  let shown = [];
  let active = 0;

  function close() {
    shown = [];
    list.hidden = true;
    list.replaceChildren();
    box.removeAttribute("aria-activedescendant");
  }

  function render() {
    list.replaceChildren();
    shown.forEach((name, index) => {
      const item = document.createElement("li");
      item.id = `knowledge-option-${index}`;
      item.setAttribute("role", "option");
      item.setAttribute("aria-selected", String(index === active));
      item.className = "knowledge-option";
      item.textContent = `#${name}`; // as text, never as markup
      item.addEventListener("mousedown", (event) => { event.preventDefault(); pick(name); });
      list.append(item);
    });
    list.hidden = shown.length === 0;
    if (shown.length) box.setAttribute("aria-activedescendant", `knowledge-option-${active}`);
  }

  function typed() {
    return box.value.slice(0, box.selectionStart).match(WORD);
  }

  function offer() {
    const found = typed();
    if (!found || !names.length) return close();
    const start = found[1].toLowerCase();
    shown = names.filter((name) => name.toLowerCase().startsWith(start)).slice(0, 8);
    active = 0;
    render();
  }

  function pick(name) {
    const caret = box.selectionStart;
    const found = typed();
    const from = caret - found[1].length;
    box.value = `${box.value.slice(0, from)}${name} ${box.value.slice(caret)}`;
    box.selectionStart = box.selectionEnd = from + name.length + 1;
    close();
    box.focus();
  }

  box.addEventListener("input", offer);
  box.addEventListener("blur", close);
  // Registered before the page's own keys: Enter picks a name while the list is open, it does not send.
  box.addEventListener("keydown", (event) => {
    if (list.hidden) return;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      active = (active + (event.key === "ArrowDown" ? 1 : shown.length - 1)) % shown.length;
      render();
    } else if (event.key === "Enter" || event.key === "Tab") {
      pick(shown[active]);
    } else if (event.key === "Escape") {
      close();
    } else {
      return;
    }
    event.preventDefault();
    event.stopImmediatePropagation();
  });

  return {
    // The collections a message's text names, each once, in the order typed.
    named(text) {
      const found = [...text.matchAll(TAGS)].map((m) => m[1].replace(/\.+$/, ""));
      return [...new Set(found.filter((name) => names.includes(name)))];
    },
  };
}
