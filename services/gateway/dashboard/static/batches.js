"use strict";
// Batches: the key's batches with status, progress, model and times, a page at a time, filtered by status and
// searched by id or metadata (GET /v1/batches?status=&search=&after=); refreshed while any shown is live.
const FINISHED = new Set(["completed", "failed", "expired", "cancelled"]);
const PAGE = 20;
let cursors = [null];  // the `after` of each page shown so far: [null, last id of page 1, …]
let refreshing = null;

function query(after) {
  const params = new URLSearchParams({ limit: String(PAGE) });
  const status = document.getElementById("status-filter").value;
  const search = document.getElementById("search").value.trim();
  if (status) params.set("status", status);
  if (search) params.set("search", search);
  if (after) params.set("after", after);
  return `/v1/batches?${params}`;
}

async function load() {
  clearTimeout(refreshing);
  const page = await apiJson(query(cursors[cursors.length - 1]));
  const body = document.querySelector("#batches tbody");
  body.replaceChildren();
  if (!page.data.length) {
    const first = cursors.length === 1 && !document.getElementById("status-filter").value
      && !document.getElementById("search").value.trim();
    body.append(el("tr", {}, el("td", { colspan: 6 }, "No batches here.", first
      ? [" ", el("a", { href: "/dashboard/new" }, "Upload a batch file"), " to start one."] : null)));
  }
  for (const batch of page.data) {
    const finished = batch.completed_at || batch.failed_at || batch.cancelled_at || batch.expired_at;
    body.append(el("tr", { "data-batch-id": batch.id },
      el("td", {}, idText(batch.id, { href: `/dashboard/batches/${batch.id}` })),
      el("td", {}, el("span", { class: `badge ${batch.status}` }, batch.status)),
      el("td", {}, progressBar(batch.request_counts)),
      el("td", {}, batch.model || "—"), el("td", {}, when(batch.created_at)), el("td", {}, when(finished))));
  }
  document.getElementById("newer").disabled = cursors.length < 2;
  const older = document.getElementById("older");
  older.disabled = !page.has_more;
  older.dataset.after = page.last_id || "";
  say(`Page ${cursors.length}: ${page.data.length} batches${page.has_more ? ", more older ones" : ""}.`);
  if (page.data.some((batch) => !FINISHED.has(batch.status))) refreshing = setTimeout(() => load().catch(fail), 2000);
}

function fail(error) { say(`Could not list batches: ${error.message}`, true); }

if (needKey()) {
  load().catch(fail);
  document.getElementById("filter").addEventListener("submit", (event) => {
    event.preventDefault();
    cursors = [null];
    load().catch(fail);
  });
  document.getElementById("older").addEventListener("click", (event) => {
    cursors.push(event.target.dataset.after);
    load().catch(fail);
  });
  document.getElementById("newer").addEventListener("click", () => {
    if (cursors.length > 1) cursors.pop();
    load().catch(fail);
  });
}
