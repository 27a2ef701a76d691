// Starts Swagger UI on the server's own document; a file, not an inline script, so that the
// page's content-security policy can forbid inline scripts (vllm_srun/app/docs.py). Every
// operation opens ready to try (its requests go to this server), and no validator badge is
// fetched from swagger.io.
window.ui = SwaggerUIBundle({
  url: "/docs/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  tryItOutEnabled: true,
  filter: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
