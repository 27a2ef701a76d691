"""How the OpenAPI document describes a msgspec Struct: as Litestar does, plus what msgspec
enforces that Litestar leaves out: `additionalProperties: false` for `forbid_unknown_fields`,
bounds on union members, late-decoded fields' own schemas. A Struct states what decoding cannot
in class attributes, each written into its schema: `one_of_required`, `schema_required`,
`required_by_tag`, `schema_properties` and `schema_at_most_one` (see `StrictStructSchemaPlugin`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, get_args, get_origin, get_type_hints

import msgspec

# Litestar's own plugin for Structs; it has no public name, and this one only adds to it.
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.spec import OpenAPIType, Reference, Schema
from litestar.typing import FieldDefinition

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator

# The JSON Schema keywords that bound a value; a field whose msgspec schema has one Litestar's
# lacks is described by msgspec's schema.
BOUNDS = frozenset(
    {
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "pattern",
        "minProperties",
        "maxProperties",
    }
)


def _bounds(node: Any) -> list[tuple[str, Any]]:
    """Every bound in a schema, wherever it sits (compared as numbers: 1 and 1.0 are one bound)."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in BOUNDS:
                found.append((key, float(value) if isinstance(value, int | float) else value))
            found.extend(_bounds(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_bounds(value))
    return found


def msgspec_schema(annotation: Any) -> dict[str, Any]:
    """msgspec's JSON schema of `annotation`, its Structs referred to as document components
    (Litestar names a Struct's component after the class, as msgspec does)."""
    schema = msgspec.json.schema(annotation, ref_template="#/components/schemas/{name}")
    schema.pop("$defs", None)
    return schema


def _not_null(schema: Schema | Reference) -> Schema | Reference:
    """`schema` without its null alternative (an optional field's `oneOf: [T, null]` as T): a
    field the server needs is not satisfied by null."""
    if isinstance(schema, Schema) and schema.one_of:
        kept = [s for s in schema.one_of if not (isinstance(s, Schema) and s.type == OpenAPIType.NULL)]
        if len(kept) == 1:
            return kept[0]
    if isinstance(schema, Schema) and isinstance(schema.type, list) and OpenAPIType.NULL in schema.type:
        # An optional enum: `type: [null, string], enum: [..., null]`.
        types = [t for t in schema.type if t != OpenAPIType.NULL]
        enum = [v for v in schema.enum if v is not None] if schema.enum is not None else None
        return Schema(type=types[0] if len(types) == 1 else types, enum=enum, description=schema.description)
    return schema


class StrictStructSchemaPlugin(StructSchemaPlugin):
    """Litestar's Struct schema, closed where msgspec closes it and with the bounds it keeps."""

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: SchemaCreator) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        info = msgspec.inspect.type_info(field_definition.type_)
        if not isinstance(info, msgspec.inspect.StructType):
            return schema
        if info.forbid_unknown_fields:
            schema.additional_properties = False
        # A Struct that takes exactly one of some fields (a bundle task's surface) names them.
        one_of: tuple[str, ...] = getattr(field_definition.type_, "one_of_required", ())
        if one_of:
            schema.one_of = [Schema(required=[name]) for name in one_of]
        properties = schema.properties or {}
        needed: tuple[str, ...] = getattr(field_definition.type_, "schema_required", ())
        if needed:
            schema.required = sorted({*(schema.required or []), *needed})
            for name in needed:
                properties[name] = _not_null(properties[name])
        tagged: tuple[str, dict[str, str]] | None = getattr(field_definition.type_, "required_by_tag", None)
        if tagged is not None:
            tag, fields = tagged
            schema.one_of = [
                Schema(
                    properties={tag: Schema(const=value), field: _not_null(properties[field])},
                    required=[tag, field],
                )
                for value, field in fields.items()
            ]
        hints = get_type_hints(field_definition.type_, include_extras=True)
        for field in info.fields:
            ours = (schema.properties or {}).get(field.encode_name)
            if ours is None or isinstance(ours, Reference):
                continue
            theirs = msgspec_schema(hints[field.name])
            if get_origin(hints[field.name]) is Annotated and get_args(hints[field.name])[0] is Any:
                schema.properties[field.encode_name] = theirs  # type: ignore[assignment,index]  # said in full
                continue
            if "$ref" in theirs:
                schema.properties[field.encode_name] = Reference(ref=theirs["$ref"])  # type: ignore[index]
                continue
            if set(_bounds(theirs)) - set(_bounds(ours.to_schema())):
                theirs.update({k: v for k, v in ours.to_schema().items() if k in ("default", "description")})
                schema.properties[field.encode_name] = theirs  # type: ignore[assignment,index]  # a dict is written out as is
        for name, written in getattr(field_definition.type_, "schema_properties", {}).items():
            properties[name] = written
        exclusive: tuple[str, ...] = getattr(field_definition.type_, "schema_at_most_one", ())
        if exclusive:
            null = Schema(type=OpenAPIType.NULL)
            schema.one_of = [Schema(properties=dict.fromkeys(exclusive, null))] + [
                Schema(
                    required=[name],
                    properties={
                        other: null if other != name else _not_null(properties[name]) for other in exclusive
                    },
                )
                for name in exclusive
            ]
        return schema
