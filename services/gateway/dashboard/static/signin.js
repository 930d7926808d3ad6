"use strict";
// Sign in: check the key with GET /v1/models, then keep it for this tab's session.
document.getElementById("signin").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = document.getElementById("key").value.trim();
  setApiKey(key);
  try {
    const models = await apiJson("/v1/models");
    say(`Signed in. ${plural(models.data.length, "model")} available. `);
    document.getElementById("status").append("Next: ", el("a", { href: "/dashboard/new" }, "upload a batch file"), ".");
    showWho();
  } catch (error) {
    setApiKey(null);
    showWho();
    say(`That key was refused: ${error.message}`, true);
  }
});
document.getElementById("signout").addEventListener("click", () => {
  setApiKey(null);
  showWho();
  say("Signed out.");
});
