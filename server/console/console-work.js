// The work of a session, as DOM: the sessions as a tree, a prompt's action
// bar, a file's diff, a staged revert in words. Pure builders (text nodes
// only, no innerHTML); console.js owns the calls and the state.

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
  for (const line of diff.binary ? [] : diff.patch.split("\n")) {
    const meta = /^(diff |index |--- |\+\+\+ |new file|deleted file|similarity|rename )/.test(line);
    const cls = meta ? "meta" : line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "";
    pre.append(el("span", cls, line + "\n"));
  }
  box.append(pre);
  return box;
}
