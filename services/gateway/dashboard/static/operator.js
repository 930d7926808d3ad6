"use strict";
// Operator view: GET /v1/organization/overview and /v1/admin/anomalies (admin), refreshed every few seconds.
function mib(bytes) { return `${Math.round(bytes / 1048576)} MiB`; }

function shareCell(share) {
  const percent = Math.round(share * 100);
  return el("div", { class: "progress share" },
    el("progress", { max: 100, value: percent, "aria-label": `${percent} % of the lines committed` }),
    el("span", { class: "progress-text" }, `${percent} %`));
}

function fillShares(view) {
  const minutes = Math.round(view.share_window_s / 60);
  document.getElementById("shares-note").textContent = `Lines each owner's batches committed in the last ${minutes} `
    + "minutes, as a share of all the fleet committed then, with what each still has queued and running.";
  const body = document.querySelector("#shares tbody");
  body.replaceChildren();
  if (!view.owners.length) {
    body.append(el("tr", {}, el("td", { colspan: 7 }, "No owner has a batch queued or running, or ran one lately.")));
  }
  for (const o of view.owners) {
    const organization = o.user_id ? o.organization_id || "default" : "—";  // a key without a user is alone
    body.append(el("tr", { "data-owner": o.owner }, [o.user_id || o.owner, organization, shareCell(o.share),
      o.recent_lines, o.running_batches, o.queued_batches, o.lines_left].map((cell) => el("td", {}, cell))));
  }
}

function fill(id, rows, empty, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: columns }, empty)));
  for (const cells of rows) body.append(el("tr", {}, cells.map((cell) => el("td", {}, cell))));
}

async function load() {
  const view = await apiJson("/v1/organization/overview");
  fill("executors", view.executors.map((e) => [e.executor_id, e.engine, e.models.join(", "), e.slots,
    `${mib(e.free_bytes)} / ${mib(e.total_bytes)}`, `${e.heartbeat_age_s}s ago`]), "No executor is heartbeating.", 6);
  document.getElementById("by-status").replaceChildren(...Object.entries(view.batches_by_status)
    .map(([status, count]) => el("li", {}, el("span", { class: `badge ${status}` }, status), ` ${count}`)));
  fillShares(view);
  fill("queue", view.queued.map((q) => [el("a", { href: `/dashboard/batches/${q.batch_id}` }, q.batch_id), q.model,
    `${q.age_s}s`, q.reason || "—"]), "Nothing waits.", 4);
  fill("running", view.running.map((r) => [el("a", { href: `/dashboard/batches/${r.batch_id}` }, r.batch_id), r.model,
    r.status, progressBar({ total: r.total, completed: r.done, failed: 0 }), r.lines_per_s,
    r.eta_s === null ? "—" : `${r.eta_s}s`]), "Nothing runs.", 6);
  await loadAccounts();
  const anomalies = await apiJson("/v1/admin/anomalies");
  fill("anomalies", anomalies.data.map((a) => [a.sequence, aggregateCell(a), el("code", {}, a.event_type), a.reason,
    when(a.created_at)]), "No anomalies: every fact fitted its aggregate.", 5);
  say(`Updated ${new Date(view.at * 1000).toLocaleTimeString()}.`);
}

function movement(last) {
  if (!last) return "—";
  const where = last.batch_id ? ` (${last.batch_id})` : "";
  return `${last.type} ${last.amount_usd}${where}, ${when(last.created_at)}`;
}

async function loadAccounts() {
  const accounts = await apiJson("/v1/billing/accounts");
  const enabled = accounts.data.length ? accounts.data[0].billing_enabled : null;
  if (enabled === false) {
    document.getElementById("billing-note").textContent = "This deployment does not bill (SHESHNAG_GATEWAY_BILLING is "
      + "off): batches need no credit. Grants are kept for when it does.";
  }
  fill("accounts", accounts.data.map((a) => [a.organization_id, a.balance_usd, a.reserved_usd, a.available_usd,
    a.open_batches, movement(a.last_event)]), "No organisation has credit yet: grant some below.", 6);
}

async function grant(event) {
  event.preventDefault();
  const form = new FormData(event.target);
  const body = Object.fromEntries([...form.entries()].filter(([, value]) => value !== ""));
  try {
    const answer = await apiJson("/v1/billing/grants", { method: "POST", json: body });
    say(`Granted ${answer.amount_usd} USD to ${answer.organization_id}.`);
    event.target.reset();
    await loadAccounts();
  } catch (error) {
    say(`Could not grant: ${error.message}`, true);
  }
}

function aggregateCell(a) {
  const name = `${a.aggregate_type} ${a.aggregate_id}`;
  return a.aggregate_type === "batch" ? el("a", { href: `/dashboard/batches/${a.aggregate_id}` }, name) : name;
}

// A key without the admin role is refused every call here (403): say what the page needs, in plain words, once.
let timer = null;
function needsAdmin() {
  clearInterval(timer);
  if (document.getElementById("needs-admin")) return;
  for (const part of document.querySelectorAll("#intro, main section")) part.hidden = true;
  say("");
  document.getElementById("status").before(el("section", { class: "card notice", id: "needs-admin", role: "alert",
    "aria-labelledby": "needs-admin-h" },
  el("h2", { id: "needs-admin-h" }, "This page needs an admin key"),
  el("p", {}, "The operator view shows the whole fleet, every owner's share of it and billing, so only an "
    + "administrator's key can open it. The key you signed in with is a user key: it sees your own batches, keys "
    + "and webhooks."),
  el("p", {}, "To use this page, ", el("a", { href: "/dashboard/" }, "sign in with an admin key"),
    " (your administrator can make one). Or go back to ", el("a", { href: "/dashboard/batches" }, "your batches"),
    ".")));
}

function fail(error) {
  if (error.status === 403) needsAdmin();
  else say(`Could not load the overview: ${error.message}`, true);
}

if (needKey()) {
  load().catch(fail);
  timer = setInterval(() => load().catch(fail), 5000);
  document.getElementById("refresh").addEventListener("click", () => load().catch(fail));
  document.getElementById("grant").addEventListener("submit", grant);
}
