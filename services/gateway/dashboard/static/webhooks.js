"use strict";
// Webhook endpoints (/v1/webhooks) and their deliveries with every attempt.
const BASE = "/v1/webhooks";

async function load() {
  const page = await apiJson(BASE);
  const body = document.querySelector("#endpoints tbody");
  body.replaceChildren();
  if (!page.data.length) body.append(el("tr", {}, el("td", { colspan: "5" }, "No endpoints yet.")));
  for (const endpoint of page.data) {
    body.append(el("tr", { "data-webhook-id": endpoint.id },
      el("td", { class: "wrap" }, el("code", {}, endpoint.url)),
      el("td", { class: "wrap" }, endpoint.events.join(", ")),
      el("td", {}, endpoint.scope === "organization" ? `organisation ${endpoint.organization_id}` : "own batches"),
      el("td", { class: "state" }, stateBadge(endpoint.enabled ? "enabled" : "disabled")),
      el("td", { class: "actions" },
        el("button", { type: "button", onclick: () => showDeliveries(endpoint) }, "Deliveries"),
        el("button", { type: "button", onclick: () => toggle(endpoint) }, endpoint.enabled ? "Disable" : "Enable"),
        el("button", { type: "button", class: "danger", "aria-label": `Delete ${endpoint.url}`,
          onclick: () => remove(endpoint) }, "Delete"))));
  }
}

async function toggle(endpoint) {
  try {
    await apiJson(`${BASE}/${endpoint.id}`, { method: "POST", json: { enabled: !endpoint.enabled } });
    say(`${endpoint.enabled ? "Disabled" : "Enabled"} ${endpoint.url}.`);
    await load();
  } catch (error) { say(`Could not change the endpoint: ${error.message}`, true); }
}

async function remove(endpoint) {
  if (!confirm(`Delete the endpoint ${endpoint.url}? Deliveries still pending to it end failed.`)) return;
  try {
    await apiJson(`${BASE}/${endpoint.id}`, { method: "DELETE" });
    document.getElementById("deliveries").hidden = true;
    say(`Deleted ${endpoint.url}.`);
    await load();
  } catch (error) { say(`Could not delete: ${error.message}`, true); }
  document.getElementById("status").focus();
}

function attemptsText(delivery) {
  if (!delivery.attempts.length) return "none yet";
  return delivery.attempts.map((a) => `${new Date(a.attempted_at * 1000).toLocaleTimeString()}: ` +
    (a.status_code ? `HTTP ${a.status_code}` : a.error) + ` (${a.duration_ms} ms)`).join("; ");
}

async function showDeliveries(endpoint) {
  try {
    const page = await apiJson(`${BASE}/${endpoint.id}/deliveries?limit=50`);
    document.getElementById("deliveries-title").textContent = `Deliveries to ${endpoint.url}`;
    const body = document.querySelector("#delivery-table tbody");
    body.replaceChildren();
    if (!page.data.length) body.append(el("tr", {}, el("td", { colspan: "5" }, "Nothing sent yet.")));
    for (const delivery of page.data) {
      const again = delivery.status === "pending" ? null : el("button", { type: "button",
        onclick: () => redeliver(endpoint, delivery) }, "Send again");
      body.append(el("tr", { "data-delivery-id": delivery.id },
        el("td", {}, delivery.event.type),
        el("td", {}, idText(delivery.event.data.id,
          { href: `/dashboard/batches/${encodeURIComponent(delivery.event.data.id)}` })),
        el("td", { class: "state" }, stateBadge(delivery.status)),
        el("td", { class: "wrap" }, attemptsText(delivery)), el("td", {}, again)));
    }
    document.getElementById("deliveries").hidden = false;
  } catch (error) { say(`Could not list deliveries: ${error.message}`, true); }
}

async function redeliver(endpoint, delivery) {
  try {
    await apiJson(`${BASE}/${endpoint.id}/deliveries/${delivery.id}/redeliver`, { method: "POST" });
    say(`Sending ${delivery.event.type} again.`);
    await showDeliveries(endpoint);
  } catch (error) { say(`Could not send it again: ${error.message}`, true); }
}

document.getElementById("create").addEventListener("submit", async (event) => {
  event.preventDefault();
  const events = [...document.querySelectorAll('input[name="events"]:checked')].map((box) => box.value);
  if (!events.length) { say("Choose at least one event.", true); return; }
  const json = { url: document.getElementById("url").value.trim(), events,
    scope: document.getElementById("scope").value };
  const description = document.getElementById("description").value.trim();
  if (description) json.description = description;
  try {
    const created = await apiJson(BASE, { method: "POST", json });
    document.getElementById("secret").textContent = created.secret;
    document.getElementById("created").hidden = false;
    say(`Added ${created.url}. Copy its signing secret now: it is not shown again.`);
    await load();
    document.getElementById("copy").focus();
  } catch (error) { say(`Could not add the endpoint: ${error.message}`, true); }
});

document.getElementById("copy").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(document.getElementById("secret").textContent);
    say("Copied.");
  } catch (_) { say("Copy failed: select the secret and copy it by hand.", true); }
});

if (needKey()) load().catch((error) => say(`Could not list endpoints: ${error.message}`, true));
