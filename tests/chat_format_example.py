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
