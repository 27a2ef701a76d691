"""The surfaces' HTTP controllers, one module per route shape.

Each controller decodes its body, calls `respond` with its surface's descriptor and returns the
response; the descriptors in `vllm_srun.plugins.surfaces` name these controllers, and the app
mounts what they name. A route in another API's shape onto an existing surface is one more
module here and one `Route` line on that surface's descriptor.
"""
