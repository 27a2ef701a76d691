"""The OpenAPI document as JSON text; `python -m vllm_srun.app.openapi` prints it.

docs/openapi.json is this output, checked in; a test keeps the two the same. The server
answers the same document at /openapi.json and, in YAML, at /openapi.yaml.
"""

from __future__ import annotations

import json
from typing import Any

import yaml


def document_text() -> str:
    from vllm_srun.app.main import create_app

    return json.dumps(create_app().openapi_schema.to_schema(), indent=2, sort_keys=True) + "\n"


class _Dumper(yaml.SafeDumper):
    """YAML without anchors: a schema that appears twice is written out twice, as in JSON."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def openapi_yaml_text(app: Any) -> str:
    """`app`'s document in YAML, keys in the JSON document's order."""
    return yaml.dump(app.openapi_schema.to_schema(), Dumper=_Dumper, sort_keys=False, allow_unicode=True)


if __name__ == "__main__":
    print(document_text(), end="")
