"""The system notes the K3 renderer synthesizes from request options (CHAT_FORMAT.md §2.3, §2.5):
tool declarations, the thinking-effort note, tool-choice notes and response-format notes, with the
validation of those options.

Every note is `<|open|>message role="system" type="TYPE"<|sep|>BODY<|close|>message<|sep|>
<|end_of_msg|>`; the bodies are K3's, byte for byte.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from server.xtml import ChatTemplateError, Segment, close_tag, end_of_message, open_tag, \
    text_segments

logger = logging.getLogger(__name__)

TOOL_DECLARE_HEADER = "# Tools\nHere are the available tools, described in JSONSchema.\n\n"
TOOLS_ADDED_HEADER = ("## New Tools Available\n"
                      "The system dynamically extends the toolset via lazy-loading.\n"
                      "You have access to all existing and extended tools.\n"
                      "Here are the specs for the extended tools.\n\n")
EFFORT_NOTE_HEADER = ("`thinking_effort` guides on how much to think in your thinking channel (not "
                      "including the response channel), supported values include `low`, `medium`, "
                      "`high`, and `max`.\n")
CHOICE_REQUIRED = ("The system is invoked with `tool_choice=required`.\n"
                   "You MUST call tools in the next message.")
CHOICE_NONE = ("The system is invoked with `tool_choice=none`.\n"
               "You MUST NOT call any tools in the next message.")
RF_OBJECT = ("The system is invoked with `response_format=json_object`.\nYour response must be raw "
             "JSON data without markdown code blocks (```json) or any additional formatting.")
RF_SCHEMA_HEADER = ("The system is invoked with `response_format=json_schema`.\nYour response must "
                    "be raw JSON data without markdown code blocks (```json) or any additional "
                    "formatting.\nThe JSON data must match the following schema:\n")

# §2.3: the renderer accepts exactly these efforts; §2.5 maps OpenAI's other names onto them.
THINKING_EFFORTS = ("low", "high", "max")
EFFORT_ALIASES = {"minimal": "low", "medium": "high", "xhigh": "max"}
DEFAULT_THINKING_EFFORT = "max"  # §2.3: the official tokenizer's default
NO_THINKING = "none"


def system_note(note_type: str, body: str) -> list[Segment]:
    """One synthesized system message with a `type` attribute (§2.3)."""
    return (open_tag("message", [("role", "system"), ("type", note_type)]) + text_segments(body)
            + close_tag("message") + end_of_message())


def sorted_json(value: Any) -> str:
    """§2.3's TOOLS_JSON / SCHEMA_JSON: keys sorted recursively (arrays keep their order),
    compact separators, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def fenced_json(value: Any) -> str:
    return "```json\n" + sorted_json(value) + "\n```"


# ---- tools ---------------------------------------------------------------------------------------
def validate_tools(tools: Any, where: str) -> list[dict]:
    """Check an OpenAI `tools` list: `[{"type": "function", "function": {"name": str,
    "parameters": {...}?, ...}}, ...]`. `where` names the field in error messages."""
    if not isinstance(tools, list):
        raise ChatTemplateError(f"{where} must be a list of tool definitions, got "
                                f"{type(tools).__name__}")
    for i, tool in enumerate(tools):
        place = f"{where}[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ChatTemplateError(f'{place} must be {{"type": "function", "function": {{...}}}}, '
                                    f"got {short_repr(tool)}")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ChatTemplateError(f"{place}.function must be an object with a 'name', got "
                                    f"{short_repr(function)}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ChatTemplateError(f"{place}.function.name must be a non-empty string, got "
                                    f"{short_repr(name)}")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ChatTemplateError(f"{place}.function.parameters must be a JSON Schema object, "
                                    f"got {type(parameters).__name__}; pass e.g. "
                                    f'{{"type": "object", "properties": {{...}}}}')
    return tools


def tool_declaration(tools: list[dict], is_added: bool = False) -> list[Segment]:
    """TOOL_DECLARE (request `tools`) or TOOLS_ADDED (a system message carrying `tools`), §2.3."""
    header = TOOLS_ADDED_HEADER if is_added else TOOL_DECLARE_HEADER
    return system_note("tool-declare", header + fenced_json(tools))


def resolve_tool_choice(tool_choice: str | dict | None,
                        tools: list[dict] | None) -> tuple[list[dict] | None, str | None]:
    """(tools to declare, tool-choice note body or None), §2.5: `auto`/absent add nothing,
    `required`/`none` add their note, a named function declares only that tool and adds
    CHOICE_REQUIRED."""
    if tool_choice is None or tool_choice == "auto":
        return tools, None
    if tool_choice == "none":
        return tools, CHOICE_NONE
    if tool_choice == "required":
        if not tools:
            raise ChatTemplateError("tool_choice='required' needs a non-empty 'tools' list; "
                                    "pass tools or use tool_choice='auto'")
        return tools, CHOICE_REQUIRED
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise ChatTemplateError('a named tool_choice must be {"type": "function", "function": '
                                    f'{{"name": "..."}}}}, got {short_repr(tool_choice)}')
        chosen = [tool for tool in tools or [] if tool["function"]["name"] == name]
        if not chosen:
            declared = [tool["function"]["name"] for tool in tools or []]
            raise ChatTemplateError(f"tool_choice names the function {name!r}, which is not in "
                                    f"'tools' (declared: {declared}); declare it in 'tools'")
        return chosen[:1], CHOICE_REQUIRED
    raise ChatTemplateError(f"tool_choice must be 'auto', 'none', 'required' or a named function, "
                            f"got {short_repr(tool_choice)}")


# ---- thinking effort -----------------------------------------------------------------------------
def thinking_effort(reasoning_effort: str | None) -> str | None:
    """The renderer's effort for a request's `reasoning_effort`; None means non-thinking mode.

    §2.5: None -> `max`; `low|high|max` pass; `minimal`/`medium`/`xhigh` map to `low`/`high`/`max`;
    `none` turns thinking off (supported by the renderer, refused by Moonshot's API for K3/K3.1,
    so off-distribution: allowed and logged)."""
    if reasoning_effort is None:
        return DEFAULT_THINKING_EFFORT
    if reasoning_effort == NO_THINKING:
        logger.info("reasoning_effort='none': rendering K3's non-thinking prompt, which Moonshot's "
                    "API does not offer for K3/K3.1 (off-distribution)")
        return None
    effort = EFFORT_ALIASES.get(reasoning_effort, reasoning_effort)
    if effort not in THINKING_EFFORTS:
        accepted = [*THINKING_EFFORTS, *EFFORT_ALIASES, NO_THINKING]
        raise ChatTemplateError(f"reasoning_effort must be one of {accepted}, got "
                                f"{short_repr(reasoning_effort)}")
    return effort


def effort_note(effort: str) -> list[Segment]:
    return system_note("thinking-effort", EFFORT_NOTE_HEADER
                       + f"Now the system is invoked with `thinking_effort={effort}`.")


# ---- response format -----------------------------------------------------------------------------
def response_format_note(response_format: dict | None) -> str | None:
    """RF_OBJECT / RF_SCHEMA body for `json_object` / `json_schema`, None for absent or `text`."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return RF_OBJECT
    if kind == "json_schema":
        json_schema = response_format.get("json_schema")
        schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
        if not isinstance(schema, dict):
            raise ChatTemplateError("response_format of type 'json_schema' needs "
                                    "json_schema.schema, a JSON Schema object; got "
                                    f"{short_repr(json_schema)}")
        return RF_SCHEMA_HEADER + fenced_json(schema)
    raise ChatTemplateError("response_format must be {'type': 'text' | 'json_object' | "
                            f"'json_schema', ...}}, got {short_repr(response_format)}")


def short_repr(value: Any, limit: int = 80) -> str:
    """`repr` of a client value, cut so an error message stays readable."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
