"""AttnRes mixing over depth (MODEL_SPEC §4.3)."""

import torch

from atomk31.reference import attn_res, rms_norm


def test_attn_res_without_blocks_is_the_output_norm_of_the_prefix() -> None:
    prefix, out_weight = torch.randn(5, 16), torch.randn(16)
    torch.testing.assert_close(attn_res([], prefix, None, None, out_weight, 1e-5), rms_norm(prefix, out_weight, 1e-5))


def test_attn_res_with_zero_query_averages_the_candidates() -> None:
    generator = torch.Generator().manual_seed(0)
    blocks = [torch.randn(4, 16, generator=generator) for _ in range(2)]
    prefix, out_weight = torch.randn(4, 16, generator=generator), torch.ones(16)
    mixed = attn_res(blocks, prefix, torch.zeros(16), torch.ones(16), out_weight, 1e-5)
    torch.testing.assert_close(mixed, rms_norm((blocks[0] + blocks[1] + prefix) / 3, out_weight, 1e-5))


def test_attn_res_softmax_is_per_token_over_depth() -> None:
    query, key_norm = torch.zeros(8), torch.ones(8)
    query[0] = 50.0                                            # score = 50 * rms_norm(v)[0]
    block = torch.tensor([[1.0] + [0.0] * 7, [-1.0] + [0.0] * 7])
    prefix = torch.tensor([[-1.0] + [0.0] * 7, [1.0] + [0.0] * 7])
    mixed = attn_res([block], prefix, query, key_norm, torch.ones(8), 1e-5)
    # Token 0 picks the block (positive lane), token 1 picks the prefix: the same vector wins.
    torch.testing.assert_close(mixed[0], mixed[1], rtol=1e-4, atol=1e-4)
    assert float(mixed[0, 0]) > 0
