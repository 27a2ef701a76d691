"""vllm-sr-example: a third-party plugin for vllm-srun, found only through entry points."""

FORMAT = "vllm-sr-example/1"
MODEL_FILE = "example_model.json"
__version__ = "0.1.0"
