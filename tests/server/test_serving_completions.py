"""server/serving_completions.py over real HTTP with the official openai client (issue #4)."""

from __future__ import annotations

import httpx
import openai
import pytest

MODEL = "tiny-test"


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def streamed_texts(chunks) -> tuple[dict[int, str], dict[int, str], dict[int, list[str]]]:
    """-> (text, finish reason, logprob tokens) per choice index."""
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    for chunk in chunks:
        for c in chunk.choices:
            assert c.index not in reasons, "a chunk arrived after the choice finished"
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens.setdefault(c.index, []).extend(c.logprobs.tokens if c.logprobs else [])
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
    return texts, reasons, tokens


def test_completion_answers_in_openai_shape(live_server):
    response = client_for(live_server).completions.create(model=MODEL, prompt="Hello world",
                                                          max_tokens=5, seed=3, logprobs=2)
    assert response.object == "text_completion" and response.model == MODEL
    [choice] = response.choices
    assert choice.finish_reason in ("stop", "length")
    assert response.usage.completion_tokens == len(choice.logprobs.tokens) <= 5
    # OpenAI's legacy format: the 2 best and the chosen token itself, so 2 or 3 entries
    for token, logprob, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs,
                                   choice.logprobs.top_logprobs):
        assert 2 <= len(top) <= 3 and top[token] == logprob
    offsets = choice.logprobs.text_offset
    assert offsets == sorted(offsets) and offsets[0] == 0


@pytest.mark.parametrize("prompt", ["The quick brown fox", ["The fox", "Jumps"],
                                    [17, 260, 99], [[17, 260], [5]]],
                         ids=["text", "texts", "token-ids", "token-id-lists"])
def test_completion_stream_delivers_what_non_stream_returns(live_server, prompt):
    client = client_for(live_server)
    request = dict(model=MODEL, prompt=prompt, max_tokens=6, seed=5, n=2, logprobs=0)
    whole = client.completions.create(**request)
    texts, reasons, tokens = streamed_texts(client.completions.create(**request, stream=True))
    num_prompts = 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)
    assert [c.index for c in whole.choices] == list(range(2 * num_prompts))
    for choice in whole.choices:
        assert texts[choice.index] == choice.text
        assert reasons[choice.index] == choice.finish_reason
        assert tokens[choice.index] == choice.logprobs.tokens


def test_completion_same_seed_same_text(live_server):
    client = client_for(live_server)

    def tokens(seed: int) -> list[str]:
        return client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8,
                                         seed=seed, logprobs=0).choices[0].logprobs.tokens

    first = tokens(21)
    assert tokens(21) == first and tokens(22) != first


def test_completion_greedy_is_deterministic_without_seed(live_server):
    client = client_for(live_server)
    runs = [client.completions.create(model=MODEL, prompt=[9, 8, 7], max_tokens=6,
                                      temperature=0).choices[0].text for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completion_stop_string_cuts_the_text(live_server, stream):
    """Find a stop string in an unstopped greedy run, then stop at it: the text ends before
    it, even when the stop string spans tokens (streaming holds the tail back)."""
    client = client_for(live_server)
    request = dict(model=MODEL, prompt="Hello there", max_tokens=12, temperature=0,
                   extra_body={"ignore_eos": True})
    full = client.completions.create(**request).choices[0].text
    stop = full[3:6]
    assert len(stop) == 3, f"the greedy text {full!r} is too short for this test"
    if stream:
        texts, reasons, _ = streamed_texts(client.completions.create(**request, stop=stop,
                                                                     stream=True))
        text, reason = texts[0], reasons[0]
    else:
        choice = client.completions.create(**request, stop=stop).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert (text, reason) == (full[:full.index(stop)], "stop")


def test_completion_echo_prepends_the_prompt(live_server):
    response = client_for(live_server).completions.create(model=MODEL, prompt="Echo me",
                                                          max_tokens=3, echo=True, seed=1)
    assert response.choices[0].text.startswith("Echo me")


def test_completion_stream_usage_comes_last(live_server):
    chunks = list(client_for(live_server).completions.create(
        model=MODEL, prompt="Count", max_tokens=4, seed=2, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_sends_a_chunk_per_step_even_while_text_is_held_back(live_server):
    """A long stop string holds the text back (it may still cut it), yet every step's token
    arrives as a chunk, its text empty until the hold ends, as vLLM streams: clients time
    each token (TTFT, ITL) by the chunks."""
    request = dict(model=MODEL, prompt="Count", max_tokens=7, seed=4, stop=["#" * 40],
                   extra_body={"ignore_eos": True})
    whole = client_for(live_server).completions.create(**request)
    chunks = [c for c in client_for(live_server).completions.create(**request, stream=True)
              if c.choices]
    assert whole.usage.completion_tokens == 7
    assert len(chunks) == 7
    assert chunks[0].choices[0].text == "" and chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_completion_client_leaving_mid_stream_aborts_every_prompt(live_server, pools_free):
    body = {"model": MODEL, "prompt": ["first", "second"], "max_tokens": 3000,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client, \
            client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                break
    pools_free(live_server.engine.engine)


def test_completion_prompts_of_one_request_are_prefilled_in_one_step(live_server):
    """Issue 19: a list of 32 prompts took 7.2 s where 32 concurrent requests took 1.35 s: each
    prompt waited for the previous one's first token. They are now submitted together, so one
    engine step prefills them all."""
    scheduler = live_server.engine.engine.scheduler
    prefill_batches = []
    original = scheduler.schedule

    def schedule():
        scheduled = original()
        prefill_batches.append(sum(item.seq.num_output_tokens == 0 for item in scheduled))
        return scheduled

    scheduler.schedule = schedule
    try:
        response = client_for(live_server).completions.create(
            model=MODEL, prompt=[f"prompt number {i}" for i in range(8)], max_tokens=2)
    finally:
        scheduler.schedule = original
    assert len(response.choices) == 8
    assert max(prefill_batches) == 8, prefill_batches
