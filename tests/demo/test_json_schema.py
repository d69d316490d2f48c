"""The JSON-Schema subset that checks tool-call arguments."""

from atomk31.demo.json_schema import schema_problems

SCHEMA = {"type": "object", "properties": {"amount": {"type": "number"},
                                           "to": {"type": "string", "enum": ["EUR", "USD"]},
                                           "tags": {"type": "array", "items": {"type": "integer"}}},
          "required": ["amount", "to"], "additionalProperties": False}


def test_valid_arguments_have_no_problems():
    assert schema_problems({"amount": 3.5, "to": "EUR", "tags": [1, 2]}, SCHEMA) == []


def test_each_problem_is_named_by_its_place():
    problems = schema_problems({"amount": "3", "to": "GBP", "tags": [1, "x"], "note": 1}, SCHEMA)
    assert problems == ["arguments.amount must be number, got str",
                        "arguments.to must be one of ['EUR', 'USD'], got 'GBP'",
                        "arguments.tags[1] must be integer, got str",
                        "arguments.note is not a parameter of this tool"]
    assert schema_problems({"to": "EUR"}, SCHEMA) == ["arguments.amount is required"]
    assert schema_problems([1], SCHEMA) == ["arguments must be object, got list"]


def test_booleans_are_not_numbers():
    assert schema_problems({"amount": True, "to": "EUR"}, SCHEMA) == \
        ["arguments.amount must be number, got bool"]
