"use strict";
// Shared by every page: the key in sessionStorage, calls to /v1 with it, SSE over fetch, small renderers.
const KEY_SLOT = "sheshnag.key";

function apiKey() { return sessionStorage.getItem(KEY_SLOT); }
function setApiKey(key) { if (key) sessionStorage.setItem(KEY_SLOT, key); else sessionStorage.removeItem(KEY_SLOT); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function say(text, isError) {
  const status = document.getElementById("status");
  if (!status) return;
  status.textContent = text;
  status.classList.toggle("error", Boolean(isError));
}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = Object.assign({ Authorization: "Bearer " + (apiKey() || "") }, opts.headers || {});
  if (opts.json !== undefined) {
    opts.body = JSON.stringify(opts.json);
    opts.headers["Content-Type"] = "application/json";
    delete opts.json;
  }
  const response = await fetch(path, opts);
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try { const body = await response.json(); if (body.error) message = body.error.message; } catch (_) { /* not JSON */ }
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return response;
}

async function apiJson(path, options) { return (await api(path, options)).json(); }

function plural(count, one, many) { return `${count} ${count === 1 ? one : many || one + "s"}`; }

// At narrow widths (dashboard.css) each table row is a card of label: value pairs; every cell carries its column's
// header as data-label, and explicit roles keep the table's semantics once CSS changes how it displays.
function stackTable(table) {
  const labels = [...table.querySelectorAll("thead th")].map((th) => {
    const copy = th.cloneNode(true);
    for (const hidden of copy.querySelectorAll(".sr-only")) hidden.remove();
    return copy.textContent.trim();  // "" for a header only screen readers see (a row's actions)
  });
  table.setAttribute("role", "table");
  for (const group of table.querySelectorAll("thead, tbody")) group.setAttribute("role", "rowgroup");
  for (const header of table.querySelectorAll("thead th")) header.setAttribute("role", "columnheader");
  for (const row of table.rows) {
    row.setAttribute("role", "row");
    let column = 0;
    for (const cell of row.cells) {
      if (cell.tagName === "TD") {
        cell.setAttribute("role", "cell");
        if (cell.colSpan === 1 && labels[column]) cell.dataset.label = labels[column];
      }
      column += cell.colSpan;
    }
  }
}

for (const table of document.querySelectorAll("table")) {
  table.classList.add("stack");
  stackTable(table);
  for (const body of table.tBodies) new MutationObserver(() => stackTable(table)).observe(body, { childList: true });
}

// A state word (active, revoked, enabled, …) as a badge that never breaks.
function stateBadge(state) { return el("span", { class: `badge ${state}` }, state); }

// An id shown whole on one line, never broken mid-id (cut with an ellipsis where a card is too narrow; the title
// and any copy hold the whole id).
function idText(id, attrs) { return el(attrs && attrs.href ? "a" : "code", Object.assign({ class: "id", title: id }, attrs), id); }

function when(seconds) { return seconds ? new Date(seconds * 1000).toLocaleString() : "—"; }

function progressBar(counts) {
  const total = counts.total || 0;
  const done = (counts.completed || 0) + (counts.failed || 0);
  const label = total ? `${done} of ${total} lines (${counts.failed || 0} failed)` : "no lines counted yet";
  return el("div", { class: "progress" },
    el("progress", { max: total || 1, value: done, "aria-label": label }),
    el("span", { class: "progress-text" }, label));
}

// EventSource cannot send the Authorization header, so the stream is read with fetch().
async function streamEvents(batchId, onEvent, signal) {
  const response = await api(`/v1/batches/${encodeURIComponent(batchId)}/events`, { signal });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const event = { id: null, type: "message", data: "" };
      for (const line of frame.split("\n")) {
        if (line.startsWith("id: ")) event.id = line.slice(4);
        else if (line.startsWith("event: ")) event.type = line.slice(7);
        else if (line.startsWith("data: ")) event.data += line.slice(6);
      }
      if (!event.data) continue;
      try { event.data = JSON.parse(event.data); } catch (_) { /* keep the text */ }
      onEvent(event);
    }
  }
}

const STAGES = { ran: "ran and failed", not_run: "never ran" };
const LINES_PER_GROUP = 5;  // the errors view lists at most this many line numbers per kind

// One count per kind, from one source: validation errors by kind (`groups`, the validator's true counts; a line may
// have several errors), and the error file's other lines (ran and failed, never ran) by code. Lines refused by
// validation are counted there as lines only, never again by code. `refusedLines`: lines with errors, when the
// caller knows it before the error file exists (the validation verdict's `rejected_lines`).
function renderErrorGroups(container, summary, refusedLines) {
  container.replaceChildren();
  const fileKnown = summary.failed_lines !== null && summary.failed_lines !== undefined;
  let refused = refusedLines === undefined ? null : refusedLines;
  if (fileKnown) {
    const byStage = summary.failed_by_code.filter((group) => group.stage !== "refused");
    const refusedHere = summary.failed_by_code.filter((group) => group.stage === "refused");
    if (refusedHere.length) refused = refusedHere.reduce((sum, group) => sum + group.count, 0);
    container.append(el("p", { class: "failed-lines" }, `${plural(summary.failed_lines, "failed line")} in the error file`
      + (summary.failed_lines ? ":" : ".")));
    const items = [];
    if (refusedHere.length) {
      items.push(el("li", { "data-stage": "refused", "data-count": refused },
        `${refused} refused by validation: their errors by kind are below`));
    }
    for (const group of byStage) {
      items.push(el("li", { "data-code": group.code, "data-stage": group.stage, "data-count": group.count },
        el("code", {}, group.code), ` × ${group.count} (${STAGES[group.stage]}: ${group.title})`));
    }
    if (items.length) container.append(el("ul", { class: "failed-by-code" }, items));
  }
  if (!summary.groups.length) {
    if (!fileKnown) container.append(el("p", {}, "No errors."));
    return;
  }
  const lines = refused === null || refused === undefined ? "" : ` on ${plural(refused, "line")}`;
  container.append(el("p", { class: "error-total" },
    `${plural(summary.total, "error")}${lines}, of ${plural(summary.groups.length, "kind")}:`));
  const list = el("ul", { class: "error-groups" });
  for (const group of summary.groups) {
    list.append(el("li", { class: "error-group", "data-code": group.code, "data-count": group.count },
      el("h3", {}, `${group.title} `, el("code", {}, group.code), " ",
        el("span", { class: "count" }, `(${plural(group.count, "error")})`)),
      el("p", {}, group.lines.length >= LINES_PER_GROUP ? "First lines: " : "Lines: ",
        el("span", { class: "lines" }, group.lines.join(", ") || "—"),
        group.param ? [" · field ", el("code", {}, group.param)] : null),
      el("p", {}, group.example_message),
      el("p", { class: "fix" }, el("strong", {}, "Fix: "), group.fix)));
  }
  container.append(list);
}

async function download(fileId, name) {
  const blob = await (await api(`/v1/files/${encodeURIComponent(fileId)}/content`)).blob();
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

const ADMIN_PAGES = ["/dashboard/operator"];
/* Links a key without the admin role cannot use: hidden for it (the routes refuse it anyway). */

function showWho() {
  const who = document.getElementById("who");
  const key = apiKey();
  if (who) who.textContent = key ? `Signed in (${key.slice(0, 6)}…)` : "Not signed in";
  if (!key) return;
  apiJson("/v1/me").then((me) => {
    if (who) who.textContent = `Signed in as ${me.user_id || me.key_id} (${me.role}${me.organization_role === "admin" ? ", organisation admin" : ""})`;
    if (me.role === "admin") return;
    for (const link of document.querySelectorAll("nav a")) {
      if (ADMIN_PAGES.includes(link.getAttribute("href"))) link.closest("li").hidden = true;
    }
  }).catch(() => { /* a revoked or unknown key: the page's own call says so */ });
}

function needKey() {
  if (apiKey()) return true;
  say("Sign in first: this page needs an API key.", true);
  document.getElementById("main").append(el("p", {}, el("a", { href: "/dashboard/" }, "Sign in")));
  return false;
}

showWho();
