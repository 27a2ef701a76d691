// Starts Swagger UI on the server's own document; a file, not an inline script, so that the
// page's content-security policy can forbid inline scripts (vllm_srun/app/docs.py).
window.ui = SwaggerUIBundle({
  url: "/docs/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
