"use strict";
// Provider portal: register a provider (/v1/provider/providers), manage its worker keys, list its executors
// (/v1/provider/executors). An admin also gets the worker keys that belong to no provider (/v1/provider/worker_keys).
const ADMIN_KEYS = "admin";
const choice = document.getElementById("provider");

function keysPath(providerId) {
  return providerId === ADMIN_KEYS ? "/v1/provider/worker_keys"
    : `/v1/provider/providers/${encodeURIComponent(providerId)}/worker_keys`;
}

async function isAdmin() {
  try { await api("/v1/provider/worker_keys"); return true; } catch (error) {
    if (error.status === 403) return false;
    throw error;
  }
}

let providers = new Map();
let adminKey = false;

function showStatus() {
  const provider = providers.get(choice.value);
  const status = document.getElementById("provider-status");
  const approve = document.getElementById("approve");
  approve.hidden = !provider || !adminKey;
  if (!provider) { status.replaceChildren(); return; }
  const approved = provider.status === "approved";
  const also = provider.approved_organizations.length ? `; approved by ${provider.approved_organizations.join(", ")}` : "";
  status.replaceChildren(`Status: ${approved ? "approved (runs every organisation's batches)"
    : `unapproved (runs only ${provider.organization_id}'s batches)`}${also}.`);
  approve.textContent = approved ? "Withdraw approval" : "Approve for every organisation";
}

async function setApproval() {
  const provider = providers.get(choice.value);
  if (!provider) return;
  const action = provider.status === "approved" ? "unapprove" : "approve";
  try {
    const updated = await apiJson(`/v1/provider/providers/${encodeURIComponent(provider.id)}/${action}`, { method: "POST" });
    providers.set(updated.id, updated);
    showStatus();
  } catch (error) { say(`Could not ${action} the provider: ${error.message}`, true); }
}

async function loadProviders(selected) {
  const [page, admin] = await Promise.all([apiJson("/v1/provider/providers"), isAdmin()]);
  providers = new Map(page.data.map((p) => [p.id, p]));
  adminKey = admin;
  const options = page.data.map((p) => el("option", { value: p.id }, `${p.name} (${p.id})`));
  if (admin) options.push(el("option", { value: ADMIN_KEYS }, "No provider (admin-managed keys)"));
  if (!options.length) options.push(el("option", { value: "" }, "No provider yet: register one"));
  choice.replaceChildren(...options);
  if (selected) choice.value = selected;
  await loadKeys();
}

async function loadKeys(revokedId) {
  const providerId = choice.value;
  showStatus();
  document.getElementById("worker-keys").hidden = !providerId;
  if (!providerId) return;
  let page = await apiJson(keysPath(providerId));
  // The list is a read model that catches up within moments of a revocation: wait for it, briefly.
  for (let tries = 0; revokedId && tries < 20; tries++) {
    if (page.data.some((key) => key.id === revokedId && key.revoked)) break;
    await new Promise((resolve) => setTimeout(resolve, 250));
    page = await apiJson(keysPath(providerId));
  }
  const body = document.querySelector("#keys tbody");
  body.replaceChildren();
  if (!page.data.length) body.append(el("tr", {}, el("td", { colspan: 6 }, "No worker key yet.")));
  for (const key of page.data) {
    const revoke = key.revoked ? null : el("button", { type: "button", class: "danger",
      "aria-label": `Revoke ${key.name} (${key.id})`, onclick: () => revokeKey(providerId, key) }, "Revoke");
    body.append(el("tr", { "data-key-id": key.id },
      el("td", {}, key.name), el("td", {}, idText(key.id)),
      el("td", {}, when(key.created_at)), el("td", {}, when(key.last_used_at)),
      el("td", { class: "state" }, stateBadge(key.revoked ? "revoked" : "active")), el("td", {}, revoke)));
  }
}

async function revokeKey(providerId, key) {
  if (!confirm(`Revoke ${key.name}? Executors using it are refused from now on.`)) return;
  try {
    await apiJson(`${keysPath(providerId)}/${encodeURIComponent(key.id)}`, { method: "DELETE" });
    await loadKeys(key.id);
    say(`Revoked ${key.id}.`);
  } catch (error) { say(`Could not revoke: ${error.message}`, true); }
  document.getElementById("status").focus();  // its button is gone: land on the outcome
}

function memory(m) {
  return m ? `${Math.round(m.free_bytes / 1048576)} / ${Math.round(m.total_bytes / 1048576)} MiB` : "—";
}

function health(e) {
  const age = e.heartbeat_age_s === null ? "" : ` (heartbeat ${e.heartbeat_age_s}s ago)`;
  return [stateBadge(e.health), age];
}

async function loadExecutors() {
  const page = await apiJson("/v1/provider/executors");
  const body = document.querySelector("#executors tbody");
  body.replaceChildren();
  if (!page.data.length) {
    body.append(el("tr", {}, el("td", { colspan: 6 }, "No executor has joined with your worker keys yet.")));
  }
  for (const e of page.data) {
    const loaded = new Set(e.loaded_models);
    const models = e.models.map((m) => (loaded.has(m) ? `${m} (loaded)` : m)).join(", ") || "—";
    body.append(el("tr", { "data-executor-id": e.id },
      el("td", {}, idText(e.id)), el("td", {}, e.provider_id || "—"), el("td", {}, models),
      el("td", {}, memory(e.memory)), el("td", {}, health(e)), el("td", { class: "served" }, e.lines_served)));
  }
}

document.getElementById("register").addEventListener("submit", async (event) => {
  event.preventDefault();
  const name = document.getElementById("provider-name").value.trim();
  try {
    const provider = await apiJson("/v1/provider/providers", { method: "POST", json: { name } });
    await loadProviders(provider.id);
    say(`Registered ${provider.name} (${provider.id}). Create a worker key for its executors.`);
    document.getElementById("key-name").focus();
  } catch (error) { say(`Could not register the provider: ${error.message}`, true); }
});

document.getElementById("create").addEventListener("submit", async (event) => {
  event.preventDefault();
  const json = { name: document.getElementById("key-name").value.trim() };
  try {
    const created = await apiJson(keysPath(choice.value), { method: "POST", json });
    document.getElementById("raw").textContent = created.value;
    document.getElementById("join-key").textContent = created.value;
    document.getElementById("created").hidden = false;
    say(`Created ${created.id}. Copy the key now: it is not shown again.`);
    await loadKeys();
    document.getElementById("copy").focus();
  } catch (error) { say(`Could not create the worker key: ${error.message}`, true); }
});

document.getElementById("copy").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(document.getElementById("raw").textContent);
    say("Copied.");
  } catch (_) { say("Copy failed: select the key and copy it by hand.", true); }
});

document.getElementById("copy-join").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(document.getElementById("join").textContent);
    say("Copied the command.");
  } catch (_) { say("Copy failed: select the command and copy it by hand.", true); }
});

// The command names this gateway as the browser reaches it (`sheshnag up --listen` prints the same).
for (const place of document.querySelectorAll(".deployment")) place.textContent = location.origin;

document.getElementById("approve").addEventListener("click", setApproval);

choice.addEventListener("change", () => {
  document.getElementById("created").hidden = true;
  loadKeys().catch((error) => say(`Could not list worker keys: ${error.message}`, true));
});

function fail(error) { say(`Could not load the provider portal: ${error.message}`, true); }

if (needKey()) {
  loadProviders().catch(fail);
  loadExecutors().catch(fail);
  setInterval(() => loadExecutors().catch(fail), 5000);
}
