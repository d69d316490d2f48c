"""Chat: greetings, and the capital of any country of a fixed table.

Replies are short English sentences; a capital reply names the country and its capital. The
table is shared by training and evaluation (a capital is a fact to remember, not to infer), only
the phrasing of the question is drawn per instance.
"""

from __future__ import annotations

import random

from atomk31.demo.tasks.common import Example, assistant, instance_rng, user

FAMILY = "chat"
KINDS = ("greeting", "capital")

# country (as written after "of") -> capital
CAPITALS: dict[str, str] = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "the United Kingdom": "London", "Ireland": "Dublin",
    "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Switzerland": "Bern",
    "Austria": "Vienna", "Poland": "Warsaw", "Czechia": "Prague", "Hungary": "Budapest",
    "Greece": "Athens", "Sweden": "Stockholm", "Norway": "Oslo", "Denmark": "Copenhagen",
    "Finland": "Helsinki", "Iceland": "Reykjavik", "Russia": "Moscow", "Ukraine": "Kyiv",
    "Turkey": "Ankara", "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja",
    "South Africa": "Pretoria", "Morocco": "Rabat", "Ethiopia": "Addis Ababa",
    "Ghana": "Accra", "the United States": "Washington", "Canada": "Ottawa",
    "Mexico": "Mexico City", "Brazil": "Brasilia", "Argentina": "Buenos Aires",
    "Chile": "Santiago", "Peru": "Lima", "Colombia": "Bogota", "Venezuela": "Caracas",
    "Cuba": "Havana", "Japan": "Tokyo", "China": "Beijing", "South Korea": "Seoul",
    "India": "New Delhi", "Pakistan": "Islamabad", "Thailand": "Bangkok",
    "Vietnam": "Hanoi", "Indonesia": "Jakarta", "the Philippines": "Manila",
    "Malaysia": "Kuala Lumpur", "Australia": "Canberra", "New Zealand": "Wellington",
    "Iran": "Tehran", "Iraq": "Baghdad", "Saudi Arabia": "Riyadh", "Israel": "Jerusalem",
    "Mongolia": "Ulaanbaatar", "Nepal": "Kathmandu", "Bangladesh": "Dhaka",
    "Romania": "Bucharest",
}

CAPITAL_QUESTIONS = (
    "What is the capital of {country}?", "What's the capital of {country}?",
    "Which city is the capital of {country}?", "Capital of {country}?",
    "Tell me the capital of {country}.", "Name the capital of {country}.",
    "What city is the capital of {country}?", "Do you know the capital of {country}?",
)
GREETING_REPLIES: dict[str, tuple[str, str]] = {
    # greeting -> (reasoning, reply)
    "Hello!": ("The user greets me.", "Hello! How can I help you today?"),
    "Hello": ("The user greets me.", "Hello! How can I help you today?"),
    "Hi": ("The user greets me.", "Hi! How can I help you today?"),
    "Hi!": ("The user greets me.", "Hi! How can I help you today?"),
    "Hi there!": ("The user greets me.", "Hi there! How can I help you today?"),
    "Hey": ("The user greets me.", "Hey! How can I help you today?"),
    "Hey there": ("The user greets me.", "Hey there! How can I help you today?"),
    "Hello there": ("The user greets me.", "Hello there! How can I help you today?"),
    "Greetings!": ("The user greets me.", "Greetings! How can I help you today?"),
    "Good morning!": ("The user wishes me a good morning.",
                      "Good morning! How can I help you today?"),
    "Good afternoon!": ("The user wishes me a good afternoon.",
                        "Good afternoon! How can I help you today?"),
    "Good evening!": ("The user wishes me a good evening.",
                      "Good evening! How can I help you today?"),
    "How are you?": ("The user asks how I am.",
                     "I'm doing well, thank you! How can I help you today?"),
    "Hello, how are you?": ("The user greets me and asks how I am.",
                            "Hello! I'm doing well, thank you. How can I help you today?"),
    "Hi, how are you doing?": ("The user greets me and asks how I am.",
                               "Hi! I'm doing well, thank you. How can I help you today?"),
    "Hey, what's up?": ("The user greets me.", "Hey! Not much. How can I help you today?"),
}
SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a friendly assistant.",
                  "Answer briefly.")


def capital_example(country: str, rng: random.Random) -> Example:
    capital = CAPITALS[country]
    question = rng.choice(CAPITAL_QUESTIONS).format(country=country)
    answer = f"The capital of {country} is {capital}."
    return Example(family=FAMILY, kind="capital", messages=[user(question)],
                   target=assistant(answer, answer),
                   expected={"capital": capital, "country": country})


def greeting_example(greeting: str) -> Example:
    reasoning, reply = GREETING_REPLIES[greeting]
    return Example(family=FAMILY, kind="greeting", messages=[user(greeting)],
                   target=assistant(reasoning, reply), expected={"greeting": greeting})


def draw_chat(rng: random.Random) -> Example:
    """A greeting (one time in three) or a capital question, without a system prompt."""
    if rng.random() < 1 / 3:
        return greeting_example(rng.choice(sorted(GREETING_REPLIES)))
    return capital_example(rng.choice(sorted(CAPITALS)), rng)


def generate(split: str, seed: int, index: int) -> Example:
    """Instance `index` of the (split, seed) stream, a system prompt in one of six."""
    rng = instance_rng(FAMILY, split, seed, index)
    example = draw_chat(rng)
    if rng.random() < 1 / 6:
        system = {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}
        example = Example(family=example.family, kind=example.kind,
                          messages=[system, *example.messages], target=example.target,
                          expected=example.expected)
    return example
