"""server/output_parser.py: parsing generated K3 token ids (CHAT_FORMAT.md §3-§5).

A random model never emits these streams, so they are built with the tokenizer from markup."""

import json
import logging
import random

import pytest

from atomk31.checkpoint import Tokenizer
from server.chat_template import render_chat
from server.output_parser import ChatDelta, ChatOutputParser, ToolCall, decode_argument, \
    parse_header
from server.xtml import segments_text

# CHAT_FORMAT.md §2.6: the two generated turns of the worked example.
TOOL_TURN = ('Need live data.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
             '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
             '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
             '<|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|>'
             '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')
ANSWER_TURN = ('Tool says 18 C.<|close|>think<|sep|><|open|>response<|sep|>About 18 °C in Paris.'
               '<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>')


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_checkpoint)


def markup_ids(tokenizer: Tokenizer, markup: str) -> list[int]:
    return tokenizer.encode(markup, allow_special=True)


def parse(tokenizer: Tokenizer, ids: list[int], chunk_sizes: list[int] | None = None,
          starts_in_reasoning: bool = True,
          keep_tool_calls: bool = True) -> tuple[ChatOutputParser, list[ChatDelta]]:
    """Feed `ids` in chunks (one at a time by default, everything when chunk_sizes == [])."""
    parser = ChatOutputParser(tokenizer, starts_in_reasoning, keep_tool_calls=keep_tool_calls)
    deltas, start = [], 0
    sizes = iter(chunk_sizes if chunk_sizes is not None else [1] * len(ids))
    while start < len(ids):
        size = next(sizes, len(ids))
        deltas.append(parser.feed(ids[start:start + size]))
        start += size
    deltas.append(parser.finish())
    return parser, deltas


def joined(deltas: list[ChatDelta]) -> tuple[str, str, list[tuple[str, str]]]:
    return ("".join(d.reasoning_content for d in deltas), "".join(d.content for d in deltas),
            [(call.name, call.arguments) for d in deltas for call in d.tool_calls])


# ---- CHAT_FORMAT §2.6 turns ----------------------------------------------------------------------
def test_parser_reasoning_then_content(tokenizer):
    parser, deltas = parse(tokenizer, markup_ids(tokenizer, ANSWER_TURN))
    assert joined(deltas) == ("Tool says 18 C.", "About 18 °C in Paris.", [])
    assert (parser.reasoning_content, parser.content) == ("Tool says 18 C.",
                                                          "About 18 °C in Paris.")
    assert parser.finish_reason_override is None and parser.tool_calls == []


def test_parser_tool_call_turn(tokenizer):
    parser, deltas = parse(tokenizer, markup_ids(tokenizer, TOOL_TURN), chunk_sizes=[])
    assert joined(deltas) == ("Need live data.", "",
                              [("get_weather", '{"city": "Paris", "days": 2}')])
    (call,) = parser.tool_calls
    assert call.id.startswith("call_") and len(call.id) == 5 + 32
    int(call.id[5:], 16)
    assert parser.content is None, "§3.2: content is null when empty and calls exist"
    assert parser.finish_reason_override == "tool_calls"


def test_parser_round_trip_rerenders_the_generated_turn(tokenizer):
    """§2.5: a returned turn passed back whole re-renders to the text the model produced."""
    parser, _ = parse(tokenizer, markup_ids(tokenizer, TOOL_TURN))
    message = {"role": "assistant", "reasoning_content": parser.reasoning_content,
               "content": parser.content,
               "tool_calls": [{"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}}
                              for c in parser.tool_calls]}
    rendered = segments_text(render_chat([message], add_generation_prompt=False))
    generated = '<|open|>think<|sep|>' + TOOL_TURN
    assert rendered.endswith(generated)


# ---- the token limit, stop ids, after the message ------------------------------------------------
def test_parser_reasoning_only_at_length_limit(tokenizer):
    parser, deltas = parse(tokenizer, markup_ids(tokenizer, "Still thinking about"))
    assert joined(deltas) == ("Still thinking about", "", [])
    assert parser.content is None, "§5: cut inside think -> content null"
    assert parser.finish_reason_override is None


def test_parser_stop_id_while_thinking_gives_empty_content(tokenizer):
    parser, deltas = parse(tokenizer, markup_ids(tokenizer, "short<|end_of_msg|>tail"))
    assert joined(deltas) == ("short", "", [])
    assert parser.content == ""


def test_parser_discards_tokens_after_message_end(tokenizer):
    turn = ANSWER_TURN.replace("<|end_of_msg|>", "") + "junk<|open|>response<|sep|>more"
    assert joined(parse(tokenizer, markup_ids(tokenizer, turn))[1])[1] == "About 18 °C in Paris."


def test_parser_non_thinking_prompt_starts_in_response(tokenizer):
    ids = markup_ids(tokenizer, "Hi there.<|close|>response<|sep|><|close|>message<|sep|>[EOS]")
    parser, deltas = parse(tokenizer, ids, starts_in_reasoning=False)
    assert joined(deltas) == ("", "Hi there.", [])
    assert parser.reasoning_content is None and parser.content == "Hi there."


def test_parser_feed_after_finish_raises(tokenizer):
    parser = ChatOutputParser(tokenizer, True)
    parser.finish()
    with pytest.raises(ValueError, match=r"feed\(\) called after finish\(\)"):
        parser.feed([1])


# ---- tool calls ----------------------------------------------------------------------------------
def call_markup(name: str, arguments: str) -> str:
    return f'<|open|>call tool="{name}" index="1"<|sep|>{arguments}<|close|>call<|sep|>'


def argument_markup(key: str, kind: str, value: str) -> str:
    return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{value}<|close|>argument<|sep|>'


def tools_turn(*calls: str) -> str:
    return ("r<|close|>think<|sep|><|open|>response<|sep|>Let me check.<|close|>response<|sep|>"
            "<|open|>tools<|sep|>" + "".join(calls)
            + "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>")


def closer_ends(tokenizer: Tokenizer, ids: list[int], name: str) -> list[int]:
    """Positions of the `<|sep|>` ending each `<|close|>NAME<|sep|>` in `ids`."""
    close_id, sep_id = tokenizer.token_id("<|close|>"), tokenizer.token_id("<|sep|>")
    ends, last_close = [], None
    for i, token_id in enumerate(ids):
        if token_id == close_id:
            last_close = i
        elif token_id == sep_id and last_close is not None:
            if tokenizer.decode(ids[last_close + 1:i]) == name:
                ends.append(i)
            last_close = None
    return ends


def test_parser_each_call_streams_exactly_when_it_closes(tokenizer):
    calls = [call_markup("a", argument_markup("x", "number", "1")),
             call_markup("b", '<|open|>json type="object"<|sep|>{"raw": true}<|close|>json<|sep|>'),
             call_markup("c", "")]
    ids = markup_ids(tokenizer, tools_turn(*calls))
    parser, deltas = parse(tokenizer, ids)
    # deltas[i] answers the feed of ids[i] alone.
    assert [i for i, d in enumerate(deltas) for _ in d.tool_calls] == closer_ends(tokenizer, ids,
                                                                                  "call")
    assert joined(deltas)[2] == [("a", '{"x": 1}'), ("b", '{"raw": true}'), ("c", "{}")]
    assert parser.content == "Let me check."
    assert len({call.id for call in parser.tool_calls}) == 3


@pytest.mark.parametrize("argument, expected", [
    (argument_markup("n", "number", " 2.50 "), {"n": 2.5}),
    (argument_markup("n", "number", "abc"), {"n": "abc"}),
    (argument_markup("s", "string", ' "quoted" 7 '), {"s": ' "quoted" 7 '}),
    ('<|open|>argument key="s"<|sep|>12<|close|>argument<|sep|>', {"s": "12"}),
    (argument_markup("o", "object", '{"k": [1, null]}'), {"o": {"k": [1, None]}}),
    (argument_markup("b", "boolean", "true") + argument_markup("z", "null", "null"),
     {"b": True, "z": None}),
    (argument_markup("k", "string", "first") + argument_markup("k", "string", "last"),
     {"k": "last"}),
    ('<|open|>argument type="string"<|sep|>lost<|close|>argument<|sep|>'
     + argument_markup("kept", "string", "é"), {"kept": "é"}),
    ('<|open|>note<|sep|>ignored<|close|>note<|sep|>' + argument_markup("a", "number", "1"),
     {"a": 1}),
])
def test_parser_decodes_argument_values(tokenizer, argument, expected):
    ids = markup_ids(tokenizer, tools_turn(call_markup("f", argument)))
    (call,) = parse(tokenizer, ids)[0].tool_calls
    assert json.loads(call.arguments) == expected
    assert call.arguments == json.dumps(expected, ensure_ascii=False)


def test_parser_unescapes_tool_name(tokenizer):
    ids = markup_ids(tokenizer, tools_turn(call_markup("a&amp;b&quot;&amp;quot;", "")))
    assert parse(tokenizer, ids)[0].tool_calls[0].name == 'a&b"&quot;'


def test_parser_drops_bad_calls_and_logs_the_raw_turn(tokenizer, caplog):
    nameless = '<|open|>call index="1"<|sep|><|close|>call<|sep|>'
    ids = markup_ids(tokenizer, tools_turn(nameless, call_markup("ok", "")))
    with caplog.at_level(logging.WARNING, logger="server.output_parser"):
        parser, _ = parse(tokenizer, ids)
    assert [call.name for call in parser.tool_calls] == ["ok"]
    assert "a <call> without tool was dropped" in caplog.text
    assert "Let me check." in caplog.text, "the raw turn is logged"


def test_parser_unclosed_call_at_limit_is_dropped(tokenizer):
    turn = tools_turn(call_markup("done", "")) + "x"
    cut = turn[:turn.index("<|close|>tools")] + '<|open|>call tool="half"<|sep|>' + \
        argument_markup("k", "string", "v")
    parser, deltas = parse(tokenizer, markup_ids(tokenizer, cut))
    assert [call.name for call in parser.tool_calls] == ["done"]
    assert parser.finish_reason_override == "tool_calls"


def test_parser_tool_choice_none_drops_calls(tokenizer):
    ids = markup_ids(tokenizer, tools_turn(call_markup("f", "")))
    parser, deltas = parse(tokenizer, ids, keep_tool_calls=False)
    assert joined(deltas)[2] == [] and parser.finish_reason_override is None
    assert parser.content == "Let me check."


# ---- malformed channels (§5) ---------------------------------------------------------------------
@pytest.mark.parametrize("turn, reasoning, content", [
    # A response opener before <|close|>think<|sep|> ends the think channel implicitly.
    ("think<|open|>response<|sep|>answer<|close|>response<|sep|>", "think", "answer"),
    # Unknown top-level channel: body discarded.
    ("r<|close|>think<|sep|><|open|>secret<|sep|>hidden<|close|>secret<|sep|>"
     "<|open|>response<|sep|>shown<|close|>response<|sep|>", "r", "shown"),
    # An element opened inside the response: discarded, never leaked into content.
    ("r<|close|>think<|sep|><|open|>response<|sep|>a<|open|>x<|sep|>hidden<|close|>x<|sep|>b"
     "<|close|>response<|sep|>", "r", "ab"),
    # Text between channels: whitespace dropped, anything else appended to content.
    ("r<|close|>think<|sep|>\n \n<|open|>response<|sep|>a<|close|>response<|sep|> tail \n"
     "<|close|>message<|sep|>", "r", "a tail \n"),
    # A closer for an element that is not open is ignored.
    ("r<|close|>response<|sep|>s<|close|>think<|sep|>", "rs", ""),
])
def test_parser_malformed_channels(tokenizer, turn, reasoning, content):
    ids = markup_ids(tokenizer, turn + "<|end_of_msg|>")
    assert joined(parse(tokenizer, ids)[1])[:2] == (reasoning, content)


# ---- chunking and UTF-8 --------------------------------------------------------------------------
def test_parser_any_chunking_gives_the_same_result(tokenizer):
    turn = ("Ré 思考 🙂<|close|>think<|sep|> <|open|>response<|sep|>Wörld 🌍!"
            "<|close|>response<|sep|>"
            "<|open|>tools<|sep|>" + call_markup("f", argument_markup("k", "string", "ü €"))
            + "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>")
    ids = markup_ids(tokenizer, turn)
    expected = joined(parse(tokenizer, ids, chunk_sizes=[])[1])
    assert expected == ("Ré 思考 🙂", "Wörld 🌍!", [("f", '{"k": "ü €"}')])
    rng = random.Random(0)
    for _ in range(5):
        sizes = [rng.randint(1, 4) for _ in ids]
        assert joined(parse(tokenizer, ids, chunk_sizes=sizes)[1]) == expected
    assert joined(parse(tokenizer, ids)[1]) == expected


def test_parser_holds_back_split_multibyte_characters(tokenizer):
    ids = tokenizer.encode("a🙂")
    assert len(ids) >= 3, "the tiny tokenizer splits the emoji into byte tokens"
    parser = ChatOutputParser(tokenizer, starts_in_reasoning=False)
    texts = [parser.feed([token_id]).content for token_id in ids]
    assert texts[0] == "a" and all(text == "" for text in texts[1:-1]) and texts[-1] == "🙂"
    assert "\ufffd" not in "".join(texts)


def test_parser_finish_flushes_a_cut_character(tokenizer):
    ids = tokenizer.encode("°")[:1]
    parser = ChatOutputParser(tokenizer, starts_in_reasoning=True)
    assert parser.feed(ids).reasoning_content == ""
    assert parser.finish().reasoning_content == "\ufffd"


# ---- helpers -------------------------------------------------------------------------------------
def test_parse_header_and_decode_argument():
    assert parse_header(' call tool="a&quot;b" index="1" junk') == ("call",
                                                                    {"tool": 'a"b', "index": "1"})
    assert parse_header("") == ("", {})
    assert decode_argument(" [1] ", "array") == [1]
    assert decode_argument(" [1] ", None) == " [1] "
    assert ToolCall("i", "n", "{}") == ToolCall(id="i", name="n", arguments="{}")


# ---- issue 19 --------------------------------------------------------------------------------
@pytest.mark.parametrize("turn", [
    "<|open|>think<|sep|>step<|close|>think<|sep|><|open|>response<|sep|>answer"
    "<|close|>response<|sep|>",
    "<|open|>think<|sep|>step<|open|>response<|sep|>answer<|close|>response<|sep|>",
    "st<|open|>think<|sep|>ep<|close|>think<|sep|><|open|>response<|sep|>answer"
    "<|close|>response<|sep|>",
], ids=["whole-pair", "bare-opener", "opener-mid-reasoning"])
def test_parser_repeated_think_opener_keeps_reasoning_and_answer(tokenizer, turn):
    """Issue 19: a think opener inside the think channel (which the generation prompt already
    opened) lost the reasoning as an unknown element; §5: the opener is ignored."""
    ids = markup_ids(tokenizer, turn + "<|close|>message<|sep|><|end_of_msg|>")
    for chunk_sizes in (None, []):
        parser, deltas = parse(tokenizer, ids, chunk_sizes=chunk_sizes)
        assert joined(deltas) == ("step", "answer", [])
        assert (parser.reasoning_content, parser.content) == ("step", "answer")


def test_parser_repeated_think_then_text_is_never_reported_as_reasoning(tokenizer):
    """Issue 19: after a repeated pair, text outside any channel was taken as reasoning."""
    ids = markup_ids(tokenizer, "<|open|>think<|sep|>step<|close|>think<|sep|>answer"
                                "<|close|>message<|sep|><|end_of_msg|>")
    assert joined(parse(tokenizer, ids)[1]) == ("step", "answer", [])


@pytest.mark.parametrize("kind, raw", [
    ("number", "Infinity"), ("number", "-Infinity"), ("number", "NaN"), ("number", "1e999"),
    ("array", "[1, Infinity]"), ("object", '{"a": {"b": [NaN]}}'), ("number", " 1e999 "),
])
def test_parser_non_finite_argument_is_kept_as_raw_text(tokenizer, kind, raw):
    """Issue 19: `{"p": Infinity}` came back, which strict JSON parsers reject; §3.2: the
    value is kept as its raw text, so `arguments` is always strict JSON."""
    argument = argument_markup("p", kind, raw) + argument_markup("q", "number", "2")
    ids = markup_ids(tokenizer, tools_turn(call_markup("f", argument)))
    (call,) = parse(tokenizer, ids)[0].tool_calls
    strict = json.loads(call.arguments, parse_constant=lambda name: pytest.fail(name))
    assert strict == {"p": raw, "q": 2}


def test_parser_logs_a_json_child_dropped_beside_arguments(tokenizer, caplog):
    """Issue 19: a `json` child beside `argument` children was dropped silently."""
    children = ('<|open|>json type="object"<|sep|>{"lost": 1}<|close|>json<|sep|>'
                + argument_markup("k", "string", "v"))
    ids = markup_ids(tokenizer, tools_turn(call_markup("f", children)))
    with caplog.at_level(logging.WARNING, logger="server.output_parser"):
        (call,) = parse(tokenizer, ids)[0].tool_calls
    assert json.loads(call.arguments) == {"k": "v"}
    assert "a <json> child of call 'f' was dropped" in caplog.text
    assert "Let me check." in caplog.text, "the raw turn is logged"


def test_parser_logs_stray_text_inside_a_call(tokenizer, caplog):
    """Issue 19: text between a call's children was dropped silently."""
    children = "stray words" + argument_markup("k", "string", "v")
    ids = markup_ids(tokenizer, tools_turn(call_markup("f", children)))
    with caplog.at_level(logging.WARNING, logger="server.output_parser"):
        (call,) = parse(tokenizer, ids)[0].tool_calls
    assert json.loads(call.arguments) == {"k": "v"}
    assert "discarded stray text inside <call>: 'stray words'" in caplog.text


@pytest.mark.parametrize("engine_reason, cut, expected", [
    ("length", True, "length"), ("stop", False, "tool_calls"), ("length", False, "tool_calls"),
], ids=["cut-after-a-call", "complete", "closed-then-limit"])
def test_parser_finish_reason_is_length_when_a_call_is_cut(tokenizer, engine_reason, cut,
                                                           expected):
    """Issue 19: a complete call followed by a call cut at max_tokens gave `tool_calls`, so the
    client never learned that a call was lost; §3.2: `length`."""
    turn = tools_turn(call_markup("done", ""))
    if cut:
        turn = turn[:turn.index("<|close|>tools")] + '<|open|>call tool="half"<|sep|>'
    elif engine_reason == "length":
        turn = turn.removesuffix("<|end_of_msg|>")
    parser, _ = parse(tokenizer, markup_ids(tokenizer, turn))
    assert [call.name for call in parser.tool_calls] == ["done"]
    assert parser.finish_reason(engine_reason) == expected
