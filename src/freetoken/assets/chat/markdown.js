// A small markdown renderer that builds DOM nodes: model text only ever becomes text nodes, never HTML.

export const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

const SAFE_URL = /^(https?:|mailto:)/i;
// One alternative per inline form; the groups: 1-2 code, 3-4 bold, 5 strikethrough, 6-7 italic, 8-9 link.
const INLINE = new RegExp([
  /(`+)([^`][\s\S]*?)\1(?!`)/,
  /\*\*(?=\S)([\s\S]+?)\*\*/, /__(?=\S)([\s\S]+?)__/,
  /~~(?=\S)([\s\S]+?)~~/,
  /\*(?=[^\s*])([\s\S]+?)\*/, /(?<![\w])_(?=[^\s_])([\s\S]+?)_(?![\w])/,
  /\[([^\]\n]+)\]\(([^()\s]+)\)/,
].map((r) => r.source).join("|"), "g");

function inline(text, parent) {
  let last = 0;
  INLINE.lastIndex = 0;
  const matches = [...text.matchAll(INLINE)];
  for (const m of matches) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[2] !== undefined) parent.append(el("code", "", m[2]));
    else if (m[3] !== undefined) inline(m[3], parent.appendChild(el("strong")));
    else if (m[4] !== undefined) inline(m[4], parent.appendChild(el("strong")));
    else if (m[5] !== undefined) inline(m[5], parent.appendChild(el("del")));
    else if (m[6] !== undefined) inline(m[6], parent.appendChild(el("em")));
    else if (m[7] !== undefined) inline(m[7], parent.appendChild(el("em")));
    else if (m[8] !== undefined) {
      if (SAFE_URL.test(m[9])) {
        const a = el("a");
        a.href = m[9];
        a.target = "_blank";
        a.rel = "noopener noreferrer";
        inline(m[8], a);
        parent.append(a);
      } else {
        parent.append(m[0]);  // an unsafe scheme (javascript:, data:) stays visible as plain text
      }
    }
  }
  if (last < text.length) parent.append(text.slice(last));
}

function copyText(text, button) {
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1200); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text, done));
  } else fallbackCopy(text, done);
}
function fallbackCopy(text, done) {
  const t = el("textarea");
  t.value = text;
  document.body.append(t);
  t.select();
  try { document.execCommand("copy"); done(); } finally { t.remove(); }
}

function codeBlock(lang, code) {
  const box = el("div", "codeblock");
  const head = box.appendChild(el("div", "head"));
  head.append(el("span", "", lang || "text"));
  const button = head.appendChild(el("button", "copy", "Copy"));
  button.type = "button";
  button.addEventListener("click", () => copyText(code, button));
  const pre = box.appendChild(el("pre"));
  const c = pre.appendChild(el("code", "", code));
  if (lang) c.dataset.lang = lang;
  return box;
}

const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
export function renderMarkdown(src) {
  const root = document.createDocumentFragment();
  const lines = src.replace(/\r\n?/g, "\n").split("\n");
  let para = [];
  const flush = () => {
    if (!para.length) return;
    const p = el("p");
    para.forEach((line, i) => { if (i) p.append(el("br")); inline(line, p); });
    root.append(p);
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      root.append(codeBlock(fence[2], body.join("\n")));  // an unclosed fence (still streaming) runs to the end
      continue;
    }
    const h = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/);
    if (h) { flush(); inline(h[2], root.appendChild(el("h" + h[1].length))); continue; }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); root.append(el("hr")); continue; }
    if (/^\s*>/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
      i--;
      const q = el("blockquote");
      q.append(renderMarkdown(quoted.join("\n")));
      root.append(q);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])) {
      flush();
      i = table(lines, i, root) - 1;
      continue;
    }
    if (LIST_ITEM.test(line)) {
      flush();
      i = list(lines, i, root) - 1;
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    para.push(line);
  }
  flush();
  return root;
}

const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const cells = (line) => line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
function table(lines, i, parent) {
  const align = cells(lines[i + 1]).map((c) => (c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : ""));
  const wrap = parent.appendChild(el("div", "table"));
  const t = wrap.appendChild(el("table"));
  const row = (line, tag, into) => {
    const tr = into.appendChild(el("tr"));
    cells(line).forEach((c, k) => {
      const cell = tr.appendChild(el(tag));
      if (align[k]) cell.className = align[k];
      inline(c, cell);
    });
  };
  row(lines[i], "th", t.appendChild(el("thead")));
  const body = t.appendChild(el("tbody"));
  for (i += 2; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) row(lines[i], "td", body);
  return i;
}

function list(lines, i, parent) {
  const first = lines[i].match(LIST_ITEM);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const l = parent.appendChild(el(ordered ? "ol" : "ul"));
  if (ordered && parseInt(first[2], 10) !== 1) l.start = parseInt(first[2], 10);
  let item = null;
  while (i < lines.length) {
    const m = lines[i].match(LIST_ITEM);
    if (m && m[1].length > indent && item) { i = list(lines, i, item); continue; }
    if (!m || m[1].length < indent || /\d/.test(m[2]) !== ordered) {
      if (m || !item || !lines[i].trim() || !/^\s/.test(lines[i])) break;
      item.append(" ");
      inline(lines[i].trim(), item);  // a continuation line of the item
      i++;
      continue;
    }
    item = l.appendChild(el("li"));
    inline(m[3], item);
    i++;
  }
  return i;
}
