"""Tool-call instances: the right tool is offered among others, the call fits its schema, the
answer quotes the result, and no_tool instances offer no tool that fits."""

import json

from atomk31.demo.json_schema import schema_problems
from atomk31.demo.tasks import generate
from atomk31.demo.tasks.tool_definitions import TOOLS, number_text


def _examples(kind: str, count: int = 60):
    found = [e for e in (generate("tools", "train", 0, i) for i in range(count * 4))
             if e.kind == kind]
    assert len(found) >= count // 2
    return found


def test_calls_name_an_offered_tool_with_schema_valid_arguments():
    offered_counts = set()
    for example in _examples("call"):
        (call,) = example.target["tool_calls"]
        names = [t["function"]["name"] for t in example.tools]
        offered_counts.add(len(names))
        assert call["function"]["name"] == example.expected["tool"] in names
        arguments = json.loads(call["function"]["arguments"])
        assert arguments == example.expected["arguments"]
        assert schema_problems(arguments, TOOLS[example.expected["tool"]]["function"]["parameters"]) == []
        assert example.target["content"] == ""
    assert offered_counts == {1, 2, 3, 4}


def test_result_answers_quote_the_tool_result():
    for example in _examples("result"):
        assert [m["role"] for m in example.messages] == ["user", "assistant", "tool"]
        assert example.messages[2]["tool_call_id"] == example.messages[1]["tool_calls"][0]["id"]
        result = json.loads(example.messages[2]["content"])
        for fact in example.expected["evidence"]:
            assert fact in example.target["content"]
            assert fact in json.dumps(result) or fact in {str(v) for v in result.values()}


def test_no_tool_instances_answer_in_text():
    for example in _examples("no_tool"):
        assert "tool_calls" not in example.target and example.target["content"]
        request = example.messages[-1]["content"]
        names = {t["function"]["name"] for t in example.tools}
        if "weather" in request:
            assert "get_weather" not in names


def test_numbers_are_written_without_float_noise():
    assert number_text(12.0) == "12" and number_text(0.1 + 0.2) == "0.3"
    assert number_text(1234.5) == "1234.5"
