// The work of a session, as DOM: the sessions as a tree, a prompt's action
// bar, a file's diff, a step's changed files, a staged revert in words, the
// agent choices. Pure builders (text nodes only, no innerHTML); console.js
// owns the calls and the state.

const el = (tag, cls, text) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
};

// Sessions in list order, each child right after its parent (depth-first);
// a child whose parent is not listed stands at the top level.
export function sessionTree(sessions) {
  const children = new Map();
  const roots = [];
  for (const session of sessions.values()) {
    const parent = session.parentID;
    if (parent && sessions.has(parent) && parent !== session.id) {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(session);
    } else roots.push(session);
  }
  const out = [];
  const seen = new Set();
  const visit = (session, depth) => {
    if (seen.has(session.id)) return;
    seen.add(session.id);
    out.push([session, depth]);
    for (const child of children.get(session.id) || []) visit(child, depth + 1);
  };
  for (const session of roots) visit(session, 0);
  return out;
}

// A prompt's buttons; `on` holds what each does (changes, fork, revert, revertFiles).
export function promptBar(on) {
  const bar = el("div", "actions");
  for (const [cls, label, title, run] of [
    ["show-changes", "changes", "the files this prompt's steps changed, with their diff", on.changes],
    ["fork", "fork", "a new session with everything before this prompt", on.fork],
    ["revert", "revert", "hide this prompt and what follows (files untouched)", on.revert],
    ["revert-files", "revert + files", "hide this prompt and what follows, and restore its files", on.revertFiles],
  ]) {
    const button = el("button", cls, label);
    button.type = "button";
    button.title = title;
    button.addEventListener("click", run);
    bar.append(button);
  }
  return bar;
}

// A staged revert (session.revert), as the banner says it.
export function revertText(revert) {
  const files = revert.files && revert.files.length ? revert.files.join(", ") : null;
  return (
    `Reverted from ${revert.messageID}: that prompt and everything after it are hidden` +
    (files ? `; files restored: ${files}` : revert.snapshot ? "; files restored" : "; files untouched")
  );
}

// One file of a diff: its name, status and counts, and the patch with its
// added and removed lines marked (text nodes only).
export function renderDiff(diff) {
  const box = el("details", "file-diff " + diff.status);
  box.open = true;
  box.dataset.file = diff.file;
  const head = el("summary");
  head.append(
    el("span", "file", diff.file),
    el("span", "status", " " + diff.status + " "),
    el("span", "add", "+" + diff.additions),
    el("span", "", " "),
    el("span", "del", "-" + diff.deletions),
  );
  box.append(head);
  const pre = el("pre", "patch");
  if (diff.binary) pre.textContent = "(binary file)";
  for (const line of diff.binary ? [] : diff.patch.replace(/\n$/, "").split("\n")) {
    const meta = /^(diff |index |--- |\+\+\+ |new file|deleted file|similarity|rename )/.test(line);
    const cls = meta ? "meta" : line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "";
    pre.append(el("span", cls, line + "\n"));
  }
  box.append(pre);
  return box;
}

// The tools whose call may change files: a step that ran one has snapshots
// (in a git work tree), so GET …/diff?messageID= can say what it changed.
const WRITING = new Set(["write", "edit", "bash"]);

// Whether an assistant step ran a writing tool (a refused call did not run:
// its diff is empty, and says so).
export function wroteFiles(message) {
  return (message.parts || []).some(
    (part) => part.type === "tool" && WRITING.has(part.name) && (part.status === "completed" || part.status === "error"),
  );
}

// A step's changed files: collapsed, its summary naming them (the first few),
// each file's diff inside.
export function stepChanges(diffs, open) {
  const box = el("details", "step-changes");
  box.open = open;
  const names = diffs.map((diff) => diff.file);
  const shown = names.slice(0, 5).join(", ") + (names.length > 5 ? `, … (${names.length - 5} more)` : "");
  const count = `${names.length} file${names.length === 1 ? "" : "s"} changed: `;
  box.append(el("summary", "", names.length ? "± " + count + shown : "± no files changed"));
  for (const diff of diffs) box.append(renderDiff(diff));
  return box;
}

// The agents a session may select (GET …/agent), as <option>s of a select:
// the default first, then each primary agent (subagents run only through the
// task tool); `value` kept even when the list does not have it.
export function agentOptions(agents, value) {
  const options = [el("option", "", "default (build)")];
  options[0].value = "";
  const names = new Set();
  for (const agent of agents) {
    if (agent.mode === "subagent") continue;
    const option = el("option", "", agent.name);
    option.value = agent.name;
    if (agent.description) option.title = agent.description;
    options.push(option);
    names.add(agent.name);
  }
  if (value && !names.has(value)) {
    const option = el("option", "", value);
    option.value = value;
    options.push(option);
  }
  return options;
}
