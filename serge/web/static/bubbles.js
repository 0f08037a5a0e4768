// A message being written on the chat page, built from text (never markup) while it streams: its bubble,
// the note that the model could not see the oldest messages, and a thinking model's live thoughts. Once
// saved, the server-rendered message takes its place.

export function messageBubble(role, content) {
  const article = document.createElement("article");
  article.className = `msg msg-${role}`;
  article.dataset.role = role;
  const head = document.createElement("header");
  head.className = "msg-head";
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Assistant";
  head.append(who);
  const body = document.createElement("div");
  body.className = "msg-body plain";
  body.textContent = content;
  article.append(head, body);
  return article;
}

// Said while the reply streams; once saved, the server-rendered reply says the same (pages.dropped_text).
export function noteDropped(article, count) {
  const oldest = count === 1 ? "the oldest message" : `the ${count} oldest messages`;
  const note = document.createElement("footer");
  note.className = "msg-meta";
  const badge = document.createElement("span");
  badge.className = "badge dropped";
  badge.dataset.dropped = String(count);
  badge.textContent = `written without ${oldest}: the chat is longer than the model's context`;
  note.append(badge);
  article.append(note);
}

// A thinking model's thoughts, shown live above the reply while they stream (as text, never as markup);
// once saved, the server-rendered reply folds them away.
export function thoughtsOf(article) {
  let details = article.querySelector(".thoughts");
  if (!details) {
    details = document.createElement("details");
    details.className = "thoughts";
    details.open = true;
    const summary = document.createElement("summary");
    summary.textContent = "Thinking…";
    const body = document.createElement("div");
    body.className = "thoughts-body";
    details.append(summary, body);
    article.querySelector(".msg-body").before(details);
  }
  return details;
}

// A tool call of the reply, as it happens (as text, never as markup): folded, with its arguments and result;
// while it waits for approval, Allow, Always allow and Deny buttons. Once saved, the server renders the same.
export function toolCallOf(article, call) {
  let details = [...article.querySelectorAll(".tool-call")].find((d) => d.dataset.callId === call.id);
  if (!details) {
    details = document.createElement("details");
    details.className = "tool-call";
    details.dataset.callId = call.id;
    article.querySelector(".msg-body").before(details);
  }
  details.dataset.state = call.state;
  details.replaceChildren();
  const summary = document.createElement("summary");
  summary.textContent = `${call.server}${call.tool ? " · " + call.tool : ""} `;
  const state = document.createElement("span");
  state.className = "tool-state";
  state.textContent = call.state + (call.cut ? " (output cut)" : "");
  summary.append(state);
  details.append(summary);
  if (call.state === "running") {  // how long it has run, counted from when this page first saw it run
    details.dataset.started = details.dataset.started || String(Date.now());
    const seconds = Math.floor((Date.now() - Number(details.dataset.started)) / 1000);
    state.textContent = `running ${seconds} s`;
    clearTimeout(details.tick);
    details.tick = setTimeout(() => { if (details.dataset.state === "running") toolCallOf(article, call); }, 1000);
  }
  if (call.arguments) details.append(labelled("Arguments", "tool-arguments", call.arguments));
  if (call.state === "waiting") {
    details.open = true;
    const ask = document.createElement("div");
    ask.className = "tool-approval";
    for (const [label, allow, always] of [["Allow", true, false], ["Always allow", true, true], ["Deny", false, false]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = allow ? "tool-allow" : "tool-deny";
      button.textContent = label;
      button.dataset.allow = String(allow);
      button.dataset.always = String(always);
      ask.append(button);
    }
    details.append(ask);
  } else if (call.state !== "running") {
    details.append(labelled("Result", "tool-result", call.result));
  }
  return details;
}

function labelled(label, className, text) {
  const part = document.createElement("div");
  part.className = "tool-part";
  const name = document.createElement("span");
  name.className = "tool-label";
  name.textContent = label;
  const body = document.createElement("pre");
  body.className = className;
  body.textContent = text;  // as text, never as markup
  part.append(name, body);
  return part;
}
