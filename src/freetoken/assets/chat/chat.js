// The chat page's conversation: streaming from this server's /v1/chat/completions into the DOM (index.html).
import {el, renderMarkdown} from "./markdown.js";

const $ = (id) => document.getElementById(id);

// ---- the conversation (kept here only: the server holds no chat state) ----
const messages = [];
const log = $("log");
const scroller = $("scroller");
let current = null;  // the request in flight: {controller, view}
let epoch = 0;  // a new chat: what a request of the old one still brings back is dropped

const DEMO_TOOLS = [
  {type: "function", function: {name: "get_weather", description: "Get the current weather for a city.",
    parameters: {type: "object", properties: {city: {type: "string", description: "The city name."}},
      required: ["city"]}}},
  {type: "function", function: {name: "read_file", description: "Read a text file from the user's machine.",
    parameters: {type: "object", properties: {path: {type: "string", description: "The file's path."}},
      required: ["path"]}}},
];
function demoResult(name, args) {
  // spaced like Python's json.dumps, the shape of the tool results the embedded model was trained on
  if (name !== "get_weather") return "";
  return `{"city": ${JSON.stringify(args.city)}, "temperature": 21, "unit": "celsius", "condition": "sunny"}`;
}

const settings = {
  load() {
    try {
      const s = JSON.parse(localStorage.getItem("ft-chat") || "{}");
      for (const [id, v] of Object.entries(s)) {
        const e = $(id);
        if (!e) continue;
        if (e.type === "checkbox") e.checked = !!v; else e.value = v;
      }
    } catch (e) { /* private mode or a damaged entry: defaults */ }
  },
  save() {
    const s = {};
    for (const id of ["temperature", "max-tokens", "thinking", "demo-tools", "system", "model"]) {
      const e = $(id);
      s[id] = e.type === "checkbox" ? e.checked : e.value;
    }
    try { localStorage.setItem("ft-chat", JSON.stringify(s)); } catch (e) { /* not kept */ }
  },
};

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function errorText(resp) {
  const text = await resp.text();
  try {
    const body = JSON.parse(text);
    const e = body.error || body;
    return (e.message || text) + (e.param ? " (" + e.param + ")" : "");
  } catch (e) { return text || resp.statusText; }
}

function scrollDown(force) {
  const near = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 120;
  if (force || near) scroller.scrollTop = scroller.scrollHeight;
}

function addBubble(cls, text) {
  $("empty")?.remove();
  const b = log.appendChild(el("div", "msg " + cls, text));
  scrollDown(true);
  return b;
}

function showError(title, detail) {
  const b = addBubble("error");
  b.append(el("b", "", title));
  b.append(detail);
  return b;
}

async function loadModels() {
  const pick = $("model");
  const wanted = pick.value || JSON.parse(localStorage.getItem("ft-chat") || "{}").model;
  try {
    const r = await fetch("/v1/models", {headers: headers()});
    if (!r.ok) throw new Error(r.status + ": " + await errorText(r));
    const data = (await r.json()).data || [];
    pick.replaceChildren(...data.map((m) => el("option", "", m.id)));
    if (data.some((m) => m.id === wanted)) pick.value = wanted;
  } catch (e) {
    showError("Could not list the models", String(e.message || e) + "\n(an API key goes in Settings)");
  }
}

// The end of a line, cut at its start when it is too long (an rtl box clips on the left; the text stays ltr).
function peek(line) {
  const box = el("span", "peek");
  box.dir = "rtl";
  const text = box.appendChild(el("bdi", "", line));
  text.dir = "ltr";
  return box;
}

// One assistant turn as it streams in: thinking fold, markdown body, tool-call cards.
class AssistantView {
  constructor() {
    this.root = addBubble("assistant streaming");
    this.root.dataset.state = "streaming";
    this.content = "";
    this.reasoning = "";
    this.calls = [];  // {id, name, arguments} by stream index
    this.started = performance.now();
    this.pending = false;
  }
  // <think>...</think> inside content (a server without a reasoning parser) is folded like reasoning_content.
  split() {
    let text = this.content, thinking = this.reasoning;
    const open = text.match(/^\s*<think>/);
    if (open) {
      const end = text.indexOf("</think>");
      thinking += end < 0 ? text.slice(open[0].length) : text.slice(open[0].length, end);
      text = end < 0 ? "" : text.slice(end + 8);
    }
    return [thinking.trim(), text.replace(/^\s+/, "")];
  }
  update() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.render(); });
  }
  render() {
    const [thinking, text] = this.split();
    const parts = [];
    if (thinking) {
      const d = this.fold || el("details", "think");
      this.fold = d;  // kept across renders, so an opened fold stays open
      if (!this.thought && (text || this.calls.length)) {
        this.thought = ((performance.now() - this.started) / 1000).toFixed(1) + " s";
      }
      const summary = el("summary");
      if (this.root.dataset.state === "streaming" && !text && !this.calls.length) {
        // still thinking: the fold's title shows its latest line
        summary.append("Thinking…", peek(thinking.split("\n").pop().slice(-200)));
      } else summary.append("Thought" + (this.thought ? " for " + this.thought : ""));
      d.replaceChildren(summary, el("div", "text", thinking));
      parts.push(d);
    }
    const body = el("div", "body");
    body.append(renderMarkdown(text));
    if (this.root.dataset.state === "streaming" && !this.calls.length && (text || !thinking)) {
      const tail = body.lastElementChild;
      (tail && !tail.classList.contains("codeblock") ? tail : body).classList.add("cursor");
    }
    parts.push(body);
    this.calls.forEach((c, i) => parts.push(this.card(c, i)));
    if (this.meta) parts.push(el("div", "meta", this.meta));
    this.root.replaceChildren(...parts);
    scrollDown(false);
  }
  card(call, i) {
    this.cards = this.cards || [];
    const card = this.cards[i] || el("div", "toolcall");
    this.cards[i] = card;
    let args = call.arguments, parsed = null;
    try {
      parsed = JSON.parse(args);
      args = JSON.stringify(parsed, null, 2);
    } catch (e) { /* partial JSON while streaming: shown as it is */ }
    const head = el("div");
    head.append(el("span", "name", call.name || "?"), el("span", "id", call.id || ""));
    const kids = [head, el("pre", "args", args)];
    const old = card.querySelector(".result, .sent");
    if (old) kids.push(old);
    card.replaceChildren(...kids);
    card.dataset.name = call.name || "";
    this.parsed = this.parsed || [];
    this.parsed[i] = parsed;
    return card;
  }
  finish(state, meta) {
    this.root.dataset.state = state;
    this.root.classList.remove("streaming");
    this.meta = meta;
    this.render();
  }
}

async function stream(view, body, signal) {
  const init = {method: "POST", headers: headers(), body: JSON.stringify(body), signal};
  const r = await fetch("/v1/chat/completions", init);
  if (!r.ok) throw new ServerError("The server refused the request (HTTP " + r.status + ")", await errorText(r));
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "", usage = null, finish = null;
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += decoder.decode(value, {stream: true}).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;  // a keep-alive comment
      if (data === "[DONE]") return {usage, finish};
      const chunk = JSON.parse(data);
      if (chunk.error) {
        throw new ServerError("The server stopped with an error", chunk.error.message || JSON.stringify(chunk.error));
      }
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices || [])[0];
      if (!choice) continue;
      const d = choice.delta || {};
      if (d.reasoning_content || d.reasoning) view.reasoning += d.reasoning_content || d.reasoning;
      if (d.content) view.content += d.content;
      for (const tc of d.tool_calls || []) {
        const c = view.calls[tc.index] || (view.calls[tc.index] = {id: "", name: "", arguments: ""});
        if (tc.id) c.id = tc.id;
        if (tc.function?.name) c.name += tc.function.name;
        if (tc.function?.arguments) c.arguments += tc.function.arguments;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      view.update();
    }
  }
  return {usage, finish};
}

class ServerError extends Error {
  constructor(title, detail) { super(detail); this.title = title; }
}

function setBusy(busy) {
  const b = $("send");
  b.textContent = busy ? "Stop" : "Send";
  b.className = busy ? "stop" : "primary";
  b.type = busy ? "button" : "submit";
}

// Sends the conversation as it stands and streams the next assistant turn into it.
async function run(userBubble, restore) {
  const system = $("system").value.trim();
  const body = {
    model: $("model").value,
    messages: (system ? [{role: "system", content: system}] : []).concat(messages),
    stream: true,
    stream_options: {include_usage: true},
    temperature: parseFloat($("temperature").value),
    max_tokens: parseInt($("max-tokens").value, 10),
    chat_template_kwargs: {enable_thinking: $("thinking").checked},
  };
  if ($("demo-tools").checked) body.tools = DEMO_TOOLS;
  const view = new AssistantView();
  view.epoch = epoch;
  const controller = new AbortController();
  current = {controller, view};
  setBusy(true);
  try {
    const {usage, finish} = await stream(view, body, controller.signal);
    const secs = (performance.now() - view.started) / 1000;
    const meta = [finish === "length" ? "cut at max tokens" : finish ? null : "the stream ended early",
      usage ? usage.completion_tokens + " tokens" : null, secs.toFixed(1) + " s",
      usage && secs > 0 ? (usage.completion_tokens / secs).toFixed(1) + " tok/s" : null].filter(Boolean).join(" · ");
    view.finish("done", meta);
    keep(view);
  } catch (e) {
    if (e.name === "AbortError") {
      view.finish("stopped", "stopped");
      if (view.content || view.reasoning || view.calls.length) keep(view);
    } else {
      view.finish("error", "");
      if (view.content || view.reasoning || view.calls.length) keep(view);  // the partial answer stays
      else {
        view.root.remove();
        if (restore !== undefined) {
          // nothing came back: the turn is taken out of the conversation and its text put back to edit and resend
          if (view.epoch === epoch) messages.splice(messages.lastIndexOf(restore), 1);
          userBubble.classList.add("failed");
          if (!$("prompt").value) $("prompt").value = restore.content;
        }
      }
      showError(e.title || "The request failed", e.message || String(e));
    }
  } finally {
    current = null;
    setBusy(false);
    $("prompt").focus();
  }
}

function keep(view) {
  if (view.epoch !== epoch) return;
  const [thinking, text] = view.split();
  const m = {role: "assistant", content: text};
  if (thinking) m.reasoning_content = thinking;
  if (view.calls.length) {
    m.tool_calls = view.calls.map((c) => ({
      id: c.id, type: "function", function: {name: c.name, arguments: c.arguments},
    }));
    view.calls.forEach((c, i) => resultBox(view, c, i));
  }
  messages.push(m);
}

// A tool call is answered by the user: the result goes back as a tool message and the model goes on.
function resultBox(view, call, i) {
  const card = view.cards[i];
  const box = card.appendChild(el("div", "result"));
  const t = box.appendChild(el("textarea"));
  t.placeholder = "the tool's result, sent back to the model";
  t.value = demoResult(call.name, view.parsed[i] || {});
  const b = box.appendChild(el("button", "", "Send result"));
  b.type = "button";
  b.addEventListener("click", () => {
    if (current) return;
    box.replaceWith(el("div", "sent", "result sent: " + (t.value || "(empty)")));
    messages.push({role: "tool", tool_call_id: call.id, content: t.value});
    call.answered = true;
    if (view.calls.every((c) => c.answered)) run();
  });
}

function closePendingCalls() {
  // tool calls the user left unanswered get an explicit result, so the history stays well-formed
  const open = [];
  for (let k = messages.length - 1; k >= 0 && messages[k].role !== "user"; k--) {
    if (messages[k].tool_calls) {
      const answered = new Set(messages.slice(k + 1).map((m) => m.tool_call_id));
      for (const c of messages[k].tool_calls) if (!answered.has(c.id)) open.push(c.id);
      break;
    }
  }
  for (const id of open) {
    messages.push({role: "tool", tool_call_id: id, content: "(not run: the user replied instead)"});
  }
  log.querySelectorAll(".toolcall .result").forEach((r) => r.replaceWith(el("div", "sent", "not run")));
}

function send(text) {
  if (current || !text.trim()) return;
  closePendingCalls();
  const m = {role: "user", content: text};
  messages.push(m);
  const bubble = addBubble("user", text);
  $("prompt").value = "";
  run(bubble, m);
}

function stop() {
  if (current) current.controller.abort();
}

$("composer").addEventListener("submit", (e) => { e.preventDefault(); send($("prompt").value); });
$("send").addEventListener("click", (e) => { if (current) { e.preventDefault(); stop(); } });
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send($("prompt").value); }
});
document.addEventListener("keydown", (e) => { if (e.key === "Escape") stop(); });
$("prompt").addEventListener("input", (e) => {
  e.target.style.height = "auto";
  e.target.style.height = e.target.scrollHeight + 2 + "px";
});
$("toggle-settings").addEventListener("click", (e) => {
  const open = $("settings").classList.toggle("open");
  e.target.ariaExpanded = String(open);
});
$("new-chat").addEventListener("click", () => {
  stop();
  epoch++;
  messages.length = 0;
  log.replaceChildren(el("p", "empty", "Ask something. The conversation stays in this page."));
  log.firstChild.id = "empty";
});
$("settings").addEventListener("change", () => settings.save());
$("model").addEventListener("change", () => settings.save());
$("api-key").addEventListener("change", () => loadModels());

settings.load();
loadModels();
window.FT = {renderMarkdown, messages, send, stop};  // for the browser tests and the console
