"""vLLM's pooling server's routes, at the root and under /vllm (its base URL here): rerank, score,
classify, pooling and embeddings, each an adapter onto a surface; `truncation` is what they share.
"""
