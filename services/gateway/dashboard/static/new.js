"use strict";
// New batch: sample lines per endpoint and model, then upload, create held (validation only) and watch validation;
// nothing runs until the user presses "Run".
const CHAT_ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/responses"];

function sampleBody(endpoint, model) {
  if (endpoint === "/v1/embeddings") return { model, input: "The quick brown fox." };
  if (endpoint === "/v1/completions") return { model, prompt: "Say hello.", max_tokens: 32 };
  if (endpoint === "/v1/responses") return { model, input: "Say hello.", max_output_tokens: 32 };
  return { model, messages: [{ role: "user", content: "Say hello." }], max_tokens: 32 };
}

async function showSamples() {
  const samples = document.getElementById("samples");
  try {
    const models = await apiJson("/v1/models");
    samples.replaceChildren();
    for (const model of models.data) {
      const endpoints = model.id.includes("embed") ? ["/v1/embeddings"] : CHAT_ENDPOINTS;
      for (const endpoint of endpoints) {
        const line = { custom_id: "request-1", method: "POST", url: endpoint, body: sampleBody(endpoint, model.id) };
        samples.append(el("h3", {}, el("code", {}, endpoint), " with ", el("code", {}, model.id)),
          el("pre", { tabindex: "0", "aria-label": `Sample line for ${endpoint} with ${model.id}` },
            JSON.stringify(line)));
      }
    }
  } catch (error) {
    samples.replaceChildren(el("p", { class: "error" }, `Could not list models: ${error.message}`));
  }
}

let refreshTimer = null;
function refreshErrors(batchId) {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(async () => {
    const summary = await apiJson(`/v1/batches/${batchId}/errors`);
    renderErrorGroups(document.getElementById("errors"), summary);
  }, 250);
}

// fetch() reports no upload progress: the upload goes by XMLHttpRequest, its percent on a progress bar.
function uploadWithProgress(form, name) {
  const bar = document.getElementById("upload-progress");
  bar.hidden = false;
  bar.value = 0;
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open("POST", "/v1/files");
    request.setRequestHeader("Authorization", "Bearer " + (apiKey() || ""));
    request.upload.addEventListener("progress", (event) => {
      if (!event.lengthComputable) return;
      const percent = Math.floor((100 * event.loaded) / event.total);
      bar.value = percent;
      say(`Uploading ${name}: ${percent} %`);
    });
    request.addEventListener("load", () => {
      let body = null;
      try { body = JSON.parse(request.responseText); } catch (_) { /* not JSON */ }
      if (request.status >= 200 && request.status < 300 && body) { bar.value = 100; resolve(body); return; }
      reject(new Error(body && body.error ? body.error.message : `${request.status} ${request.statusText}`));
    });
    request.addEventListener("error", () => reject(new Error("the upload was interrupted")));
    request.send(form);
  });
}

async function submit(event) {
  event.preventDefault();
  const file = document.getElementById("file").files[0];
  if (!file) { say("Choose a JSONL file first.", true); return; }
  const button = event.submitter || document.querySelector("#upload button");
  button.disabled = true;
  document.getElementById("errors").replaceChildren(el("p", {}, "None yet."));
  try {
    say(`Uploading ${file.name}…`);
    const form = new FormData();
    form.append("purpose", "batch");
    form.append("file", file, file.name);
    const uploaded = await uploadWithProgress(form, file.name);
    const allowPartial = document.getElementById("allow-partial").checked;
    const batch = await apiJson("/v1/batches", { method: "POST", json: {
      input_file_id: uploaded.id, endpoint: document.getElementById("endpoint").value,
      completion_window: "24h", allow_partial: allowPartial, hold: true,
      placement: document.getElementById("placement").value } });
    say(`Validating batch ${batch.id}…`);
    const controller = new AbortController();
    await streamEvents(batch.id, (ev) => {
      if (ev.type === "batch.line_rejected") refreshErrors(batch.id);
      else if (ev.type === "batch.validation_progressed") say(`Validating: ${ev.data.lines_read} lines read, ${ev.data.errors_found} errors so far…`);
      else if (ev.type === "batch.validation_failed") {
        refreshErrors(batch.id);
        say(`Validation failed: ${ev.data.error_count} error(s) in ${ev.data.total_lines} lines; nothing ran. Fix the file and upload it again.`, true);
      } else if (ev.type === "batch.validated") {
        const status = document.getElementById("status");
        const run = el("button", { type: "button", id: "run" }, `Run ${ev.data.total_lines} lines`);
        run.addEventListener("click", async () => {
          run.disabled = true;
          try {
            await apiJson(`/v1/batches/${batch.id}/release`, { method: "POST" });
            status.replaceChildren("Running. ", el("a", { href: `/dashboard/batches/${batch.id}` }, "Watch the batch"));
          } catch (error) {
            say(`Could not start the batch: ${error.message}`, true);
            run.disabled = false;
          }
        });
        status.replaceChildren(`Valid: ${ev.data.total_lines} lines for ${ev.data.model}. Nothing has run yet. `, run);
        controller.abort();
      }
    }, controller.signal).catch((error) => { if (error.name !== "AbortError") throw error; });
  } catch (error) {
    say(`Could not create the batch: ${error.message}`, true);
  } finally {
    button.disabled = false;
  }
}

if (needKey()) {
  showSamples();
  document.getElementById("upload").addEventListener("submit", submit);
}
