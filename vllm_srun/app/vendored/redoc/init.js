// Starts Redoc on the server's own document; a file, not an inline script, so that the page's
// content-security policy can forbid inline scripts (vllm_srun/app/docs.py). The sidebar names
// each operation by its path: a peer's route and its alias under /vllm share a summary.
Redoc.init("/docs/openapi.json", { sideNavStyle: "path-only" }, document.getElementById("redoc-container"));
