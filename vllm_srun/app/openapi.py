"""The OpenAPI document as JSON text; `python -m vllm_srun.app.openapi` prints it.

docs/openapi.json is this output, checked in; a test keeps the two the same. The server
answers the same document at /openapi.json and its contract's part, in YAML, at /openapi.yaml
(`peers/router.py`).
"""

from __future__ import annotations

import json


def document_text() -> str:
    from vllm_srun.app.main import create_app

    return json.dumps(create_app().openapi_schema.to_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(document_text(), end="")
