// The instance feed, shared by every console tab of this browser (a module SharedWorker).
//
// A browser gives an origin six HTTP/1.1 connections in all; one stream per
// tab would leave the seventh tab unable to load. This worker holds the one
// /api/event stream and hands each frame to every tab. Tabs send the
// password ({password}); on a 401 the worker asks them ({auth: true, tried}:
// the password refused, null for none) and waits for one. It reconnects with
// backoff; each connection starts with `server.connected`, after which tabs
// re-read what the feed cannot replay.
import { readFrames } from "./console-sse.js";

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
  const sentWith = password;
  if (password) headers.Authorization = "Bearer " + password;
  const response = await fetch("/api/event", { headers, signal });
  if (response.status === 401) {
    // A tab sent a new password while this was on its way: try that one
    // instead of asking the tabs again (a dialog reopened after sign-in).
    if (password !== sentWith) return true;
    waitingForPassword = true;
    broadcast({ auth: true, tried: sentWith });
    return false;
  }
  if (!response.ok) return true;
  setUp(true);
  await readFrames(response, (frame) => broadcast({ frame }));
  return true;
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
  // A tab joining a feed that is up gets no server.connected: it is told instead.
  port.postMessage({ state: up, joined: up });
  if (waitingForPassword) port.postMessage({ auth: true, tried: password });
};
