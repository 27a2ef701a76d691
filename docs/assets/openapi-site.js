// Starts Redoc on the site's copy of the OpenAPI document (docs/openapi.json), with the Redoc the
// server vendors (vllm_srun/app/static/redoc): the page loads nothing from another host.
var container = document.getElementById("redoc-container");
Redoc.init(container.dataset.spec, {}, container);
