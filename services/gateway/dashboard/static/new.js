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

// The batch's endpoint comes from the file: every line names it as `url`. Only a file whose lines name several, or
// none, asks for it; lines with another url are then refused by validation, as the API would.
const ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"];
let fileEndpoints = null;  // a promise of what the chosen file's lines name

async function urlsOf(file) {
  const urls = new Map();
  let lines = 0;
  const take = (line) => {
    if (!line.trim()) return;
    lines += 1;
    let url = null;
    if (line.includes('"url"')) {  // a large file parses only the lines that may name one
      try { const row = JSON.parse(line); if (row && typeof row.url === "string") url = row.url; } catch (_) { /* validation says why */ }
    }
    if (url !== null) urls.set(url, (urls.get(url) || 0) + 1);
  };
  const reader = file.stream().pipeThrough(new TextDecoderStream()).getReader();
  let rest = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const parts = (rest + value).split("\n");
    rest = parts.pop();
    parts.forEach(take);
  }
  take(rest);
  return { lines, urls };
}

function showEndpoint(found) {
  const note = document.getElementById("endpoint-note");
  const choice = document.getElementById("endpoint-choice");
  const select = document.getElementById("endpoint");
  const named = [...found.urls.keys()];
  const endpoint = named.length === 1 && ENDPOINTS.includes(named[0]) ? named[0] : null;
  choice.hidden = endpoint !== null;
  select.required = endpoint === null;
  select.value = "";
  if (endpoint) {
    note.replaceChildren("Endpoint ", el("code", { id: "endpoint-found" }, endpoint), ", read from the file's lines.");
  } else if (!named.length) {
    note.replaceChildren(`No line of the file names a url, so choose the batch's endpoint below.`);
  } else {
    const listed = named.map((url) => `${url} (${plural(found.urls.get(url), "line")})`).join(", ");
    note.replaceChildren(named.length === 1 ? `The file's lines name ${listed}, which is not an endpoint here. `
      : `The file's lines name ${named.length} endpoints: ${listed}. A batch has one: `,
    "choose it below; lines with another url will be refused.");
  }
  return endpoint;
}

function chooseFile() {
  const file = document.getElementById("file").files[0];
  fileEndpoints = file ? urlsOf(file).then(showEndpoint) : null;
  if (fileEndpoints) fileEndpoints.catch((error) => say(`Could not read ${file.name}: ${error.message}`, true));
}

let refreshTimer = null;
function refreshErrors(batchId, refusedLines) {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(async () => {
    const summary = await apiJson(`/v1/batches/${batchId}/errors`);
    renderErrorGroups(document.getElementById("errors"), summary, refusedLines);
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
  const endpoint = (await (fileEndpoints || Promise.resolve(null)).catch(() => null))
    || document.getElementById("endpoint").value;
  if (!endpoint) {
    say("Choose the batch's endpoint: the file's lines do not name one.", true);
    document.getElementById("endpoint").focus();
    return;
  }
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
      input_file_id: uploaded.id, endpoint,
      completion_window: "24h", allow_partial: allowPartial, hold: true,
      placement: document.getElementById("placement").value } });
    say(`Validating batch ${batch.id}…`);
    const controller = new AbortController();
    await streamEvents(batch.id, (ev) => {
      if (ev.type === "batch.line_rejected") refreshErrors(batch.id);
      else if (ev.type === "batch.validation_progressed") say(`Validating: ${ev.data.lines_read} lines read, ${ev.data.errors_found} errors so far…`);
      else if (ev.type === "batch.validation_failed") {
        const d = ev.data;
        refreshErrors(batch.id, d.rejected_lines);
        const where = d.rejected_lines === null || d.rejected_lines === undefined
          ? `in a file of ${plural(d.total_lines, "line")}`
          : `on ${d.rejected_lines} of its ${plural(d.total_lines, "line")}`;
        say(`Validation failed: ${plural(d.error_count, "error")} ${where}; nothing ran. `
          + "Fix the file and upload it again.", true);
      } else if (ev.type === "batch.validated") {
        const status = document.getElementById("status");
        const refused = ev.data.rejected_lines || 0;
        const valid = ev.data.total_lines - refused;
        if (refused) refreshErrors(batch.id, refused);
        const run = el("button", { type: "button", id: "run" }, `Run ${plural(valid, "line")}`);
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
        const lines = refused ? `${valid} of ${plural(ev.data.total_lines, "line")} (${refused} refused: they go to `
          + "the error file)" : plural(valid, "line");
        status.replaceChildren(`Valid: ${lines} for ${ev.data.model}. Nothing has run yet. `, run);
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
  document.getElementById("file").addEventListener("change", chooseFile);
  chooseFile();  // a file the browser kept from before a reload
}
