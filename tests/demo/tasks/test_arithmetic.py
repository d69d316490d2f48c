"""Arithmetic instances: the working is right, short, column by column, and ends in the answer."""

import random
import re

import pytest

from atomk31.demo.tasks import generate
from atomk31.demo.tasks.arithmetic import MAX_PRODUCT_OPERAND, MAX_SUM_OPERAND, working


@pytest.mark.parametrize(("operation", "a", "b", "answer"), [
    ("add", 347, 589, 936), ("add", 999, 999, 1998), ("add", 5, 5, 10), ("add", 0, 0, 0),
    ("subtract", 902, 38, 864), ("subtract", 100, 99, 1), ("subtract", 7, 7, 0),
    ("multiply", 47, 86, 4042), ("multiply", 7, 6, 42), ("multiply", 47, 0, 0),
    ("multiply", 99, 99, 9801), ("multiply", 10, 10, 100),
])
def test_working_reaches_the_answer(operation, a, b, answer):
    reasoning, value = working(operation, a, b)
    assert value == answer
    # the last number the working writes (without leading zeros) is the answer
    assert int(re.findall(r"\d+", reasoning)[-1]) == answer


def test_working_of_a_sum_keeps_the_digits_found_so_far():
    reasoning, _ = working("add", 347, 589)
    assert reasoning == ("347 + 589: 7 + 9 = 16, so 6 carry 1. 4 + 8 + 1 = 13, so 36 carry 1. "
                         "3 + 5 + 1 = 9, so 936.")


def test_random_problems_are_answered_right():
    rng = random.Random(0)
    for _ in range(500):
        a, b = rng.randint(0, MAX_SUM_OPERAND), rng.randint(0, MAX_SUM_OPERAND)
        assert working("add", a, b)[1] == a + b
        assert working("subtract", max(a, b), min(a, b))[1] == abs(a - b)
        a, b = a % (MAX_PRODUCT_OPERAND + 1), b % (MAX_PRODUCT_OPERAND + 1)
        assert working("multiply", a, b)[1] == a * b


def test_instances_put_the_number_alone_in_content():
    for i in range(50):
        example = generate("arithmetic", "train", 0, i)
        expected = example.expected
        assert example.target["content"] == str(expected["answer"])
        assert str(expected["a"]) in example.messages[-1]["content"]
        assert expected["operation"] != "subtract" or expected["a"] >= expected["b"]
        bound = MAX_PRODUCT_OPERAND if expected["operation"] == "multiply" else MAX_SUM_OPERAND
        assert max(expected["a"], expected["b"]) <= bound
