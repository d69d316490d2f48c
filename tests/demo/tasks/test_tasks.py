"""The task registry: instances are deterministic per (family, split, seed, index), varied, and
train and eval never share an instance key."""

import json

import pytest

from atomk31.demo.tasks import FAMILIES, check_families, generate
from atomk31.demo.tasks.common import is_held_out


def _request(example) -> str:
    return json.dumps([example.messages, example.tools], sort_keys=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_is_deterministic_per_seed_and_index(family):
    first = [generate(family, "train", 3, i, num_tokens=400) for i in range(5)]
    again = [generate(family, "train", 3, i, num_tokens=400) for i in range(5)]
    assert first == again
    other_seed = [generate(family, "train", 4, i, num_tokens=400) for i in range(5)]
    assert [_request(e) for e in first] != [_request(e) for e in other_seed]


@pytest.mark.parametrize("family", FAMILIES)
def test_streams_are_varied(family):
    requests = {_request(generate(family, "train", 0, i, num_tokens=400)) for i in range(40)}
    assert len(requests) >= 30, f"{family}: only {len(requests)} distinct requests in 40"


@pytest.mark.parametrize("family", ["arithmetic", "passkey"])
def test_train_and_eval_keys_are_disjoint(family):
    def key(example):
        e = example.expected
        return e["passkey"] if family == "passkey" else f"{e['operation']}:{e['a']}:{e['b']}"

    train = {key(generate(family, "train", 0, i, num_tokens=300)) for i in range(300)}
    held_out = {key(generate(family, "eval", 0, i, num_tokens=300)) for i in range(100)}
    assert not train & held_out
    prefix = "passkey:" if family == "passkey" else ""
    assert all(is_held_out(prefix + k) for k in held_out)


def test_tool_requests_of_eval_never_occur_in_training():
    train = {_request(generate("tools", "train", 0, i)) for i in range(400)}
    assert not train & {_request(generate("tools", "eval", 0, i)) for i in range(100)}


def test_unknown_family_and_split_are_named():
    with pytest.raises(ValueError, match=r"unknown task families \['poetry'\]; choose from "
                                         r"arithmetic, passkey, tools, chat"):
        check_families(["arithmetic", "poetry"])
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'eval'\), got 'test'"):
        generate("chat", "test", 0, 0)
    with pytest.raises(ValueError, match="instance index must be >= 0, got -1"):
        generate("chat", "train", 0, -1)
