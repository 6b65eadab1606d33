#include "serve/chat_page.hpp"

namespace attn::cli::serve {
namespace {

const char* kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>attn serve: @MODEL@</title>
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 0; background: #f6f6f4; color: #222; }
  header { padding: 10px 16px; background: #20303c; color: #fff; display: flex; gap: 16px; align-items: baseline; }
  header h1 { font-size: 17px; margin: 0; }
  header input { margin-left: auto; font: inherit; padding: 2px 6px; width: 16em; }
  main { max-width: 820px; margin: 0 auto; padding: 12px 16px 140px; }
  .turn { white-space: pre-wrap; padding: 8px 12px; margin: 8px 0; border-radius: 8px; }
  .user { background: #dde8f3; margin-left: 15%; }
  .assistant { background: #fff; border: 1px solid #ddd; margin-right: 15%; }
  .error { background: #fbe3e3; border: 1px solid #e0a0a0; }
  footer { position: fixed; bottom: 0; left: 0; right: 0; background: #fff; border-top: 1px solid #ccc; padding: 10px 16px; }
  footer form { max-width: 820px; margin: 0 auto; display: flex; gap: 8px; }
  textarea { flex: 1; font: inherit; height: 3.2em; padding: 6px; }
  button { font: inherit; padding: 0 18px; }
  #info { max-width: 820px; margin: 4px auto 0; color: #666; font-size: 13px; display: flex; gap: 16px; }
</style>
</head>
<body>
<header><h1>attn serve</h1><span>model: <b id="model">@MODEL@</b></span>
  <input id="api-key" type="password" placeholder="API key (if the server asks)" autocomplete="off"></header>
<main><div id="messages"></div></main>
<footer>
  <form id="form">
    <textarea id="prompt" placeholder="Ask something (Enter sends, Shift+Enter: a new line)"></textarea>
    <button id="send" type="submit">Send</button>
  </form>
  <div id="info"><span id="status">ready</span><span id="speed"></span><a href="#" id="clear">new conversation</a></div>
</footer>
<script>
"use strict";
const messages = [];  // the conversation sent with each request
const $ = (id) => document.getElementById(id);
let busy = false;

function addTurn(role, text) {
  const div = document.createElement("div");
  div.className = "turn " + role;
  div.textContent = text;
  $("messages").appendChild(div);
  window.scrollTo(0, document.body.scrollHeight);
  return div;
}

async function send(text) {
  busy = true;
  $("send").disabled = true;
  $("speed").textContent = "";
  $("status").textContent = "thinking...";
  messages.push({role: "user", content: text});
  addTurn("user", text);
  const old = $("reply");
  if (old) old.removeAttribute("id");
  const out = addTurn("assistant", "");
  out.id = "reply";
  let reply = "", tokens = 0, first = 0;
  const start = performance.now();
  try {
    const headers = {"Content-Type": "application/json"};
    if ($("api-key").value) headers["Authorization"] = "Bearer " + $("api-key").value;
    const res = await fetch("/v1/chat/completions", {method: "POST", headers,
      body: JSON.stringify({messages, stream: true, stream_options: {include_usage: true}, temperature: 0, max_tokens: 512})});
    if (!res.ok) {
      let msg = res.status + " " + res.statusText;
      try { msg = (await res.json()).error.message; } catch (e) {}
      throw new Error(msg);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
          const choice = chunk.choices && chunk.choices[0];
          if (choice && choice.delta && choice.delta.content) {
            if (!first) first = performance.now();
            reply += choice.delta.content;
            out.textContent = reply;
            $("status").textContent = "writing...";
            window.scrollTo(0, document.body.scrollHeight);
          }
        }
      }
    }
    messages.push({role: "assistant", content: reply});
    const secs = (performance.now() - start) / 1000;
    const decodeSecs = first ? (performance.now() - first) / 1000 : secs;
    $("speed").textContent = tokens + " tokens in " + secs.toFixed(2) + " s: " +
      (tokens / Math.max(secs, 1e-3)).toFixed(1) + " tokens/s (" +
      (tokens > 1 ? ((tokens - 1) / Math.max(decodeSecs, 1e-3)).toFixed(1) : "-") + " after the first)";
    $("status").textContent = "ready";
    if (!reply) out.textContent = "(empty reply)";
  } catch (e) {
    messages.pop();
    out.classList.add("error");
    out.textContent = "error: " + e.message;
    $("status").textContent = "error";
  } finally {
    busy = false;
    $("send").disabled = false;
    $("prompt").focus();
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || busy) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("clear").addEventListener("click", (e) => {
  e.preventDefault();
  messages.length = 0;
  $("messages").textContent = "";
  $("speed").textContent = "";
});
</script>
</body>
</html>
)HTML";

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string chat_page(const std::string& model_name) {
  std::string page = kPage;
  const std::string name = html_escape(model_name);
  for (size_t at; (at = page.find("@MODEL@")) != std::string::npos;) page.replace(at, 7, name);
  return page;
}

}  // namespace attn::cli::serve
