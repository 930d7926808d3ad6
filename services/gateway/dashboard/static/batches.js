"use strict";
// Batches: the key's batches with status, progress, model and times; refreshed while any is live.
const FINISHED = new Set(["completed", "failed", "expired", "cancelled"]);

async function load() {
  const page = await apiJson("/v1/batches?limit=100");
  const body = document.querySelector("#batches tbody");
  body.replaceChildren();
  if (!page.data.length) body.append(el("tr", {}, el("td", { colspan: 6 }, "No batches yet.")));
  for (const batch of page.data) {
    const finished = batch.completed_at || batch.failed_at || batch.cancelled_at || batch.expired_at;
    body.append(el("tr", { "data-batch-id": batch.id },
      el("td", {}, el("a", { href: `/dashboard/batches/${batch.id}` }, batch.id)),
      el("td", {}, el("span", { class: `badge ${batch.status}` }, batch.status)),
      el("td", {}, progressBar(batch.request_counts)),
      el("td", {}, batch.model || "—"), el("td", {}, when(batch.created_at)), el("td", {}, when(finished))));
  }
  if (page.data.some((batch) => !FINISHED.has(batch.status))) setTimeout(() => load().catch(fail), 2000);
}

function fail(error) { say(`Could not list batches: ${error.message}`, true); }

if (needKey()) load().catch(fail);
