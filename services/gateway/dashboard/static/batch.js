"use strict";
// One batch: live timeline from its SSE stream, counts, usage, errors, downloads and cancel.
const batchId = document.getElementById("batch").dataset.batchId;
const CANCELLABLE = new Set(["validating", "validated", "in_progress"]);

function row(term, value) { return [el("dt", {}, term), el("dd", {}, value)]; }

// An id no batch of this key has (mistyped, another key's, or never made): say so instead of empty cards.
function notFound() {
  document.title = "Batch not found · Sheshnag";
  document.getElementById("batch").replaceChildren(el("section", { class: "card notice", role: "alert",
    "aria-labelledby": "not-found-h" },
  el("h2", { id: "not-found-h" }, "Batch not found"),
  el("p", {}, "No batch ", idText(batchId), " is visible to the key you signed in with: the id may be mistyped, ",
    "or the batch belongs to another key."),
  el("p", {}, el("a", { href: "/dashboard/batches" }, "See your batches"), " or ",
    el("a", { href: "/dashboard/new" }, "start a new batch"), ".")));
}

function failed(prefix) {
  return (error) => { if (error.status === 404) notFound(); else say(`${prefix}${error.message}`, true); };
}

async function refresh() {
  const batch = await apiJson(`/v1/batches/${batchId}`);
  const usage = batch.usage || {};
  document.getElementById("summary").replaceChildren(
    ...row("Batch", batch.id), ...row("Status", el("span", { class: `badge ${batch.status}`, id: "batch-status" }, batch.status)),
    ...row("Endpoint", batch.endpoint), ...row("Model", batch.model || "—"),
    ...row("Requests", `${batch.request_counts.completed} completed, ${batch.request_counts.failed} failed, ${batch.request_counts.total} total`),
    ...row("Usage", `${usage.input_tokens || 0} input + ${usage.output_tokens || 0} output = ${usage.total_tokens || 0} tokens`),
    ...row("Created", when(batch.created_at)), ...row("Finished", when(batch.completed_at || batch.failed_at || batch.cancelled_at || batch.expired_at)),
    ...row("Placement", batch.placement === "own_organization" ? "Only its organisation's own providers" : "Approved providers"),
    ...row("Ran on", (batch.attempts || []).length ? el("ul", { id: "attempts" }, ...batch.attempts.map((a) =>
      el("li", {}, `attempt ${a.attempt}: ${a.executor_id} (${a.provider_id ? `provider ${a.provider_id}` : "the platform's own"})`)))
      : "—"),
    ...(batch.status_reason ? row("Why", batch.status_reason) : []));
  document.getElementById("progress").replaceChildren(progressBar(batch.request_counts));
  const downloads = document.getElementById("downloads");
  downloads.replaceChildren();
  for (const [label, fileId, name] of [["Download output", batch.output_file_id, "output.jsonl"],
                                       ["Download errors", batch.error_file_id, "errors.jsonl"]]) {
    if (fileId) {
      downloads.append(el("button", { type: "button", class: "secondary", id: name.replace(".jsonl", "-download"),
        onclick: () => download(fileId, `${batch.id}-${name}`).catch((e) => say(e.message, true)) }, label));
    }
  }
  document.getElementById("cancel").hidden = !CANCELLABLE.has(batch.status);
  const ended = ["completed", "failed", "cancelled", "expired"].includes(batch.status);
  if ((batch.errors && batch.errors.total) || (ended && batch.request_counts.failed)) {
    renderErrorGroups(document.getElementById("errors"), await apiJson(`/v1/batches/${batchId}/errors`));
  }
}

function describe(ev) {
  const d = ev.data || {};
  switch (ev.type) {
    case "batch.line_rejected": return `line ${d.line}: ${d.code}${d.param ? ` (${d.param})` : ""}`;
    case "batch.validation_progressed": return `${d.lines_read} lines read, ${d.errors_found} errors`;
    case "batch.validated": return `${d.total_lines} lines valid for ${d.model}`;
    case "batch.assigned": return `assigned to ${d.executor_id} (attempt ${d.attempt})`;
    case "batch.started": return `started on ${d.executor_id} with ${d.engine}`;
    case "batch.progressed": return `chunk ${d.chunk}: ${d.completed} completed, ${d.failed} failed`;
    default: return "";
  }
}

async function follow() {
  let timer = null;
  await streamEvents(batchId, (ev) => {
    const at = ev.data && ev.data.occurred_at ? new Date(ev.data.occurred_at).toLocaleTimeString() : "";
    document.getElementById("timeline").append(
      el("li", { "data-type": ev.type }, el("time", {}, at), " ", el("strong", {}, ev.type.replace("batch.", "")), " ", describe(ev)));
    clearTimeout(timer);
    timer = setTimeout(() => refresh().catch(failed("")), 200);
  });
  await refresh();
}

document.getElementById("cancel").addEventListener("click", async () => {
  if (!window.confirm(`Cancel batch ${batchId}? Lines already run are kept; the rest end batch_cancelled.`)) return;
  try {
    await api(`/v1/batches/${batchId}/cancel`, { method: "POST" });
    say("Cancelling: no new line starts; lines already done are kept.");
    await refresh();
  } catch (error) { say(`Could not cancel: ${error.message}`, true); }
});

if (needKey()) {
  // The summary first: an unknown id is then said plainly, with no stream to follow.
  refresh().then(follow, (error) => { failed("")(error); if (error.status !== 404) return follow(); })
    .catch(failed("The live stream stopped: "));
}
