// The sessionrt web console: plain JavaScript, no dependencies, no build step.
//
// Every call goes through api() or stream(), which add the password (asked
// for on the first 401, kept in sessionStorage for this tab) as a Bearer
// header; streams are read with fetch, since an EventSource cannot send one.
//
// The browser holds one long-lived stream, the instance feed (/api/event),
// shared by all console tabs through a SharedWorker (console-feed.js): a
// browser gives an origin six HTTP/1.1 connections in all, so a stream per
// view or per tab would leave later tabs waiting forever. The feed brings session
// statuses, unread marks, the live text/reasoning deltas and the durable
// events of the open session. Durable events are applied strictly in seq
// order: the session's log is read (finite reads, `after=` the last applied
// seq) when the session opens, whenever the feed (re)connects (it has no
// replay), and whenever a feed event arrives beyond the next seq; feed events
// at or below the last applied seq are skipped. So nothing is missed or shown
// twice. A durable event makes the page re-read the message it names, which
// is harmless to do twice. The log view and its "follow" toggle read the
// same way, from the last seq they showed, once the Log tab is first shown.
//
// First paint: the page comes with its style and this script inlined (see
// server/console/__init__.py); the session named in the URL and the list are
// read first, and the feed worker starts once the transcript stands (or after
// a second), so nothing on the way to the first screen waits for it.
//
// Permission asks (a tool call waiting for a person) are read from
// /api/session/{id}/permission whenever a session.permission.* event (or an
// event that can end an ask: a failed call, an ended execution) is applied,
// and shown on the tool call they hold, with once/always/reject buttons.
// Compaction rows show their reason and status; the summary is collapsed, and
// streams in from session.compaction.delta while the compaction runs.
//
// The work of a session: answers are rendered as Markdown (console-markdown.js
// builds DOM nodes, never HTML text, so an answer cannot run script or load
// from elsewhere); each prompt offers its changes (GET …/diff between it and
// the next prompt: the files its steps changed, with their patches), a fork
// from it, and a revert (stage, with or without its files; the staged revert
// is shown above the prompt with clear and commit). Each step that ran a
// writing tool shows the files it changed (GET …/diff?messageID=<the step>,
// read once the step has ended, kept for the view), collapsed, each file's
// diff inside. The header shows the session's agent (chosen from GET
// …/agent) and model (offered from GET /api/model, or typed: a provider
// configured without a model list takes any id), both switchable, and its
// parent; the sessions list
// shows child sessions under their parent. The user shell runs a command in
// the session's directory; its row shows the output.
// Served inlined into the page, this import replaced by the module itself
// (server/console/__init__.py); served alone, it imports it.
import { readFrames } from "/console/console-sse.js";
import { renderMarkdown } from "/console/console-markdown.js";
import { agentOptions, promptBar, renderDiff, revertText, sessionTree, stepChanges, wroteFiles } from "/console/console-work.js";

const BEYOND = 9007199254740991; // an `after` past any seq: the log answers with log.synced only
const FIRST_PAGE = 30; // messages per page: a screenful and more
const MAX_LOG_ROWS = 2000; // the log view keeps this many rows (older rows leave the page)
const MAX_OUTPUT = 4000; // characters of a tool output shown
const MAX_LIVE = 1 << 20; // characters of one streaming block kept before its durable end
const MAX_STEP_DIFFS = 200; // steps whose changed files a view keeps (the oldest read leaves first)

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const oneLine = (value, limit = 160) => {
  const text = (typeof value === "string" ? value : JSON.stringify(value) || "").replace(/\s+/g, " ");
  return text.length > limit ? text.slice(0, limit - 1) + "…" : text;
};

// -- calls -------------------------------------------------------------------------------------

let password = sessionStorage.getItem("sessionrt.password");
let asking = null;
let feedPort = null; // the shared feed worker's port

function askPassword() {
  if (!asking) {
    asking = new Promise((resolve) => {
      const dialog = $("auth");
      $("password").value = "";
      dialog.addEventListener(
        "close",
        () => {
          password = $("password").value || null;
          if (password) sessionStorage.setItem("sessionrt.password", password);
          if (feedPort) feedPort.postMessage({ password });
          asking = null;
          resolve();
        },
        { once: true },
      );
      dialog.showModal();
    });
  }
  return asking;
}

function headers(extra) {
  const h = Object.assign({}, extra);
  if (password) h.Authorization = "Bearer " + password;
  return h;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || "HTTP " + status);
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, body) {
  for (;;) {
    const init = { method, headers: headers() };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const sentWith = password;
    const response = await fetch(path, init);
    if (response.status === 401) {
      // Signed in while this was on its way: retry with the new password.
      if (password === sentWith) await askPassword();
      continue;
    }
    if (response.status === 204) return null;
    const json = await response.json().catch(() => null);
    if (!response.ok) throw new ApiError(response.status, json);
    return json;
  }
}

// Reads one SSE response with fetch; calls onEvent({id, event, data}) per frame.
async function stream(path, { onEvent, onOpen, signal, lastEventId }) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId) extra["Last-Event-ID"] = String(lastEventId);
  const sentWith = password;
  const response = await fetch(path, { headers: headers(extra), signal });
  if (response.status === 401) {
    if (password === sentWith) await askPassword();
    return;
  }
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  if (onOpen) onOpen();
  await readFrames(response, onEvent);
}

// Keeps a stream open: reconnects with backoff until stopped. `path()` is read
// on every connection, so it can carry the latest `after`.
function keep(path, onEvent, { lastEventId, onState } = {}) {
  const control = new AbortController();
  (async () => {
    let delay = 250;
    while (!control.signal.aborted) {
      try {
        await stream(path(), {
          onEvent,
          signal: control.signal,
          lastEventId: lastEventId && lastEventId(),
          onOpen: () => {
            delay = 250;
            if (onState) onState(true);
          },
        });
      } catch (err) {
        if (control.signal.aborted) return;
        if (err instanceof ApiError && err.status === 404) return;
      }
      if (onState) onState(false);
      if (control.signal.aborted) return;
      await sleep(delay);
      delay = Math.min(delay * 2, 5000);
    }
  })();
  return control;
}

// -- sessions list -----------------------------------------------------------------------------

const sessions = new Map(); // id -> Session
const status = new Map(); // id -> "running" | "retrying"
const retryAt = new Map(); // id -> epoch ms of the next attempt
const unread = new Set();
let current = null; // the open session's view
let feedWasUp = false; // this tab has seen the feed connected before
let sessionsRead = 0; // generation of the latest sessions read: an older answer is dropped

async function loadSessions() {
  const search = $("search").value.trim();
  const query = new URLSearchParams({ limit: "200" });
  if (search) query.set("search", search);
  const generation = ++sessionsRead;
  const [page, active] = await Promise.all([
    api("GET", "/api/session?" + query),
    api("GET", "/api/session/active"),
  ]);
  if (generation !== sessionsRead) return;
  sessions.clear();
  for (const session of page.data) {
    sessions.set(session.id, session);
    if (session.retry) retryAt.set(session.id, session.retry.at);
  }
  for (const id of [...status.keys()]) if (!(id in active.data)) status.delete(id);
  for (const id of Object.keys(active.data)) if (status.get(id) !== "retrying") status.set(id, "running");
  renderSessions();
}

function statusOf(id) {
  return status.get(id) || "idle";
}

function renderSessions() {
  const list = $("sessions");
  list.textContent = "";
  for (const [session, depth] of sessionTree(sessions)) {
    const item = el("li", depth ? "child" : "");
    item.dataset.id = session.id;
    if (depth) {
      item.dataset.parent = session.parentID;
      item.style.paddingLeft = 6 + 16 * Math.min(depth, 6) + "px";
    }
    const state = statusOf(session.id);
    const dot = el("span", "dot " + (state !== "idle" ? state : unread.has(session.id) ? "unread" : ""));
    dot.title = unread.has(session.id) && state === "idle" ? "unread" : state;
    item.append(dot, el("span", "title", session.title || session.id));
    item.classList.toggle("current", current !== null && current.id === session.id);
    item.classList.toggle("unread", unread.has(session.id));
    item.dataset.status = state;
    item.addEventListener("click", () => openSession(session.id));
    list.append(item);
  }
}

// -- the instance feed ---------------------------------------------------------------------------

function onFeed(frame) {
  const envelope = frame.data || {};
  const type = envelope.type || frame.event;
  const data = envelope.data || {};
  const sid = data.sessionID;
  if (type === "server.connected") {
    feedConnected();
    return;
  }
  if (!sid) return;
  if (type === "session.created" || type === "session.renamed" || type === "session.deleted") {
    loadSessions().catch(showError);
  }
  if (type === "session.execution.started") status.set(sid, "running");
  else if (type === "session.retry.scheduled") {
    status.set(sid, "retrying");
    retryAt.set(sid, data.at);
  } else if (type === "session.step.started" && status.get(sid) === "retrying") status.set(sid, "running");
  else if (/^session\.execution\.(succeeded|failed|interrupted)$/.test(type)) {
    status.delete(sid);
    retryAt.delete(sid);
  }
  if (envelope.durable && (!current || current.id !== sid)) unread.add(sid);
  if (envelope.durable && current && current.id === sid) {
    current.offer(envelope.durable.seq, type, envelope);
  }
  if (current && current.id === sid) {
    if (type === "session.text.delta") current.live(data, "text");
    else if (type === "session.reasoning.delta") current.live(data, "reasoning");
    else if (type === "session.compaction.delta") current.liveCompaction(data.text || "");
    current.renderStatus();
  }
  if (envelope.durable || type.startsWith("session.execution") || type === "session.retry.scheduled") {
    renderSessions();
  }
}

// The feed (re)connected, or this tab joined the worker's feed: what happened
// while this tab had no feed is read again. Durable changes come from the log
// (catchUp); the live text of a step that was streaming is read again with its
// message. Before this tab's first connection only unfinished answers can hold such text.
function feedConnected() {
  loadSessions().catch(showError);
  if (current) {
    if (feedWasUp) current.refreshAll();
    else current.refreshUnfinished();
    current.catchUp();
  }
  feedWasUp = true;
}

// -- one session ---------------------------------------------------------------------------------

class SessionView {
  constructor(id) {
    this.id = id;
    this.messages = new Map(); // id -> message
    this.nodes = new Map(); // id -> element
    this.liveText = new Map(); // messageID -> Map(ordinal -> {kind, text})
    this.older = null; // cursor to earlier messages
    this.lastSeq = 0; // the transcript stream's last durable seq
    this.logSeq = 0; // the log view's last seq
    this.logRows = 0;
    this.dirty = new Set();
    this.flushTimer = null;
    this.control = new AbortController(); // ends this view's reads when it closes
    this.ready = false; // messages read: durable events may apply
    this.pending = new Map(); // seq -> [type, envelope] arrived ahead of the next seq
    this.catching = null; // the log read in progress
    this.again = false;
    this.logLive = false; // the log view appends applied events
    this.logRun = 0;
    this.asks = new Map(); // permissionID -> pending ask
    this.asksRead = 0; // generation of the latest asks read: an older answer is dropped
    this.inboxRead = 0; // the same for the pending inbox
    this.compacting = null; // the id of the compaction row running, if known
    this.compactText = ""; // its summary so far, from the live deltas
    this.stepDiffs = new Map(); // assistant message id -> its step's FileDiff[] (ended steps only)
    this.stepReads = new Set(); // steps whose diff is being read
    this.openSteps = new Set(); // steps whose changed files are expanded
    this.openChanges = new Set(); // prompts whose changes are shown (so a redraw keeps them)
    this.agents = []; // GET …/agent: what the session may select
  }

  async start() {
    $("transcript").textContent = "";
    $("log").tBodies[0].textContent = "";
    $("session-id").textContent = this.id;
    const session = api("GET", "/api/session/" + this.id).then((answer) => answer.data);
    session.catch(() => {}); // a missing session fails the log read below, and is shown there
    // The watermark first, then the messages (which include at least that much),
    // then the log from the watermark: nothing falls between the two reads.
    this.lastSeq = await this.watermark();
    this.showInfo(await session);
    this.loadAgents();
    const page = await api("GET", `/api/session/${this.id}/message?limit=${FIRST_PAGE}&order=desc`);
    this.older = page.cursor.next || null;
    // One insertion and one layout for the whole page, not one per message.
    const box = $("transcript");
    const nodes = document.createDocumentFragment();
    for (const message of page.data.slice().reverse()) {
      const node = this.render(message);
      this.messages.set(message.id, message);
      const placeholder = this.nodes.get(message.id); // a live delta came first
      if (placeholder) placeholder.remove();
      this.nodes.set(message.id, node);
      nodes.append(node);
    }
    box.prepend(nodes);
    $("older").hidden = !this.older;
    this.scrollDown();
    this.renderStatus();
    this.loadInbox();
    this.loadAsks();
    this.ready = true;
    this.catchUp();
    // The log view reads the whole log: only once it is shown.
    if (!$("log-view").hidden) this.startLog();
  }

  stop() {
    this.control.abort();
    clearTimeout(this.flushTimer);
  }

  // A durable event of this session from the feed: applied in seq order only.
  offer(seq, type, envelope) {
    if (seq <= this.lastSeq) return;
    if (this.ready && !this.catching && seq === this.lastSeq + 1) {
      this.apply(seq, type, envelope);
      return;
    }
    if (this.pending.size < 10000) this.pending.set(seq, [type, envelope]);
    if (this.ready) this.catchUp();
  }

  // Read the log from the last applied seq (a finite read), then what waited.
  async catchUp() {
    if (!this.ready) return;
    if (this.catching) {
      this.again = true;
      return;
    }
    this.catching = true;
    try {
      do {
        this.again = false;
        await stream(`/api/experimental/session/${this.id}/log?after=${this.lastSeq}`, {
          signal: this.control.signal,
          lastEventId: this.lastSeq,
          onEvent: (frame) => {
            if (frame.event !== "log.synced") this.apply(Number(frame.id), frame.event, frame.data);
          },
        });
      } while (this.again);
    } catch (err) {
      if (!this.control.signal.aborted) showError(err);
    } finally {
      this.catching = null;
    }
    for (const seq of [...this.pending.keys()].sort((a, b) => a - b)) {
      const [type, envelope] = this.pending.get(seq);
      this.pending.delete(seq);
      if (seq === this.lastSeq + 1) this.apply(seq, type, envelope);
    }
    if (this.pending.size) {
      this.pending.clear();
      this.catchUp(); // still a hole: read it from the log
    }
  }

  async watermark() {
    let seq = 0;
    await stream(`/api/experimental/session/${this.id}/log?after=${BEYOND}`, {
      onEvent: (frame) => {
        if (frame.event === "log.synced") seq = frame.data.seq || 0;
      },
    });
    return seq;
  }

  async loadOlder() {
    if (!this.older) return;
    // A continuation takes only its cursor (which holds the page size).
    const page = await api("GET", `/api/session/${this.id}/message?cursor=${encodeURIComponent(this.older)}`);
    this.older = page.cursor.next || null;
    const box = $("transcript");
    const before = box.scrollHeight;
    for (const message of page.data) this.put(message);
    box.scrollTop += box.scrollHeight - before;
    $("older").hidden = !this.older;
  }

  refreshUnfinished() {
    for (const [id, message] of this.messages) {
      if (message.type === "assistant" && !message.finish && !message.error) this.dirty.add(id);
    }
    if (this.dirty.size) this.scheduleFlush();
  }

  refreshAll() {
    for (const id of this.messages.keys()) this.dirty.add(id);
    this.scheduleFlush();
    this.loadInbox();
    this.loadAsks();
  }

  // One durable event, the next in seq order (from the log or the feed).
  apply(seq, type, envelope) {
    if (!(seq > this.lastSeq)) return; // already applied
    this.lastSeq = seq;
    if (this.logLive && seq > this.logSeq) {
      this.logSeq = seq;
      this.logRow(seq, type, envelope);
    }
    const data = (envelope && envelope.data) || {};
    const target = data.assistantMessageID || (type === "session.inbox.delivered" ? data.inboxID : null);
    if (target) {
      this.dirty.add(target);
      this.scheduleFlush();
    }
    if (type.startsWith("session.inbox.")) this.loadInbox();
    if (
      type.startsWith("session.permission.") ||
      type === "session.tool.failed" ||
      /^session\.execution\.(succeeded|failed|interrupted)$/.test(type)
    ) {
      this.loadAsks();
    }
    if ((type === "session.shell.started" || type === "session.shell.ended") && data.shell) {
      this.dirty.add(data.shell.id);
      this.scheduleFlush();
    }
    if (type === "session.compaction.started") {
      // The row's id: the manual request's id, else the starting event's (evt_X -> msg_X).
      const id = data.inputID || "msg_" + String((envelope && envelope.id) || "").replace(/^evt_/, "");
      this.compacting = id;
      this.compactText = "";
      this.dirty.add(id);
      this.scheduleFlush();
    } else if (type === "session.compaction.ended" || type === "session.compaction.failed") {
      if (this.compacting) this.dirty.add(this.compacting);
      for (const message of this.messages.values()) {
        if (message.type === "compaction" && message.status === "running") this.dirty.add(message.id);
      }
      this.compacting = null;
      this.compactText = "";
      this.scheduleFlush();
    }
    if (type === "session.renamed") $("session-title").textContent = data.title || "";
    if (type === "session.agent.selected" || type === "session.model.selected") this.loadInfo();
    if (type.startsWith("session.revert.")) this.reloadTranscript();
  }

  // -- the session's settings, revert and the work of each prompt -------------------------------

  async loadInfo() {
    try {
      const { data } = await api("GET", "/api/session/" + this.id);
      if (current === this) this.showInfo(data);
    } catch (err) {
      if (!this.control.signal.aborted) showError(err);
    }
  }

  showInfo(session) {
    this.session = session;
    $("session-title").textContent = session.title || "";
    const model = session.model ? `${session.model.providerID}/${session.model.id}` : "";
    this.renderAgents();
    $("model").value = model;
    // The models offered: the configured ones (GET /api/model), and whatever this session uses.
    const options = $("models");
    if (model && ![...options.options].some((o) => o.value === model)) {
      const option = el("option");
      option.value = model;
      options.append(option);
    }
    const parent = $("session-parent");
    parent.hidden = !session.parentID;
    if (session.parentID) {
      const name = sessions.get(session.parentID);
      parent.textContent = "↑ " + ((name && name.title) || session.parentID);
      parent.dataset.id = session.parentID;
    }
    this.renderRevert();
  }

  // The agents the session may select (its directory's catalog).
  async loadAgents() {
    try {
      const { data } = await api("GET", `/api/session/${this.id}/agent`);
      if (current !== this) return;
      this.agents = data;
      this.renderAgents();
    } catch (err) {
      if (!this.control.signal.aborted) showError(err);
    }
  }

  renderAgents() {
    const value = (this.session && this.session.agent) || "";
    const select = $("agent");
    select.textContent = "";
    select.append(...agentOptions(this.agents, value));
    select.value = value;
  }

  // A staged revert hides its message and what follows (the server's listing
  // leaves them out): the transcript is read again, and the banner shows it.
  async reloadTranscript() {
    await this.loadInfo();
    if (current !== this) return;
    for (const node of this.nodes.values()) node.remove();
    this.nodes.clear();
    this.messages.clear();
    const page = await api("GET", `/api/session/${this.id}/message?limit=${FIRST_PAGE}&order=desc`);
    if (current !== this) return;
    this.older = page.cursor.next || null;
    for (const message of page.data.slice().reverse()) this.put(message);
    $("older").hidden = !this.older;
  }

  renderRevert() {
    const revert = this.session && this.session.revert;
    const box = $("revert-box");
    box.hidden = !revert;
    if (!revert) return;
    $("revert-text").textContent = revertText(revert);
  }

  async revert(messageID, files) {
    try {
      await api("POST", `/api/session/${this.id}/revert/stage`, { messageID, files });
    } catch (err) {
      showError(err);
    }
  }

  async fork(messageID) {
    try {
      const { data } = await api("POST", `/api/session/${this.id}/fork`, { before: messageID });
      sessions.set(data.id, data);
      await openSession(data.id);
      loadSessions().catch(showError);
    } catch (err) {
      showError(err);
    }
  }

  // The prompt after this one in the transcript, if any: the end of its changes.
  nextPrompt(message) {
    let next = null;
    for (const other of this.messages.values()) {
      if (other.type === "user" && other.seq > message.seq && (!next || other.seq < next.seq)) next = other;
    }
    return next;
  }

  toggleChanges(message, node) {
    const open = node.querySelector(".changes");
    if (open) {
      open.remove();
      this.openChanges.delete(message.id);
      return;
    }
    this.openChanges.add(message.id);
    this.showChanges(message, node);
  }

  // Read afresh each time it is drawn: a later prompt moves the end of its range.
  async showChanges(message, node) {
    const box = el("div", "changes", "reading…");
    node.append(box);
    const query = new URLSearchParams({ from: message.id });
    const next = this.nextPrompt(message);
    if (next) query.set("to", next.id);
    try {
      const { data } = await api("GET", `/api/session/${this.id}/diff?${query}`);
      box.textContent = "";
      if (!data.length) box.append(el("div", "muted", "No file changes."));
      for (const diff of data) box.append(renderDiff(diff));
    } catch (err) {
      box.textContent = "";
      box.append(el("div", "error-text", String(err.message || err)));
    }
  }

  promptActions(message, node) {
    node.append(
      promptBar({
        changes: () => this.toggleChanges(message, node),
        fork: () => this.fork(message.id),
        revert: () => this.revert(message.id, false),
        revertFiles: () => this.revert(message.id, true),
      }),
    );
    // Drawn again (its message read anew, a reconnected feed): still open.
    if (this.openChanges.has(message.id)) this.showChanges(message, node);
  }

  scheduleFlush() {
    if (this.flushTimer === null) this.flushTimer = setTimeout(() => this.flush(), 30);
  }

  async flush() {
    this.flushTimer = null;
    const ids = [...this.dirty];
    this.dirty.clear();
    await Promise.all(
      ids.map(async (id) => {
        try {
          const { data } = await api("GET", `/api/session/${this.id}/message/${id}`);
          if (current === this) this.put(data);
        } catch (err) {
          if (!(err instanceof ApiError && err.status === 404)) showError(err);
        }
      }),
    );
  }

  put(message) {
    const atBottom = this.isAtBottom();
    this.messages.set(message.id, message);
    const node = this.render(message);
    const old = this.nodes.get(message.id);
    if (old) old.replaceWith(node);
    else this.insert(node, message.seq);
    this.nodes.set(message.id, node);
    if (message.type === "assistant") this.renderAsks();
    if (message.type === "user" && !old) this.rangeMoved(message);
    if (atBottom) this.scrollDown();
  }

  // A prompt new to the page ends the changes of the one before it: shown
  // already (read while this one was on its way), they are read again.
  rangeMoved(prompt) {
    let before = null;
    for (const other of this.messages.values()) {
      if (other.type === "user" && other.seq < prompt.seq && (!before || other.seq > before.seq)) before = other;
    }
    const node = before && this.openChanges.has(before.id) && this.nodes.get(before.id);
    if (!node) return;
    const shown = node.querySelector(".changes");
    if (shown) shown.remove();
    this.showChanges(before, node);
  }

  insert(node, seq) {
    node.dataset.seq = String(seq);
    const box = $("transcript");
    for (const child of box.children) {
      if (Number(child.dataset.seq) > seq) {
        box.insertBefore(node, child);
        return;
      }
    }
    box.append(node);
  }

  render(message) {
    const node = el("div", "msg " + message.type);
    node.dataset.id = message.id;
    node.dataset.seq = String(message.seq);
    if (message.type === "compaction") return this.renderCompaction(message, node);
    if (message.type === "shell") return this.renderShell(message, node);
    if (message.type !== "assistant") {
      node.append(el("div", "body", message.text || message.description || ""));
      if (message.type === "user") this.promptActions(message, node);
      return node;
    }
    const live = this.liveText.get(message.id) || new Map();
    const shown = new Set();
    for (const part of message.parts || []) {
      if (part.type === "tool") {
        node.append(this.renderTool(part));
        continue;
      }
      shown.add(part.ordinal);
      const streaming = live.get(part.ordinal);
      let text = part.text;
      let cls = part.type === "reasoning" ? "reasoning" : "text";
      if (streaming && streaming.text.length > text.length) {
        text = streaming.text;
        cls += " streaming";
      } else if (streaming && part.text) live.delete(part.ordinal);
      const block = el("div", cls);
      // Markdown once the block is durable; while it streams, plain text.
      if (cls === "text") {
        block.classList.add("md");
        block.append(renderMarkdown(text));
      } else block.textContent = text;
      block.dataset.ordinal = String(part.ordinal);
      node.append(block);
    }
    for (const [ordinal, streaming] of live) {
      if (shown.has(ordinal)) continue;
      const block = el("div", (streaming.kind === "reasoning" ? "reasoning" : "text") + " streaming", streaming.text);
      block.dataset.ordinal = String(ordinal);
      node.append(block);
    }
    if (message.error) node.append(el("div", "error-text", oneLine(message.error.message || message.error)));
    // Copied by a fork (seq <= 0): its snapshots are in the parent's log, not this one's.
    if (message.seq > 0 && wroteFiles(message)) node.append(this.stepFiles(message));
    if (message.tokens || message.cost) {
      const t = message.tokens || {};
      const cache = t.cache || {};
      node.append(
        el(
          "div",
          "cost",
          `tokens in ${t.input || 0} · out ${t.output || 0} · reasoning ${t.reasoning || 0}` +
            ` · cache ${cache.read || 0}/${cache.write || 0} · $${(message.cost || 0).toFixed(4)}`,
        ),
      );
    }
    return node;
  }

  // The files a step changed: read once the step has ended (a running step's
  // files are not known yet), then kept; shown collapsed.
  stepFiles(message) {
    const holder = el("div", "step-files");
    holder.dataset.message = message.id;
    const diffs = this.stepDiffs.get(message.id);
    if (diffs) holder.append(this.stepBox(message.id, diffs));
    else if (message.finish || message.error) {
      holder.append(el("span", "muted", "reading the files this step changed…"));
      this.loadStepFiles(message.id);
    }
    return holder;
  }

  stepBox(id, diffs) {
    const box = stepChanges(diffs, this.openSteps.has(id));
    box.addEventListener("toggle", () => {
      if (box.open) this.openSteps.add(id);
      else this.openSteps.delete(id);
    });
    return box;
  }

  async loadStepFiles(id) {
    if (this.stepReads.has(id)) return;
    this.stepReads.add(id);
    let shown;
    try {
      const { data } = await api("GET", `/api/session/${this.id}/diff?messageID=${encodeURIComponent(id)}`);
      if (this.stepDiffs.size >= MAX_STEP_DIFFS) this.stepDiffs.delete(this.stepDiffs.keys().next().value);
      this.stepDiffs.set(id, data);
      shown = this.stepBox(id, data);
    } catch (err) {
      shown = el("span", "error-text", String(err.message || err));
    } finally {
      this.stepReads.delete(id);
    }
    const node = current === this && this.nodes.get(id);
    const holder = node && node.querySelector(".step-files");
    if (holder) holder.replaceChildren(shown);
  }

  renderCompaction(message, node) {
    node.dataset.status = message.status;
    node.append(el("div", "compaction-head", `⇢ compaction (${message.reason}) [${message.status}]`));
    let text = message.text || "";
    if (message.status === "running" && this.compacting === message.id) text = this.compactText;
    const summary = el("details", "summary");
    summary.append(el("summary", "", message.status === "running" ? "Summary so far" : "Summary"));
    summary.append(el("pre", "", text || "(none yet)"));
    node.append(summary);
    if (message.error) node.append(el("div", "error-text", oneLine(message.error.message || message.error)));
    return node;
  }

  renderShell(message, node) {
    const shell = message.shell || {};
    const exit = shell.exit === null || shell.exit === undefined ? "" : ` exit ${shell.exit}`;
    node.dataset.state = shell.state || "";
    node.append(el("div", "shell-head", `$ ${shell.command || ""}  [${shell.state}${exit}]`));
    const output = message.output || "";
    if (output) {
      const pre = el("pre", "", output.length > MAX_OUTPUT ? output.slice(0, MAX_OUTPUT) : output);
      node.append(pre);
      if (output.length > MAX_OUTPUT) {
        node.append(el("div", "muted", `… ${output.length - MAX_OUTPUT} more characters not shown`));
      }
    }
    return node;
  }

  // A piece of the running compaction's summary, from the instance feed.
  liveCompaction(text) {
    if (this.compactText.length < MAX_LIVE) this.compactText += text;
    const node = this.compacting && this.nodes.get(this.compacting);
    const pre = node && node.querySelector("details.summary pre");
    if (pre) pre.textContent = this.compactText;
  }

  renderTool(part) {
    const box = el("details", "tool " + part.status);
    box.dataset.call = part.id;
    box.append(el("summary", "", `⚙ ${part.name} ${oneLine(part.input || {})} [${part.status}]`));
    let output = "";
    for (const item of part.content || []) output += item.text !== undefined ? item.text : JSON.stringify(item);
    if (part.error) output += (output ? "\n" : "") + (part.error.message || JSON.stringify(part.error));
    const pre = el("pre");
    if (output.length > MAX_OUTPUT) {
      pre.textContent = output.slice(0, MAX_OUTPUT);
      box.append(pre, el("div", "muted", `… ${output.length - MAX_OUTPUT} more characters not shown`));
    } else {
      pre.textContent = output || "(no output)";
      box.append(pre);
    }
    return box;
  }

  // A live delta (text or reasoning) from the instance feed.
  live(data, kind) {
    const id = data.assistantMessageID;
    let blocks = this.liveText.get(id);
    if (!blocks) this.liveText.set(id, (blocks = new Map()));
    const block = blocks.get(data.ordinal) || { kind, text: "" };
    if (block.text.length < MAX_LIVE) block.text += data.delta;
    blocks.set(data.ordinal, block);
    const atBottom = this.isAtBottom();
    let node = this.nodes.get(id);
    if (!node) {
      // The step's durable start has not been read yet: a placeholder until it is.
      node = el("div", "msg assistant");
      node.dataset.id = id;
      this.insert(node, this.lastSeq + 0.5);
      this.nodes.set(id, node);
      this.dirty.add(id);
      this.scheduleFlush();
    }
    let target = node.querySelector(`[data-ordinal="${data.ordinal}"]`);
    if (!target) {
      target = el("div", (kind === "reasoning" ? "reasoning" : "text") + " streaming");
      target.dataset.ordinal = String(data.ordinal);
      node.append(target);
    }
    if (block.text.length > target.textContent.length) {
      target.textContent = block.text;
      target.classList.add("streaming");
    }
    if (atBottom) this.scrollDown();
  }

  renderStatus() {
    const state = statusOf(this.id);
    const badge = $("session-status");
    badge.textContent = state;
    badge.className = "status " + state;
    $("interrupt").disabled = state === "idle";
    renderRetry();
  }

  async loadAsks() {
    const generation = ++this.asksRead;
    let data;
    try {
      ({ data } = await api("GET", `/api/session/${this.id}/permission`));
    } catch (err) {
      if (!this.control.signal.aborted) showError(err);
      return;
    }
    if (current !== this || generation !== this.asksRead) return;
    this.asks = new Map(data.map((ask) => [ask.id, ask]));
    this.renderAsks();
  }

  // Each pending ask goes after the tool call it holds, or (call not on
  // screen yet) in the session's list above the prompt.
  renderAsks() {
    const box = $("transcript");
    for (const node of box.querySelectorAll(".ask")) node.remove();
    const list = $("asks");
    list.textContent = "";
    for (const ask of this.asks.values()) {
      const node = this.renderAsk(ask);
      const call = [...box.querySelectorAll("details.tool")].find((d) => d.dataset.call === ask.callID);
      if (call) call.after(node);
      else list.append(node);
    }
    $("asks-box").hidden = list.children.length === 0;
  }

  renderAsk(ask) {
    const node = el("div", "ask");
    node.dataset.id = ask.id;
    node.dataset.call = ask.callID;
    const what = ask.patterns && ask.patterns.length ? " · " + ask.patterns.join(", ") : "";
    node.append(el("span", "ask-text", `Allow ${ask.permission}: ${oneLine(ask.summary, 240)}${what}?`));
    for (const reply of ["once", "always", "reject"]) {
      const button = el("button", "reply " + reply, reply);
      button.type = "button";
      if (reply === "always" && ask.always && ask.always.length) button.title = "always: " + ask.always.join(", ");
      button.addEventListener("click", async () => {
        for (const b of node.querySelectorAll("button")) b.disabled = true;
        try {
          await api("POST", `/api/session/${this.id}/permission/${ask.id}`, { reply });
        } catch (err) {
          // 409: answered meanwhile (another tab); the asks are read again either way.
          if (!(err instanceof ApiError && err.status === 409)) showError(err);
        }
        this.loadAsks();
      });
      node.append(button);
    }
    return node;
  }

  async loadInbox() {
    // Reads overlap (a post, then its events): only the latest one started is shown.
    const generation = ++this.inboxRead;
    let data;
    try {
      ({ data } = await api("GET", `/api/session/${this.id}/inbox`));
    } catch (err) {
      if (!this.control.signal.aborted) showError(err);
      return;
    }
    if (current !== this || generation !== this.inboxRead) return;
    const list = $("inbox");
    list.textContent = "";
    for (const item of data) {
      const row = el("li");
      row.dataset.id = item.id;
      row.dataset.delivery = item.delivery;
      const other = item.delivery === "queue" ? "steer" : "queue";
      const change = el("button", "change", "→ " + other);
      change.type = "button";
      change.addEventListener("click", () =>
        api("PATCH", `/api/session/${this.id}/inbox/${item.id}`, { delivery: other }).catch(showError),
      );
      const cancel = el("button", "cancel", "cancel");
      cancel.type = "button";
      cancel.addEventListener("click", () =>
        api("DELETE", `/api/session/${this.id}/inbox/${item.id}`).catch(showError),
      );
      row.append(
        el("span", "delivery status", item.delivery),
        el("span", "text", oneLine(item.payload.text || item.type)),
        change,
        cancel,
      );
      list.append(row);
    }
    $("inbox-box").hidden = data.length === 0;
  }

  // -- the log view ------------------------------------------------------------------------------

  // The log view: read from the last row shown until it reaches what the
  // transcript applied, then (following) take each event as it is applied.
  async startLog() {
    const run = ++this.logRun;
    this.logLive = false;
    const follow = $("follow").checked;
    $("log-state").textContent = "reading…";
    try {
      do {
        await stream(`/api/experimental/session/${this.id}/log?after=${this.logSeq}`, {
          signal: this.control.signal,
          onEvent: (frame) => {
            if (run !== this.logRun || frame.event === "log.synced") return;
            const seq = Number(frame.id);
            if (!(seq > this.logSeq)) return;
            this.logSeq = seq;
            this.logRow(seq, frame.event, frame.data);
          },
        });
        if (run !== this.logRun) return;
      } while (follow && this.logSeq < this.lastSeq);
    } catch (err) {
      if (!this.control.signal.aborted) showError(err);
      return;
    }
    this.logLive = follow;
    $("log-state").textContent = follow ? "following" : "up to date (not following)";
  }

  logRow(seq, type, envelope) {
    const body = $("log").tBodies[0];
    const row = el("tr");
    row.dataset.seq = String(seq);
    row.append(el("td", "seq", String(seq)), el("td", "type", type), el("td", "data", oneLine(envelope.data, 400)));
    body.append(row);
    if (++this.logRows > MAX_LOG_ROWS) {
      body.firstElementChild.remove();
      this.logRows--;
    }
  }

  isAtBottom() {
    const box = $("transcript");
    return box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  }

  scrollDown() {
    const box = $("transcript");
    box.scrollTop = box.scrollHeight;
  }
}

async function openSession(id) {
  if (current) current.stop();
  unread.delete(id);
  history.replaceState(null, "", "#" + id);
  $("empty").hidden = true;
  $("session").hidden = false;
  current = new SessionView(id);
  renderSessions();
  try {
    await current.start();
    // When the transcript first stood on screen (ms since navigation), for benchmarks.
    document.body.dataset.readyMs = String(Math.round(performance.now()));
    document.body.dataset.ready = id;
  } catch (err) {
    showError(err);
  }
}

function renderRetry() {
  const box = $("retry");
  const at = current && statusOf(current.id) === "retrying" ? retryAt.get(current.id) : undefined;
  if (at === undefined) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  box.textContent = `retry in ${Math.max(0, Math.ceil((at - Date.now()) / 1000))} s`;
}

function showError(err) {
  console.error(err);
  const box = $("transcript");
  if (box) box.append(el("div", "msg error-text", String(err.message || err)));
}

// -- wiring --------------------------------------------------------------------------------------

function setTab(log) {
  $("transcript-view").hidden = log;
  $("log-view").hidden = !log;
  $("tab-log").classList.toggle("active", log);
  $("tab-transcript").classList.toggle("active", !log);
  if (log && current && current.ready && current.logRun === 0) current.startLog();
}

function main() {
  $("create-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const title = $("new-title").value.trim();
    try {
      const { data } = await api("POST", "/api/session", title ? { title } : {});
      $("new-title").value = "";
      sessions.set(data.id, data);
      await openSession(data.id);
      loadSessions().catch(showError);
    } catch (err) {
      showError(err);
    }
  });
  let searchTimer = null;
  $("search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => loadSessions().catch(showError), 200);
  });
  // Prompts are posted one after another, in the order they were sent: two
  // quick sends must not reach the server the other way round.
  let posting = Promise.resolve();
  $("prompt-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value;
    if (!current || !text.trim()) return;
    const view = current;
    const delivery = $("delivery").value;
    $("prompt").value = "";
    posting = posting.then(async () => {
      try {
        await api("POST", `/api/session/${view.id}/prompt`, { text, delivery });
        if (current === view) view.loadInbox();
      } catch (err) {
        if (!$("prompt").value) $("prompt").value = text; // not taken: the text comes back
        showError(err);
      }
    });
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("prompt-form").requestSubmit();
  });
  $("interrupt").addEventListener("click", () => {
    if (current) api("POST", `/api/session/${current.id}/interrupt`).catch(showError);
  });
  $("compact").addEventListener("click", () => {
    if (current) api("POST", `/api/session/${current.id}/compact`, {}).then(() => current && current.loadInbox(), showError);
  });
  $("older").addEventListener("click", () => current && current.loadOlder().catch(showError));
  $("agent-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const agent = $("agent").value;
    if (current && agent) api("POST", `/api/session/${current.id}/agent`, { agent }).catch(showError);
  });
  $("model-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const [providerID, ...rest] = $("model").value.trim().split("/");
    const id = rest.join("/");
    if (!current) return;
    if (!providerID || !id) {
      showError(new Error("a model is PROVIDER/MODEL, e.g. scripted/scripted"));
      return;
    }
    api("POST", `/api/session/${current.id}/model`, { model: { providerID, id } }).catch(showError);
  });
  $("shell-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const command = $("shell-command").value;
    if (!current || !command.trim()) return;
    $("shell-command").value = "";
    api("POST", `/api/session/${current.id}/shell`, { command }).catch((err) => {
      if (!$("shell-command").value) $("shell-command").value = command;
      showError(err);
    });
  });
  $("revert-clear").addEventListener("click", () => {
    if (current) api("DELETE", `/api/session/${current.id}/revert`).catch(showError);
  });
  $("revert-commit").addEventListener("click", () => {
    if (current) api("POST", `/api/session/${current.id}/revert/commit`).catch(showError);
  });
  $("session-parent").addEventListener("click", () => {
    const parent = $("session-parent").dataset.id;
    if (parent) openSession(parent);
  });
  $("tab-log").addEventListener("click", () => setTab(true));
  $("tab-transcript").addEventListener("click", () => setTab(false));
  $("follow").addEventListener("change", () => current && current.ready && !$("log-view").hidden && current.startLog());
  setInterval(renderRetry, 1000);
  // The session named in the URL and the list load first; the feed (a worker
  // and a stream) starts once the transcript is on screen, or after a second.
  loadSessions().catch(showError);
  loadModels();
  const wanted = location.hash.slice(1);
  if (/^ses_\w+$/.test(wanted)) Promise.race([openSession(wanted), sleep(1000)]).then(startFeed);
  else startFeed();
}

// The models the configured providers name: offered in the model box (any id may still be typed).
async function loadModels() {
  try {
    const { data } = await api("GET", "/api/model");
    const options = $("models");
    const known = new Set([...options.options].map((o) => o.value));
    for (const model of data) {
      const value = `${model.providerID}/${model.id}`;
      if (known.has(value)) continue;
      const option = el("option");
      option.value = value;
      options.append(option);
    }
  } catch (err) {
    showError(err);
  }
}

function startFeed() {
  const onState = (up) => $("feed-state").classList.toggle("live", up);
  if (typeof SharedWorker === "function") {
    const worker = new SharedWorker("/console/console-feed.js", { name: "sessionrt-feed", type: "module" });
    feedPort = worker.port;
    feedPort.onmessage = (message) => {
      const data = message.data || {};
      if (data.frame) onFeed(data.frame);
      if ("state" in data) onState(data.state);
      if (data.joined) feedConnected(); // the worker's feed was up already
      // The worker's 401 may come after this tab signed in (its call went out
      // first): ask only if the password it tried is this tab's; else it gets ours.
      if (data.auth && data.tried === password) askPassword();
      else if (data.auth) feedPort.postMessage({ password });
    };
    feedPort.start();
    feedPort.postMessage({ password });
    addEventListener("pagehide", () => feedPort.postMessage({ bye: true }));
  } else {
    keep(() => "/api/event", onFeed, { onState }); // one stream per tab
  }
}

main();
