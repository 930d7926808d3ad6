"use strict";
// API keys (/v1/organization/keys); worker keys are on the provider page (provider.js).
const BASE = "/v1/organization/keys";

async function load(revokedId) {
  let page = await apiJson(BASE);
  // The list is a read model that catches up within moments of a revocation: wait for it, briefly.
  for (let tries = 0; revokedId && tries < 20; tries++) {
    if (page.data.some((key) => key.id === revokedId && key.revoked)) break;
    await new Promise((resolve) => setTimeout(resolve, 250));
    page = await apiJson(BASE);
  }
  const body = document.querySelector("#keys tbody");
  body.replaceChildren();
  for (const key of page.data) {
    const revoke = key.revoked ? null : el("button", { type: "button", class: "danger",
      "aria-label": `Revoke ${key.name} (${key.id})`, onclick: () => revokeKey(key) }, "Revoke");
    body.append(el("tr", { "data-key-id": key.id },
      el("td", {}, key.name), el("td", {}, idText(key.id)),
      el("td", {}, key.role), el("td", {}, key.user_id || "—"),
      el("td", {}, when(key.created_at)), el("td", {}, when(key.last_used_at)),
      el("td", { class: "state" }, stateBadge(key.revoked ? "revoked" : "active")), el("td", {}, revoke)));
  }
}

async function revokeKey(key) {
  if (!confirm(`Revoke ${key.name}? Calls with it are refused at once.`)) return;
  try {
    const result = await apiJson(`${BASE}/${encodeURIComponent(key.id)}`, { method: "DELETE" });
    await load(key.id);
    const stopped = result.cancelled_batches.length;
    say(`Revoked ${key.id}${stopped ? `; ${stopped} live batch(es) stopped` : ""}.`);
  } catch (error) { say(`Could not revoke: ${error.message}`, true); }
  document.getElementById("status").focus();  // its button is gone: land on the outcome
}

document.getElementById("create").addEventListener("submit", async (event) => {
  event.preventDefault();
  const json = { name: document.getElementById("name").value.trim(), role: document.getElementById("role").value };
  const user = document.getElementById("user").value.trim();
  if (user) json.user_id = user;
  try {
    const created = await apiJson(BASE, { method: "POST", json });
    document.getElementById("raw").textContent = created.value;
    document.getElementById("created").hidden = false;
    say(`Created ${created.id}. Copy the key now: it is not shown again.`);
    await load();
    document.getElementById("copy").focus();
  } catch (error) { say(`Could not create the key: ${error.message}`, true); }
});

document.getElementById("copy").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(document.getElementById("raw").textContent);
    say("Copied.");
  } catch (_) { say("Copy failed: select the key and copy it by hand.", true); }
});

if (needKey()) load().catch((error) => say(`Could not list keys: ${error.message}`, true));
