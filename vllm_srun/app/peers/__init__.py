"""Routes in other APIs' shapes, one module (or package) per API: OpenAI, text-embeddings-inference,
Cohere, vLLM, Infinity, and the router's own contract. Each is an adapter onto the surfaces:
its controller converts its body to a surface's request, serves it through `respond`, and
shapes the surface's response into its API's; `failures` is their one way to fail a request
on a failed item. `vllm_srun.app.routes` mounts them beside the surfaces' own routes.
"""
