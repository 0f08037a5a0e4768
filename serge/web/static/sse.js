// Server-sent events from a fetch() response (EventSource cannot POST).
// Yields {event, data} with data parsed as JSON.

export async function* readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) !== -1) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

// The error of a failed API call: the server's message (never a blank) and its code, if any.
export async function errorOf(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return { message: body.error.message, code: body.error.code };
  } catch (_) { /* not JSON */ }
  return { message: `the server answered ${response.status} ${response.statusText || ""}`.trim(), code: null };
}

export async function errorText(response) {
  return (await errorOf(response)).message;
}
