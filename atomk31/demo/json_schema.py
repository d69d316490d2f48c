"""A small JSON-Schema checker for tool-call arguments: the subset tool definitions use.

Supported keywords: `type` (a name or a list: object, array, string, number, integer, boolean,
null), `properties`, `required`, `additionalProperties` (true/false), `enum`, `items`. Unknown
keywords are ignored, as JSON Schema prescribes. Returns the problems found (empty: valid).
"""

from __future__ import annotations

from typing import Any

_TYPE_CHECKS = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_problems(value: Any, schema: dict[str, Any], where: str = "arguments") -> list[str]:
    """Every way `value` breaks `schema`, each naming its place (`arguments.city`)."""
    problems: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_TYPE_CHECKS.get(name, lambda v: True)(value) for name in names):
            return [f"{where} must be {' or '.join(names)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where} must be one of {schema['enum']}, got {value!r}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{where}.{key} is required")
        for key, item in value.items():
            if key in properties:
                problems += schema_problems(item, properties[key], f"{where}.{key}")
            elif schema.get("additionalProperties", True) is False:
                problems.append(f"{where}.{key} is not a parameter of this tool")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{where}[{i}]")
    return problems
