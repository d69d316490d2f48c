"""Training sequences are the server's prompts followed by the reference turn."""

from atomk31.demo.render import encode_example, prompt_segments
from atomk31.demo.tasks import generate


def test_completion_follows_the_server_prompt_and_ends_the_message(demo_tokenizer):
    end = [demo_tokenizer.token_id(name) for name in ("<|close|>", "<|sep|>", "<|end_of_msg|>")]
    for family in ("arithmetic", "tools", "chat"):
        example = generate(family, "train", 0, 1)
        ids, num_prompt = encode_example(example, demo_tokenizer)
        assert ids[:num_prompt] == demo_tokenizer.encode_segments(prompt_segments(example))
        assert ids[-4:] == [end[0], demo_tokenizer.encode("message")[0], end[1], end[2]]
        completion = demo_tokenizer.decode(ids[num_prompt:])
        assert completion.startswith(example.target["reasoning_content"] + "<|close|>think<|sep|>")


def test_tool_calls_are_rendered_in_the_k3_format(demo_tokenizer):
    example = next(e for e in (generate("tools", "train", 0, i) for i in range(50))
                   if e.kind == "call")
    ids, num_prompt = encode_example(example, demo_tokenizer)
    completion = demo_tokenizer.decode(ids[num_prompt:])
    assert f'<|open|>tools<|sep|><|open|>call tool="{example.expected["tool"]}" index="1"<|sep|>' \
        in completion
