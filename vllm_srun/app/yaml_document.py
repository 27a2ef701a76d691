"""The OpenAPI document in YAML, as GET /openapi.yaml answers it (the router's dashboard reads it)."""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """YAML without anchors: a schema that appears twice is written out twice, as in JSON."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def openapi_yaml_text(app: Any) -> str:
    """`app`'s document in YAML, keys in the JSON document's order."""
    return yaml.dump(app.openapi_schema.to_schema(), Dumper=_Dumper, sort_keys=False, allow_unicode=True)
