# The runtime image: CPU torch, the native and onnxruntime engines, no model inside.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/vllm-srun
# The CPU wheel first: the project's torch range admits it, so no CUDA build is pulled.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md ./
COPY vllm_srun ./vllm_srun
RUN pip install '.[torch,onnx]'
RUN useradd --system --uid 10001 srun
USER srun
EXPOSE 8000
ENTRYPOINT ["vllm-srun"]
CMD ["--help"]
