"""The surfaces' HTTP controllers, one module per route shape.

Each controller decodes its body, calls `respond` with its surface's descriptor and returns the
response; the descriptors in `vllm_srun.plugins.surfaces` name these controllers, and the app
mounts what they name (checking each is at the path its `Route` says). A route in another
API's shape onto an existing surface is one more module here, whose controller converts its
body to the surface's request and passes `respond` a `shape` for the response, plus one
`Route` line on that surface's descriptor; `docs/openapi.json` is then regenerated from it
(`python -m vllm_srun.app.openapi`).
"""
