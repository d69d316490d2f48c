"""Scoring hand-made replies: right ones score right, wrong and malformed ones wrong."""

import json

import pytest

from atomk31.demo.scoring import last_integer, score_reply
from atomk31.demo.tasks import generate
from atomk31.demo.tasks.arithmetic import make_example as arithmetic_example
from atomk31.demo.tasks.chat import capital_example, greeting_example
from atomk31.demo.tasks.passkey import make_example as passkey_example


def _first(family: str, kind: str):
    return next(e for e in (generate(family, "eval", 0, i) for i in range(200)) if e.kind == kind)


def _call(name: str, arguments) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": text}}


def test_reference_replies_score_right_in_every_family():
    for family in ("arithmetic", "passkey", "tools", "chat"):
        for i in range(30):
            example = generate(family, "eval", 0, i, num_tokens=300)
            assert score_reply(example, example.target).correct, (family, example.target)


@pytest.mark.parametrize(("content", "correct"), [
    ("936", True), ("347 + 589 = 936", True), ("The answer is 936.", True), ("1,936", False),
    ("935", False), ("", False), (None, False),
])
def test_arithmetic_takes_the_last_number_of_the_content(content, correct):
    example = arithmetic_example("add", 347, 589, __import__("random").Random(0))
    assert score_reply(example, {"content": content}).correct is correct


def test_numbers_with_thousands_separators_are_read_whole():
    assert last_integer("so 1,998.") == 1998 and last_integer("no digits") is None


def test_passkey_needs_the_key_as_the_first_five_digit_number():
    example = passkey_example(71432, 1024, 0.3)
    assert score_reply(example, {"content": "The pass key is 71432."}).correct
    assert not score_reply(example, {"content": "The pass key is 71431."}).correct
    assert not score_reply(example, {"content": "714320"}).correct
    assert not score_reply(example, {"content": "It is 12345, or 71432."}).correct


def test_a_call_must_be_schema_valid_and_right():
    example = _first("tools", "call")
    tool, arguments = example.expected["tool"], example.expected["arguments"]
    right = score_reply(example, {"content": None, "tool_calls": [_call(tool, arguments)]})
    assert right.correct and right.checks == {"schema_valid": True, "right_call": True}
    wrong_value = {k: (v + 1 if isinstance(v, (int, float)) else v + "x") for k, v in arguments.items()}
    wrong = score_reply(example, {"tool_calls": [_call(tool, wrong_value)]})
    assert wrong.checks == {"schema_valid": True, "right_call": False}
    extra = score_reply(example, {"tool_calls": [_call(tool, {**arguments, "unit": "c"})]})
    assert extra.checks["schema_valid"] is False
    malformed = score_reply(example, {"tool_calls": [_call(tool, "{not json")]})
    assert malformed.checks == {"schema_valid": False, "right_call": False}
    unknown = score_reply(example, {"tool_calls": [_call("get_horoscope", arguments)]})
    assert unknown.checks["schema_valid"] is False
    none = score_reply(example, {"content": "I would call a tool."})
    assert none.checks == {"schema_valid": False, "right_call": False}


def test_string_arguments_match_ignoring_case_and_spaces():
    example = next(e for e in (generate("tools", "eval", 0, i) for i in range(400))
                   if e.kind == "call" and e.expected["tool"] == "get_weather")
    city = example.expected["arguments"]["city"]
    reply = {"tool_calls": [_call("get_weather", {"city": f" {city.upper()} "})]}
    assert score_reply(example, reply).correct


def test_a_result_answer_must_quote_the_result_and_call_nothing():
    example = _first("tools", "result")
    assert score_reply(example, {"content": example.target["content"]}).checks == {"uses_result": True}
    assert not score_reply(example, {"content": "I don't know."}).correct
    assert not score_reply(example, {"content": example.target["content"],
                                     "tool_calls": [_call("add", {"a": 1, "b": 2})]}).correct


def test_no_tool_needs_text_and_no_call():
    example = _first("tools", "no_tool")
    assert score_reply(example, {"content": "Hello!"}).checks == {"text_answer": True}
    assert not score_reply(example, {"content": "  "}).correct
    assert not score_reply(example, {"content": "", "tool_calls": [_call("add", {})]}).correct


def test_chat_capital_and_greeting():
    import random

    capital = capital_example("Peru", random.Random(0))
    assert score_reply(capital, {"content": "The capital of Peru is Lima."}).correct
    assert not score_reply(capital, {"content": "The capital of Peru is Cusco."}).correct
    greeting = greeting_example("Hello!")
    assert score_reply(greeting, {"content": "Hi! How can I help you today?"}).correct
    assert not score_reply(greeting, {"content": "+-+- 17 17"}).correct


def test_a_reply_that_is_not_a_message_scores_wrong():
    example = generate("chat", "eval", 0, 0)
    score = score_reply(example, None)
    assert not score.correct and "no message object" in score.note
