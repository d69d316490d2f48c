"""The tools the tool-call family offers (OpenAI function objects) and the facts behind them.

Five tools with JSON-Schema parameters: `get_weather(city)`, `get_time(timezone)`, `add(a, b)`,
`convert_currency(amount, from, to)` and `get_population(country)`. Tool results are made up per
instance (a made-up temperature, time, population), so an answer can only be right by reading the
result.
"""

from __future__ import annotations

from typing import Any

from atomk31.demo.tasks.chat import CAPITALS


def _function(name: str, description: str, properties: dict[str, Any],
              required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": _function(
        "get_weather", "Get the current weather in a city.",
        {"city": {"type": "string", "description": "City name, e.g. Paris"}}, ["city"]),
    "get_time": _function(
        "get_time", "Get the current local time in a time zone.",
        {"timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Paris"}},
        ["timezone"]),
    "add": _function(
        "add", "Add two numbers.",
        {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"]),
    "convert_currency": _function(
        "convert_currency", "Convert an amount of money from one currency to another.",
        {"amount": {"type": "number"},
         "from": {"type": "string", "description": "ISO 4217 code, e.g. USD"},
         "to": {"type": "string", "description": "ISO 4217 code, e.g. EUR"}},
        ["amount", "from", "to"]),
    "get_population": _function(
        "get_population", "Get the population of a country.",
        {"country": {"type": "string", "description": "Country name, e.g. Japan"}},
        ["country"]),
}

# city -> IANA time zone
CITY_TIMEZONES: dict[str, str] = {
    "Paris": "Europe/Paris", "Berlin": "Europe/Berlin", "London": "Europe/London",
    "Madrid": "Europe/Madrid", "Rome": "Europe/Rome", "Oslo": "Europe/Oslo",
    "Stockholm": "Europe/Stockholm", "Vienna": "Europe/Vienna", "Warsaw": "Europe/Warsaw",
    "Athens": "Europe/Athens", "Lisbon": "Europe/Lisbon", "Dublin": "Europe/Dublin",
    "Moscow": "Europe/Moscow", "Istanbul": "Europe/Istanbul", "Cairo": "Africa/Cairo",
    "Nairobi": "Africa/Nairobi", "Lagos": "Africa/Lagos", "Johannesburg": "Africa/Johannesburg",
    "Dubai": "Asia/Dubai", "Mumbai": "Asia/Kolkata", "Delhi": "Asia/Kolkata",
    "Bangkok": "Asia/Bangkok", "Singapore": "Asia/Singapore", "Hong Kong": "Asia/Hong_Kong",
    "Shanghai": "Asia/Shanghai", "Beijing": "Asia/Shanghai", "Seoul": "Asia/Seoul",
    "Tokyo": "Asia/Tokyo", "Sydney": "Australia/Sydney", "Melbourne": "Australia/Melbourne",
    "Auckland": "Pacific/Auckland", "Honolulu": "Pacific/Honolulu",
    "Los Angeles": "America/Los_Angeles", "Denver": "America/Denver",
    "Chicago": "America/Chicago", "New York": "America/New_York",
    "Toronto": "America/Toronto", "Mexico City": "America/Mexico_City",
    "Lima": "America/Lima", "Bogota": "America/Bogota", "Santiago": "America/Santiago",
    "Buenos Aires": "America/Argentina/Buenos_Aires", "Sao Paulo": "America/Sao_Paulo",
}
# currency code -> (name used in requests, units per US dollar)
CURRENCIES: dict[str, tuple[str, float]] = {
    "USD": ("US dollars", 1.0), "EUR": ("euros", 0.92), "GBP": ("British pounds", 0.79),
    "JPY": ("Japanese yen", 151.0), "CHF": ("Swiss francs", 0.9),
    "CAD": ("Canadian dollars", 1.36), "AUD": ("Australian dollars", 1.52),
    "CNY": ("Chinese yuan", 7.2), "INR": ("Indian rupees", 83.0),
    "MXN": ("Mexican pesos", 17.0),
}
CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear", "stormy")
COUNTRIES = tuple(sorted(CAPITALS))


def number_text(value: float) -> str:
    """A number as the tool results and answers write it: integers bare, else at most two
    decimals with trailing zeros dropped."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def json_number(value: float) -> int | float:
    """The JSON value of `number_text(value)` (an int when integral)."""
    text = number_text(value)
    return int(text) if "." not in text else float(text)
