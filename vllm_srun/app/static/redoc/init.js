// Starts Redoc on the server's own document; a file, not an inline script, so that the page's
// content-security policy can forbid inline scripts (vllm_srun/app/docs.py).
Redoc.init("/docs/openapi.json", {}, document.getElementById("redoc-container"));
