"""Chat instances: greetings get English greetings back; capitals come from the fixed table."""

from atomk31.demo.tasks import generate
from atomk31.demo.tasks.chat import CAPITALS


def test_capital_replies_name_the_country_and_its_capital():
    seen = set()
    for i in range(200):
        example = generate("chat", "train", 0, i)
        if example.kind == "capital":
            country = example.expected["country"]
            assert example.target["content"] == f"The capital of {country} is {CAPITALS[country]}."
            assert country in example.messages[-1]["content"]
            seen.add(country)
        else:
            assert "How can I help you today?" in example.target["content"]
    assert len(seen) >= 40
