"""Tool calls in the K3 format: pick the right tool, fill its arguments, use its result.

Three kinds of instance, each with one to four of the five tools of tool_definitions.py offered
in random order:
* `call`: a request one offered tool serves ("What's the weather in Lima?") -> that call with
  the right JSON arguments (reasoning says which tool and why; the content is empty);
* `result`: the same conversation continued with the call and a made-up tool result -> an answer
  that quotes the result;
* `no_tool`: no offered tool fits -> a plain-text answer: a greeting or capital question answered
  as in the chat family, or a request for a tool that is not offered, politely declined.
Instance keys are the request text (and the result), so eval requests never occur in training;
facts such as a city's time zone are shared, as a fact table is.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Callable

from atomk31.demo.tasks.chat import draw_chat
from atomk31.demo.tasks.common import Example, assistant, in_split, instance_rng, user
from atomk31.demo.tasks.tool_definitions import (
    CITY_TIMEZONES, CONDITIONS, COUNTRIES, CURRENCIES, TOOLS, json_number, number_text,
)

FAMILY = "tools"
KINDS = ("call", "result", "no_tool")
KIND_WEIGHTS = (0.4, 0.35, 0.25)


@dataclass(frozen=True)
class Request:
    """One request a tool serves: its text, the call, and what to say with or without it."""

    tool: str
    text: str
    arguments: dict[str, Any]
    call_reasoning: str
    decline_reasoning: str
    decline: str
    answer: Callable[[random.Random], tuple[dict[str, Any], str, str, list[str]]]
    # answer(rng) -> (tool result, reasoning, reply, evidence: strings the reply must contain)


def _weather(rng: random.Random) -> Request:
    city = rng.choice(sorted(CITY_TIMEZONES))
    text = rng.choice(("What's the weather in {c}?", "What is the weather like in {c} right now?",
                       "How is the weather in {c} today?", "Tell me the current weather in {c}.",
                       "Weather in {c}?", "Is it warm in {c} today?")).format(c=city)

    def answer(rng: random.Random):
        degrees, condition = rng.randint(-10, 40), rng.choice(CONDITIONS)
        result = {"city": city, "temperature_c": degrees, "condition": condition}
        return (result, f"The tool says {degrees} degrees Celsius and {condition}.",
                f"It is {degrees} degrees Celsius and {condition} in {city}.",
                [str(degrees), condition])
    return Request("get_weather", text, {"city": city},
                   f"The user asks for the weather in {city}. The get_weather tool gives it.",
                   f"The user asks for the weather in {city}, but no tool gives the weather.",
                   f"Sorry, I can't check the weather in {city} with the tools I have.", answer)


def _time(rng: random.Random) -> Request:
    city = rng.choice(sorted(CITY_TIMEZONES))
    timezone = CITY_TIMEZONES[city]
    text = rng.choice(("What time is it in {c}?", "What's the local time in {c}?",
                       "Tell me the current time in {c}.", "What is the time in {c} now?",
                       "Time in {c}?")).format(c=city)

    def answer(rng: random.Random):
        time = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        return ({"timezone": timezone, "time": time}, f"The tool says it is {time}.",
                f"It is {time} in {city}.", [time])
    return Request("get_time", text, {"timezone": timezone},
                   f"The user asks for the time in {city}, which is in the {timezone} time zone. "
                   f"The get_time tool gives it.",
                   f"The user asks for the time in {city}, but no tool gives the time.",
                   f"Sorry, I can't look up the time in {city} with the tools I have.", answer)


def _amount(rng: random.Random) -> float:
    """An integer (mostly) or an amount with cents."""
    if rng.random() < 0.7:
        return float(rng.randint(0, 9999))
    return rng.randint(1, 99999) / 100


def _add(rng: random.Random) -> Request:
    a, b = _amount(rng), _amount(rng)
    a_text, b_text = number_text(a), number_text(b)
    text = rng.choice(("Add {a} and {b}.", "Use the add tool to sum {a} and {b}.",
                       "Please add {a} to {b}.", "What is {a} plus {b}? Use the tool.",
                       "Sum up {a} and {b} for me.")).format(a=a_text, b=b_text)

    def answer(rng: random.Random):
        total = number_text(round(a + b, 2))
        return ({"result": json_number(round(a + b, 2))}, f"The tool says the sum is {total}.",
                f"{a_text} plus {b_text} is {total}.", [total])
    return Request("add", text, {"a": json_number(a), "b": json_number(b)},
                   f"The user wants {a_text} plus {b_text}. The add tool adds two numbers.",
                   f"The user wants {a_text} plus {b_text}, but no tool adds numbers.",
                   "Sorry, I don't have a tool to add numbers right now.", answer)


def _convert(rng: random.Random) -> Request:
    source, target = rng.sample(sorted(CURRENCIES), 2)
    amount = float(rng.randint(1, 5000)) if rng.random() < 0.8 else rng.randint(100, 99999) / 100
    amount_text = number_text(amount)
    if rng.random() < 0.5:
        text = rng.choice(("Convert {n} {s} to {t}.", "What is {n} {s} in {t}?",
                           "How much is {n} {s} in {t}?")).format(n=amount_text, s=source, t=target)
    else:
        text = rng.choice(("How many {t} is {n} {s}?", "Convert {n} {s} into {t}.")).format(
            n=amount_text, s=CURRENCIES[source][0], t=CURRENCIES[target][0])

    def answer(rng: random.Random):
        rate = CURRENCIES[target][1] / CURRENCIES[source][1] * rng.uniform(0.97, 1.03)
        converted = number_text(round(amount * rate, 2))
        return ({"amount": json_number(round(amount * rate, 2)), "currency": target},
                f"The tool says {converted} {target}.",
                f"{amount_text} {source} is {converted} {target}.", [converted])
    return Request("convert_currency", text, {"amount": json_number(amount), "from": source,
                                               "to": target},
                   f"The user wants {amount_text} {source} in {target}. The convert_currency tool "
                   f"converts money.",
                   f"The user wants {amount_text} {source} in {target}, but no tool converts "
                   f"money.", "Sorry, I can't convert currencies with the tools I have.", answer)


def _population(rng: random.Random) -> Request:
    country = rng.choice(COUNTRIES)
    name = country.removeprefix("the ")
    text = rng.choice(("What is the population of {c}?", "How many people live in {c}?",
                       "Population of {c}?", "How big is the population of {c}?")).format(c=country)

    def answer(rng: random.Random):
        population = rng.randint(100_000, 300_000_000)
        return ({"country": name, "population": population},
                f"The tool says {population} people.",
                f"The population of {country} is {population}.", [str(population)])
    return Request("get_population", text, {"country": name},
                   f"The user asks for the population of {country}. The get_population tool "
                   f"gives it.",
                   f"The user asks for the population of {country}, but no tool gives "
                   f"populations.", f"Sorry, I can't look up the population of {country} with the "
                   f"tools I have.", answer)


REQUESTS: dict[str, Callable[[random.Random], Request]] = {
    "get_weather": _weather, "get_time": _time, "add": _add, "convert_currency": _convert,
    "get_population": _population,
}


def _offered(rng: random.Random, include: str | None, exclude: str | None) -> list[dict]:
    """One to four tools in random order, with `include` among them and `exclude` not."""
    others = [name for name in sorted(TOOLS) if name not in (include, exclude)]
    count = rng.randint(1, 4) - (include is not None)
    names = rng.sample(others, min(count, len(others))) + ([include] if include else [])
    rng.shuffle(names)
    return [TOOLS[name] for name in names]


def _call(request: Request, rng: random.Random) -> dict[str, Any]:
    call_id = "call_" + "".join(rng.choice("0123456789abcdef") for _ in range(24))
    return {"id": call_id, "type": "function",
            "function": {"name": request.tool, "arguments": json.dumps(request.arguments)}}


def _call_example(rng: random.Random, split: str) -> Example | None:
    request = REQUESTS[rng.choice(sorted(REQUESTS))](rng)
    if not in_split(f"call:{request.text}", split):
        return None
    call = _call(request, rng)
    return Example(family=FAMILY, kind="call", messages=[user(request.text)],
                   tools=_offered(rng, request.tool, None),
                   target=assistant(request.call_reasoning, "", [call]),
                   expected={"tool": request.tool, "arguments": request.arguments})


def _result_example(rng: random.Random, split: str) -> Example | None:
    request = REQUESTS[rng.choice(sorted(REQUESTS))](rng)
    result, reasoning, reply, evidence = request.answer(rng)
    if not in_split(f"result:{request.text}:{json.dumps(result)}", split):
        return None
    call = _call(request, rng)
    messages = [user(request.text), assistant(request.call_reasoning, "", [call]),
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}]
    return Example(family=FAMILY, kind="result", messages=messages,
                   tools=_offered(rng, request.tool, None), target=assistant(reasoning, reply),
                   expected={"evidence": evidence})


def _no_tool_example(rng: random.Random, split: str) -> Example | None:
    if rng.random() < 0.5:
        chat = draw_chat(rng)
        text, target = chat.messages[-1]["content"], chat.target
        tools = _offered(rng, None, None)
        if chat.kind == "capital":
            tools = [t for t in tools if t["function"]["name"] != "get_population"] or \
                [TOOLS["get_weather"]]
    else:
        request = REQUESTS[rng.choice(sorted(REQUESTS))](rng)
        text, target = request.text, assistant(request.decline_reasoning, request.decline)
        tools = _offered(rng, None, request.tool)
    if not in_split(f"no_tool:{text}", split):
        return None
    return Example(family=FAMILY, kind="no_tool", messages=[user(text)], tools=tools,
                   target=target, expected={})


def generate(split: str, seed: int, index: int) -> Example:
    """Instance `index` of the (split, seed) stream; its key lies in `split`."""
    rng = instance_rng(FAMILY, split, seed, index)
    build = {"call": _call_example, "result": _result_example, "no_tool": _no_tool_example}
    while True:
        kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
        example = build[kind](rng, split)
        if example is not None:
            return example
