// Markdown for the console: a model's answer as DOM nodes, never as HTML text.
//
// Safety is by construction, not by sanitising: nothing here parses HTML or
// assigns innerHTML. Every piece of the source ends up as a text node, inside
// elements this module makes itself, so `<script>` or `<img onerror=…>` in an
// answer is shown as the characters it is. Links keep only http:, https: and
// mailto: targets (anything else, javascript: included, stays plain text) and
// open in a new tab without a referrer or an opener. Images are never loaded:
// `![alt](src)` becomes a link to its address, so an answer cannot make the
// browser fetch from elsewhere (the page's CSP, img-src 'self' data:, would
// refuse a remote image anyway).
//
// What it reads: ATX headings, paragraphs, fenced code blocks (``` or ~~~,
// with a language name), indented code, block quotes, bullet and numbered
// lists (nested by indentation), tables with a header separator, horizontal
// rules; inline code, **strong**, *emphasis*, ~~strike~~, links, autolinks
// (<https:…>) and hard breaks (two trailing spaces or a backslash).

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;
const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
const MAX_DEPTH = 8; // nested quotes and lists beyond this are shown as text
// Inline markup is matched by scanning ahead for its closer, quadratic at
// worst: a paragraph longer than this, or an answer longer than MAX_SOURCE,
// is shown as plain text so that no answer can stall the page.
const MAX_INLINE = 5000;
const MAX_SOURCE = 200000;

function make(doc, tag, text) {
  const node = doc.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

// The link's address if it is one a page may follow, else null.
export function safeHref(raw) {
  const text = String(raw || "").trim();
  if (!text) return null;
  let url;
  try {
    // No base: a relative address (into this server's API) is not a model's to link.
    url = new URL(text);
  } catch {
    return null;
  }
  return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
}

function link(doc, href, children) {
  const a = doc.createElement("a");
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  a.referrerPolicy = "no-referrer";
  a.append(...children);
  return a;
}

// -- inline ---------------------------------------------------------------------------------------

const INLINE = [
  // [regex, handler(match, doc) -> Node[]]
  [/^`+/, null], // code spans: handled by inlineCode
  [/^!\[([^\]]*)\]\(\s*([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+"[^"]*")?\s*\)/, (m, doc) => {
    const href = safeHref(m[2]);
    const label = "image: " + (m[1] || m[2]);
    return [href ? link(doc, href, [doc.createTextNode(label)]) : doc.createTextNode(m[0])];
  }],
  [/^\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+"[^"]*")?\s*\)/, (m, doc, depth) => {
    const href = safeHref(m[2]);
    const inner = inline(doc, m[1], depth + 1);
    return href ? [link(doc, href, inner)] : [doc.createTextNode("["), ...inner, doc.createTextNode("](" + m[2] + ")")];
  }],
  [/^<((?:https?|mailto):[^\s<>]+)>/, (m, doc) => {
    const href = safeHref(m[1]);
    return [href ? link(doc, href, [doc.createTextNode(m[1])]) : doc.createTextNode(m[0])];
  }],
  [/^(\*\*|__)(?=\S)([\s\S]*?\S)\1/, (m, doc, depth) => [wrap(doc, "strong", m[2], depth)]],
  [/^~~(?=\S)([\s\S]*?\S)~~/, (m, doc, depth) => [wrap(doc, "del", m[1], depth)]],
  [/^\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/, (m, doc, depth) => [wrap(doc, "em", m[1], depth)]],
  [/^_(?=[^\s_])([\s\S]*?[^\s_])_(?![\w])/, (m, doc, depth) => [wrap(doc, "em", m[1], depth)]],
  [/^(?: {2,}|\\)\n/, (m, doc) => [doc.createElement("br")]],
  [/^\\([!-/:-@[-`{-~])/, (m, doc) => [doc.createTextNode(m[1])]],
];

function wrap(doc, tag, text, depth) {
  const node = doc.createElement(tag);
  node.append(...inline(doc, text, depth + 1));
  return node;
}

function inline(doc, text, depth = 0) {
  if (depth > MAX_DEPTH || text.length > MAX_INLINE) return [doc.createTextNode(text)];
  const out = [];
  let plain = "";
  let i = 0;
  const flush = () => {
    if (plain) out.push(doc.createTextNode(plain));
    plain = "";
  };
  while (i < text.length) {
    const rest = text.slice(i);
    const ch = rest[0];
    if (ch === "`") {
      const ticks = /^`+/.exec(rest)[0];
      const end = rest.indexOf(ticks, ticks.length);
      if (end > 0) {
        flush();
        out.push(make(doc, "code", rest.slice(ticks.length, end).replace(/^ (.*) $/s, "$1")));
        i += end + ticks.length;
        continue;
      }
      plain += ticks;
      i += ticks.length;
      continue;
    }
    if ("![<*_~\\ ".includes(ch)) {
      let matched = false;
      for (const [pattern, handle] of INLINE) {
        if (!handle) continue;
        const m = pattern.exec(rest);
        if (m) {
          flush();
          out.push(...handle(m, doc, depth));
          i += m[0].length;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    plain += ch;
    i += 1;
  }
  flush();
  return out;
}

// -- blocks ---------------------------------------------------------------------------------------

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function cells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  return text.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function blocks(doc, lines, parent, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    let m;
    if ((m = FENCE.exec(line))) {
      const close = new RegExp("^ {0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
      const body = [];
      i += 1;
      while (i < lines.length && !close.test(lines[i])) body.push(lines[i++]);
      i += 1; // the closing fence (or the end)
      const pre = make(doc, "pre");
      const code = make(doc, "code", body.join("\n"));
      if (m[2]) code.dataset.lang = m[2];
      pre.append(code);
      parent.append(pre);
      continue;
    }
    if (/^( {4}|\t)/.test(line)) {
      const body = [];
      while (i < lines.length && (/^( {4}|\t)/.test(lines[i]) || !lines[i].trim())) {
        body.push(lines[i++].replace(/^( {4}|\t)/, ""));
      }
      while (body.length && !body[body.length - 1].trim()) body.pop();
      const pre = make(doc, "pre");
      pre.append(make(doc, "code", body.join("\n")));
      parent.append(pre);
      continue;
    }
    if ((m = HEADING.exec(line))) {
      const node = make(doc, "h" + m[1].length);
      node.append(...inline(doc, m[2], depth));
      parent.append(node);
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      parent.append(make(doc, "hr"));
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && lines[i].trim() && (QUOTE.test(lines[i]) || body.length)) {
        body.push(lines[i++].replace(QUOTE, ""));
      }
      const node = make(doc, "blockquote");
      if (depth < MAX_DEPTH) blocks(doc, body, node, depth + 1);
      else node.textContent = body.join("\n");
      parent.append(node);
      continue;
    }
    if ((m = ITEM.exec(line))) {
      i = list(doc, lines, i, parent, depth);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      const table = make(doc, "table");
      const head = make(doc, "tr");
      for (const cell of cells(line)) {
        const th = make(doc, "th");
        th.append(...inline(doc, cell, depth));
        head.append(th);
      }
      const thead = make(doc, "thead");
      thead.append(head);
      const tbody = make(doc, "tbody");
      i += 2;
      while (i < lines.length && lines[i].trim() && lines[i].includes("|")) {
        const row = make(doc, "tr");
        for (const cell of cells(lines[i++])) {
          const td = make(doc, "td");
          td.append(...inline(doc, cell, depth));
          row.append(td);
        }
        tbody.append(row);
      }
      table.append(thead, tbody);
      parent.append(table);
      continue;
    }
    const body = [line];
    i += 1;
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) body.push(lines[i++]);
    const p = make(doc, "p");
    p.append(...inline(doc, body.join("\n"), depth));
    parent.append(p);
  }
}

// One list from lines[start]; returns the index after it.
function list(doc, lines, start, parent, depth) {
  const first = ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const node = make(doc, ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  let i = start;
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3]];
    const inner = indent + m[2].length + 1;
    i += 1;
    while (i < lines.length) {
      const next = lines[i];
      const sub = ITEM.exec(next);
      if (!next.trim()) {
        if (i + 1 < lines.length && /^\s+\S/.test(lines[i + 1]) && (lines[i + 1].search(/\S/) > indent)) {
          body.push("");
          i += 1;
          continue;
        }
        break;
      }
      if (sub && sub[1].length <= indent) break;
      if (!sub && startsBlock(next) && next.search(/\S/) <= indent) break;
      body.push(next.slice(Math.min(inner, next.search(/\S/))));
      i += 1;
    }
    const li = make(doc, "li");
    if (depth < MAX_DEPTH) {
      const holder = doc.createDocumentFragment();
      blocks(doc, body, holder, depth + 1);
      // A tight item's single paragraph is shown without its margins.
      if (holder.childNodes.length === 1 && holder.firstChild.nodeName === "P") {
        li.append(...holder.firstChild.childNodes);
      } else li.append(holder);
    } else li.textContent = body.join("\n");
    node.append(li);
    while (i < lines.length && !lines[i].trim()) {
      const after = ITEM.exec(lines[i + 1] || "");
      if (after && after[1].length === indent) i += 1;
      else break;
    }
  }
  parent.append(node);
  return i;
}

// The answer as a fragment of elements this module made; text stays text.
export function renderMarkdown(source, doc = document) {
  const fragment = doc.createDocumentFragment();
  if (String(source || "").length > MAX_SOURCE) {
    fragment.append(make(doc, "div", String(source)));
    fragment.firstChild.className = "plain";
    return fragment;
  }
  blocks(doc, String(source || "").replace(/\r\n?/g, "\n").split("\n"), fragment, 0);
  return fragment;
}
