"""How the OpenAPI document describes a msgspec Struct: as Litestar does, plus what msgspec
enforces that Litestar leaves out.

A Struct with `forbid_unknown_fields=True` refuses a field it does not declare, so its schema
says `additionalProperties: false`; without it a generated client (or a fuzzer) may send
fields the server answers with a 400.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

# Litestar's own plugin for Structs; it has no public name, and this one only adds to it.
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.spec import Schema
from litestar.typing import FieldDefinition

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator


class StrictStructSchemaPlugin(StructSchemaPlugin):
    """Litestar's Struct schema, closed (`additionalProperties: false`) where msgspec closes it."""

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: SchemaCreator) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        info = msgspec.inspect.type_info(field_definition.type_)
        if isinstance(info, msgspec.inspect.StructType) and info.forbid_unknown_fields:
            schema.additional_properties = False
        return schema
