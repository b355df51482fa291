// The one reader of text/event-stream frames, for the page (console.js) and
// the shared feed worker (console-feed.js): both import it as a module.
//
// readFrames(response, onFrame) reads the body of one SSE response to its end
// and calls onFrame({id, event, data}) per frame that carries data (`data` is
// the frame's JSON, its `data:` lines joined by newlines). Comments (": ping")
// and frames without data are skipped. Lines end in LF, as server/sse.py
// writes them.

export async function readFrames(response, onFrame) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = parseBlock(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (frame) onFrame(frame);
    }
  }
}

// One frame's lines (without the blank line that ends it) -> a frame, or null.
export function parseBlock(block) {
  const frame = { id: null, event: "message" };
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line[0] === ":") continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "id") frame.id = value;
    else if (field === "event") frame.event = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  frame.data = JSON.parse(data.join("\n"));
  return frame;
}
