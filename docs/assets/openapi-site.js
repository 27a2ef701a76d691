// Starts Redoc on the copy of the OpenAPI document the page carries (docs/hooks/openapi.py embeds
// docs/openapi.json), with the Redoc the server vendors (vllm_srun/app/vendored/redoc): the page
// loads nothing from another host and fetches nothing, so it renders from file:// too.
var container = document.getElementById("redoc-container");
var spec = JSON.parse(document.getElementById("openapi-document").textContent);
// As the server's /docs does: the sidebar names each operation by its path.
Redoc.init(spec, { sideNavStyle: "path-only" }, container);
