"""Arithmetic: sums and differences of operands below 1000, products of operands below 100.

The reasoning channel holds short column-by-column working, lowest digit first, that keeps the
digits found so far as one growing number ("so 36 carry 1"), so every step needs only the two
digits of its column, the carry and the previous step; the content channel holds the number
alone. Differences never go below zero (the larger operand comes first, as in "What is 902 -
38?"). A product of two-digit operands is two one-digit products and a sum, worked the same way.
"""

from __future__ import annotations

import random

from atomk31.demo.tasks.common import Example, assistant, in_split, instance_rng, user

FAMILY = "arithmetic"
OPERATIONS = ("add", "subtract", "multiply")
MAX_SUM_OPERAND = 999
MAX_PRODUCT_OPERAND = 99
SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are good at mental arithmetic.")

PHRASINGS = {
    "add": ("What is {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.",
            "Calculate {a} + {b}.", "{a} + {b} = ?", "What's the sum of {a} and {b}?",
            "Add {a} and {b}.", "How much is {a} + {b}?", "What does {a} + {b} make?"),
    "subtract": ("What is {a} - {b}?", "What is {a} minus {b}?", "Compute {a} - {b}.",
                 "Calculate {a} - {b}.", "{a} - {b} = ?", "Subtract {b} from {a}.",
                 "What's {a} minus {b}?", "How much is {a} - {b}?",
                 "What is the difference between {a} and {b}?"),
    "multiply": ("What is {a} * {b}?", "What is {a} times {b}?", "Compute {a} * {b}.",
                 "Calculate {a} * {b}.", "{a} * {b} = ?", "Multiply {a} by {b}.",
                 "What's the product of {a} and {b}?", "How much is {a} * {b}?",
                 "What is {a} multiplied by {b}?"),
}
SYMBOLS = {"add": "+", "subtract": "-", "multiply": "*"}


def _digit(number: int, position: int) -> int:
    return number // 10**position % 10


def _num_digits(number: int) -> int:
    return len(str(number))


def addition_steps(a: int, b: int) -> tuple[list[str], int]:
    """Column sums of a + b, lowest digit first: (sentences, a + b)."""
    steps, carry, digits = [], 0, ""
    for position in range(max(_num_digits(a), _num_digits(b))):
        x, y = _digit(a, position), _digit(b, position)
        total = x + y + carry
        expression = f"{x} + {y}" + (f" + {carry}" if carry else "")
        digits = str(total % 10) + digits
        carry = total // 10
        steps.append(f"{expression} = {total}, so {digits}" + (f" carry {carry}." if carry else "."))
    if carry:
        digits = str(carry) + digits
        steps.append(f"Carry {carry}, so {digits}.")
    return steps, int(digits)


def subtraction_steps(a: int, b: int) -> tuple[list[str], int]:
    """Column differences of a - b (a >= b), lowest digit first: (sentences, a - b)."""
    assert a >= b, f"subtraction_steps needs a >= b, got {a} - {b}"
    steps, borrow, digits = [], 0, ""
    for position in range(_num_digits(a)):
        x, y = _digit(a, position), _digit(b, position)
        expression = f"{x} - {y}" + (" - 1" if borrow else "")
        if x - borrow >= y:
            difference, next_borrow = x - borrow - y, 0
            step = f"{expression} = {difference}"
        else:
            difference, next_borrow = x - borrow + 10 - y, 1
            step = f"{expression} is below zero, 1{expression} = {difference}"
        digits = str(difference) + digits
        borrow = next_borrow
        steps.append(f"{step}, so {digits}" + (" borrow 1." if borrow else "."))
    value = int(digits)
    if str(value) != digits:
        steps.append(f"Without leading zeros, {value}.")
    return steps, value


def _times_digit_steps(a: int, d: int) -> tuple[list[str], int]:
    """a (one or two digits) times the digit d, lowest digit first."""
    steps, carry, digits = [], 0, ""
    for position in range(_num_digits(a)):
        x = _digit(a, position)
        product = x * d
        step = f"{x} * {d} = {product}"
        if carry:
            step += f", {product} + {carry} = {product + carry}"
        total = product + carry
        digits = str(total % 10) + digits
        carry = total // 10
        steps.append(f"{step}, so {digits}" + (f" carry {carry}." if carry else "."))
    if carry:
        digits = str(carry) + digits
        steps.append(f"Carry {carry}, so {digits}.")
    value = int(digits)
    steps.append(f"So {a} * {d} = {value}.")
    return steps, value


def multiplication_steps(a: int, b: int) -> tuple[list[str], int]:
    """a * b for operands below 100: one product per digit of b, then their sum."""
    units_steps, units = _times_digit_steps(a, _digit(b, 0))
    steps = [f"{a} * {_digit(b, 0)}:"] + units_steps
    if b < 10:
        return steps, units
    tens_digit = _digit(b, 1)
    tens_steps, tens = _times_digit_steps(a, tens_digit)
    steps += [f"{a} * {tens_digit}:"] + tens_steps + [f"Times 10, {tens * 10}."]
    sum_steps, total = addition_steps(units, tens * 10)
    steps += [f"Add {units} + {tens * 10}:"] + sum_steps
    return steps, total


def working(operation: str, a: int, b: int) -> tuple[str, int]:
    """The reasoning text and the answer of `a <op> b`."""
    solve = {"add": addition_steps, "subtract": subtraction_steps,
             "multiply": multiplication_steps}[operation]
    steps, answer = solve(a, b)
    return f"{a} {SYMBOLS[operation]} {b}: " + " ".join(steps), answer


def _operand(rng: random.Random, maximum: int) -> int:
    """Mostly full-width operands, some shorter ones (so every column count is seen)."""
    num_digits = len(str(maximum))
    width = rng.choices(range(1, num_digits + 1), weights=[1] * (num_digits - 1) + [4])[0]
    return rng.randint(0 if width == 1 else 10 ** (width - 1), 10**width - 1)


def draw_problem(rng: random.Random) -> tuple[str, int, int]:
    operation = rng.choice(OPERATIONS)
    maximum = MAX_PRODUCT_OPERAND if operation == "multiply" else MAX_SUM_OPERAND
    a, b = _operand(rng, maximum), _operand(rng, maximum)
    if operation == "subtract" and a < b:
        a, b = b, a
    return operation, a, b


def make_example(operation: str, a: int, b: int, rng: random.Random) -> Example:
    question = rng.choice(PHRASINGS[operation]).format(a=a, b=b)
    messages = [user(question)]
    if rng.random() < 0.15:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    reasoning, answer = working(operation, a, b)
    return Example(family=FAMILY, kind=operation, messages=messages,
                   target=assistant(reasoning, str(answer)),
                   expected={"answer": answer, "operation": operation, "a": a, "b": b})


def generate(split: str, seed: int, index: int) -> Example:
    """Instance `index` of the (split, seed) stream; its problem key lies in `split`."""
    rng = instance_rng(FAMILY, split, seed, index)
    while True:
        operation, a, b = draw_problem(rng)
        if in_split(f"{operation}:{a}:{b}", split):
            return make_example(operation, a, b, rng)
