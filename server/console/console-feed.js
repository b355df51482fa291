// The instance feed, shared by every console tab of this browser (a SharedWorker).
//
// A browser gives an origin six HTTP/1.1 connections in all; one stream per
// tab would leave the seventh tab unable to load. This worker holds the one
// /api/event stream and hands each frame to every tab. Tabs send the
// password ({password}); on a 401 the worker asks them ({auth: true}) and
// waits for one. It reconnects with backoff; each connection starts with
// `server.connected`, after which tabs re-read what the feed cannot replay.
"use strict";

const ports = new Set();
let password = null;
let control = null;
let up = false;
let waitingForPassword = false;

function broadcast(message) {
  for (const port of ports) port.postMessage(message);
}

function setUp(value) {
  up = value;
  broadcast({ state: value });
}

async function readFeed(signal) {
  const headers = { Accept: "text/event-stream" };
  if (password) headers.Authorization = "Bearer " + password;
  const response = await fetch("/api/event", { headers, signal });
  if (response.status === 401) {
    waitingForPassword = true;
    broadcast({ auth: true });
    return false;
  }
  if (!response.ok) return true;
  setUp(true);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return true;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const frame = { id: null, event: "message" };
      const data = [];
      for (const line of block.split("\n")) {
        if (!line || line[0] === ":") continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let v = colon < 0 ? "" : line.slice(colon + 1);
        if (v[0] === " ") v = v.slice(1);
        if (field === "id") frame.id = v;
        else if (field === "event") frame.event = v;
        else if (field === "data") data.push(v);
      }
      if (data.length) {
        frame.data = JSON.parse(data.join("\n"));
        broadcast({ frame });
      }
    }
  }
}

function start() {
  if (control) control.abort();
  const mine = (control = new AbortController());
  waitingForPassword = false;
  (async () => {
    let delay = 250;
    while (!mine.signal.aborted) {
      let again = true;
      try {
        again = await readFeed(mine.signal);
        delay = 250;
      } catch (err) {
        if (mine.signal.aborted) return;
      }
      setUp(false);
      if (!again) return; // waits for a password
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
  })();
}

self.onconnect = (event) => {
  const port = event.ports[0];
  ports.add(port);
  port.onmessage = (message) => {
    const data = message.data || {};
    if (data.bye) {
      ports.delete(port);
      return;
    }
    if ("password" in data) {
      const changed = data.password !== password;
      password = data.password;
      if (!control || (changed && (waitingForPassword || !up))) start();
    }
  };
  port.start();
  port.postMessage({ state: up });
  if (waitingForPassword) port.postMessage({ auth: true });
};
