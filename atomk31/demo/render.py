"""Task instances as the server sees them: prompt segments and token ids, rendered by the server's
own chat template (`server.chat_template.render_chat`), so training, evaluation and serving agree
byte for byte.

The prompt is the request rendered with the generation prompt (thinking on, effort `max`, the
server's default); the completion is what the reference assistant turn adds after it, ending with
`<|close|>message<|sep|><|end_of_msg|>`.
"""

from __future__ import annotations

from server.chat_template import render_chat

from atomk31.checkpoint import Tokenizer
from atomk31.demo.tasks import Example

Segment = tuple[str, bool]


def prompt_segments(example: Example) -> list[Segment]:
    """The request as the server renders it, ending inside the think channel."""
    return render_chat(example.messages, tools=example.tools)


def conversation_segments(example: Example) -> list[Segment]:
    """The request followed by the reference assistant turn (no generation prompt)."""
    return render_chat(example.messages + [example.target], tools=example.tools,
                       add_generation_prompt=False)


def encode_example(example: Example, tokenizer: Tokenizer) -> tuple[list[int], int]:
    """(token ids of prompt + completion, number of prompt ids).

    The completion is the conversation's ids after the prompt's; the rendered prompt must be a
    prefix of the rendered conversation, which `render_chat` guarantees when the request has no
    trailing note (tool choice, response format).
    """
    prompt = tokenizer.encode_segments(prompt_segments(example))
    full = tokenizer.encode_segments(conversation_segments(example))
    if full[:len(prompt)] != prompt or len(full) == len(prompt):
        raise ValueError(f"the rendered {example.family}/{example.kind} prompt is not a prefix of "
                         f"its rendered conversation; a request option that adds a trailing note "
                         f"cannot be used for training")
    return full, len(prompt)


def corpus_text(example: Example) -> str:
    """The plain text of a rendered conversation (special-token segments left out), for
    learning BPE merges."""
    return "\n".join(text for text, is_special in conversation_segments(example) if not is_special)
