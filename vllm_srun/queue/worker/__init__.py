"""The device worker's side of the queue: arq worker, coalescer, leases, bulk chunks, poller, heartbeat.

Nothing at the top of `vllm_srun.queue` imports this package; it imports from there.
"""
