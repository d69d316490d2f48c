"""CHAT_FORMAT.md §2.6's worked conversation, shared by the server tests (tests/ is on the path)."""

WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]
WEATHER_MESSAGES = [
    {"role": "system", "content": "You are concise."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "reasoning_content": "A greeting.", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Weather in Paris for 2 days?"},
    {"role": "assistant", "reasoning_content": "Need live data.", "content": "", "tool_calls": [
        {"id": "call_7f3a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_7f3a", "content": '{"temp_c": 18}'},
]

# The two generated turns of §2.6, as (text, is_control) segments the model emits.
TOOL_CALL_TURN = [  # (text, is_control) as the model generates it
    ("Need live data.", False), ("<|close|>think<|sep|><|open|>response<|sep|>", True),
    ("<|close|>response<|sep|><|open|>tools<|sep|><|open|>call", True),
    (' tool="get_weather" index="1"', False),
    ("<|sep|><|open|>argument", True), (' key="city" type="string"', False), ("<|sep|>", True),
    ("Paris", False), ("<|close|>argument<|sep|><|open|>argument", True),
    (' key="days" type="number"', False), ("<|sep|>", True), ("2", False),
    ("<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", True),
    ("<|close|>message<|sep|><|end_of_msg|>", True),
]
ANSWER_TURN = [
    ("Tool says 18 C.", False), ("<|close|>think<|sep|><|open|>response<|sep|>", True),
    ("About 18 °C in Paris.", False),
    ("<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", True),
]
