"""topk_triton against topk_positions_torch / positions_to_slots_torch: exactly equal (the
selected set in ascending position order, ties to the lower position, -0.0 = +0.0, -1
padding), under Triton's interpreter on the CPU and on a GPU at real sizes (k = 2048, rows up
to 1M)."""

import pytest
import torch

from atomk31.ops.topk import positions_to_slots_torch, topk_positions_torch
from atomk31.triton_kernels.topk_config import TopkConfig

KERNEL_MODULE = "atomk31.triton_kernels.topk"


def make_scores(num_rows, length, levels, seed, device="cpu"):
    """levels 0: distinct normal scores; levels n: integers in [-1, n-1) (many ties), with some
    -0.0, +0.0 and -inf sprinkled in."""
    generator = torch.Generator().manual_seed(seed)
    if levels == 0:
        scores = torch.randn(num_rows, length, generator=generator)
    else:
        scores = torch.randint(0, levels, (num_rows, length), generator=generator).float() - 1.0
    if length > 8:
        scores[:, 1::7] = -0.0
        scores[:, 2::11] = 0.0
        scores[:, 3::13] = -torch.inf
    return scores.to(device)


CASES = {
    # name: (Nq, L, k, levels, lengths)
    "ties_L300_k40": (4, 300, 40, 3, [300, 1, 170, 0]),
    "distinct_L700_k64": (3, 700, 64, 0, [700, 64, 65]),
    "k_above_L_k50_L33": (3, 33, 50, 4, [33, 17, 1]),
    "k1_L1": (1, 1, 1, 2, [1]),
    "all_equal_L500_k100": (2, 500, 100, 1, [500, 99]),
    "just_over_k_L129_k128": (2, 129, 128, 0, [129, 128]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_topk_triton_interpreter_matches_torch(interpreted, case):
    num_rows, length, k, levels, lengths = CASES[case]
    scores = make_scores(num_rows, length, levels, seed=len(case))
    lengths = torch.tensor(lengths, dtype=torch.int64)
    # Three programs per row share each row's group maxima and candidate buffer.
    got = interpreted.topk_triton(scores, k, lengths, config=TopkConfig(programs_per_row=3))
    assert got.dtype == torch.int32
    assert torch.equal(got, topk_positions_torch(scores, k, lengths))


@pytest.mark.parametrize("search_ways, fuse_overflow", [(2, True), (16, False), (128, True)],
                         ids=["ways2", "ways16_overflow_kernel", "ways128"])
def test_topk_triton_interpreter_finish_cut_in_ties(interpreted, search_ways, fuse_overflow):
    # The finish's cut falls inside a run of ties (3 levels), split by position; the -inf and
    # -0.0 / +0.0 scores of make_scores land inside the answer of the short row; the bitmap's
    # prefix sum spans several scan steps (16 words each under the interpreter: 512
    # positions) in the 1100-long row.
    scores = make_scores(3, 1100, 3, seed=11)
    lengths = torch.tensor([1100, 70, 0])
    got = interpreted.topk_triton(scores, 100, lengths, config=TopkConfig(
        programs_per_row=2, search_ways=search_ways, threshold_ways=search_ways,
        fuse_overflow=fuse_overflow))
    assert torch.equal(got, topk_positions_torch(scores, 100, lengths))


@pytest.mark.parametrize("options", [{}, {"staging_pieces": 1},
                                     {"staging_pieces": 1, "collect_programs_per_sm": 64},
                                     {"programs_per_row": 1, "collect_programs_per_sm": 1},
                                     {"fuse_threshold": True}],
                         ids=["staged", "staged_pieces1", "staged_pieces1_64_per_sm",
                              "staged_1_per_row", "fused_threshold"])
def test_topk_triton_interpreter_staged_collect(interpreted, options):
    # The staged collect: distinct scores (row 0), rising runs of ties whose candidates crowd
    # the last chunks (row 1: a slice of one tile flushes on almost every tile), all equal
    # (row 2: the buffer overflows, the rescan), a row of length 1 and an empty one; many
    # programs per row (some past a row's end) or one.
    scores = make_scores(5, 700, 0, seed=31)
    scores[1] = (torch.arange(700) // 3).float()
    scores[2] = 0.5
    lengths = torch.tensor([700, 650, 700, 1, 0])
    got = interpreted.topk_triton(scores, 40, lengths,
                                  config=TopkConfig(**{"programs_per_row": 2, **options}))
    assert torch.equal(got, topk_positions_torch(scores, 40, lengths))


def test_topk_triton_interpreter_rising_scores(interpreted):
    # Scores that grow with the position (recent keys score higher): the strided groups
    # still give a tight threshold, and ties in runs of 3 cross the chunks of two programs.
    scores = (torch.arange(600) // 3).float()[None].repeat(2, 1)
    scores[1] = scores[1].flip(0)
    lengths = torch.tensor([600, 451])
    got = interpreted.topk_triton(scores, 50, lengths, config=TopkConfig(programs_per_row=2))
    assert torch.equal(got, topk_positions_torch(scores, 50, lengths))


@pytest.mark.parametrize("capacity_factor", [1], ids=["capacity1"])
def test_topk_triton_interpreter_overflow_bisects_row(interpreted, capacity_factor):
    # Every strided group (64 of them for k = 20) holds one key of each of its rounds, so the
    # candidates >= T0 overflow the buffer with many distinct keys above T0: the finisher
    # bisects the row for the cut, with ties (runs of 3 equal keys) at the cut.
    position = torch.arange(700)
    scores = ((position % 64) * 8 + (position // 64) // 3).float()[None].repeat(2, 1)
    lengths = torch.tensor([700, 333])
    got = interpreted.topk_triton(scores, 20, lengths, config=TopkConfig(
        programs_per_row=3, capacity_factor=capacity_factor, fuse_overflow=False))
    assert torch.equal(got, topk_positions_torch(scores, 20, lengths))


def test_topk_triton_interpreter_minus_inf_tail(interpreted):
    # A prefill row early in the prompt: a few finite scores, then -inf up to the length;
    # the -inf positions fill the rest of the k in position order.
    scores = torch.full((2, 400), -torch.inf)
    scores[0, :7] = torch.randn(7, generator=torch.Generator().manual_seed(3))
    scores[1, 100:103] = 1.0
    lengths = torch.tensor([400, 390])
    got = interpreted.topk_triton(scores, 30, lengths, config=TopkConfig(programs_per_row=2))
    assert torch.equal(got, topk_positions_torch(scores, 30, lengths))


@pytest.mark.parametrize("options", [{"collect_programs_per_sm": 64},
                                     {"collect_programs_per_sm": 1},
                                     {"group_max_stages": 1, "programs_per_row": 1},
                                     {"group_max_stages": 3, "programs_per_row": 1},
                                     {"threshold_parts": 1, "programs_per_row": 3},
                                     {"threshold_parts": 2, "programs_per_row": 3}],
                         ids=["staged_64_per_sm", "staged_1_per_sm",
                              "group_max_stages1_1_per_row", "group_max_stages3_1_per_row",
                              "threshold_parts1", "threshold_parts2_of_3_chunks"])
def test_topk_triton_interpreter_collect_variants(interpreted, options):
    # The collects' chunks: many (some past a short row's end: empty) or one per row;
    # lengths of 1 and not a multiple of its tile; stage 1's loads through its tail loop
    # alone or pipelined over a chunk of two full tiles and a tail; stage 2 merging 3
    # chunks' maxima one at a time or two at a time (the last load half masked).
    scores = make_scores(3, 301, 4, seed=21)
    lengths = torch.tensor([301, 1, 250])
    got = interpreted.topk_triton(scores, 40, lengths,
                                  config=TopkConfig(**{"programs_per_row": 2, **options}))
    assert torch.equal(got, topk_positions_torch(scores, 40, lengths))


@pytest.mark.parametrize("options", [{"collect_programs_per_sm": 64},
                                     {"capacity_factor": 1, "fuse_overflow": False},
                                     {"capacity_factor": 1, "fuse_overflow": True},
                                     {"threshold_slack": 0, "collect_block": 32,
                                      "collect_stages": 1},
                                     {"fuse_threshold": True, "threshold_slack": -1}],
                         ids=["staged_64_per_sm", "capacity1", "capacity1_fused_rescan",
                              "slack0_block32_stages1", "fused_exact_threshold"])
def test_topk_triton_interpreter_ties_and_overflow_variants(interpreted, options):
    # Rising and falling scores with runs of ties (row 2 flipped), a -inf tail (row 1), short
    # rows: many programs (some past a row's end), a buffer of k that every row overflows
    # (topk_overflow_kernel's rescan, or the finish's own), the exact threshold with a tile
    # of 32 and no pipelining.
    scores = (torch.arange(301) // 3).float()[None].repeat(3, 1)
    scores[1, 120:] = -torch.inf
    scores[2] = scores[2].flip(0)
    lengths = torch.tensor([301, 200, 45])
    got = interpreted.topk_triton(scores, 40, lengths,
                                  config=TopkConfig(programs_per_row=2, **options))
    assert torch.equal(got, topk_positions_torch(scores, 40, lengths))


def test_topk_triton_interpreter_writes_slots(interpreted):
    generator = torch.Generator().manual_seed(9)
    block_size, num_rows, length, k = 16, 3, 90, 20
    scores = make_scores(num_rows, length, 0, seed=9)
    lengths = torch.tensor([90, 40, 5])
    block_table = torch.randperm(24, generator=generator)[:18].view(3, 6).int()
    block_table[2, 1:] = -1
    row_request = torch.tensor([1, 0, 2], dtype=torch.int32)
    got = interpreted.topk_triton(scores, k, lengths, block_table, row_request, block_size)
    want = positions_to_slots_torch(topk_positions_torch(scores, k, lengths), block_table,
                                    row_request, block_size)
    assert torch.equal(got, want)


def test_topk_triton_interpreter_empty(interpreted):
    assert interpreted.topk_triton(torch.zeros(0, 5), 3, torch.zeros(0)).shape == (0, 3)
    assert interpreted.topk_triton(torch.zeros(2, 5), 0, torch.tensor([5, 5])).shape == (2, 0)


def test_topk_triton_rejects_k_beyond_limit(interpreted):
    with pytest.raises(ValueError, match=r"0 <= k <= 4096, got k=5000"):
        interpreted.topk_triton(torch.zeros(1, 5), 5000, torch.tensor([5]))


def test_topk_triton_rejects_search_ways_not_power_of_two(interpreted):
    with pytest.raises(ValueError, match=r"search_ways must be a power of two >= 1, got 3"):
        interpreted.topk_triton(torch.zeros(1, 5), 2, torch.tensor([5]),
                                config=TopkConfig(search_ways=3))


def test_topk_triton_rejects_empty_staging(interpreted):
    with pytest.raises(ValueError, match=r"staging_pieces must be >= 1, got 0"):
        interpreted.topk_triton(torch.zeros(1, 5), 2, torch.tensor([5]),
                                config=TopkConfig(staging_pieces=0))


@pytest.mark.parametrize("num_rows, length", [(1, 1), (16, 256), (17, 33)],
                         ids=["one-row-one-score", "sixteen", "odd"])
def test_topk_triton_interpreter_size_one_and_odd_sizes(interpreted, num_rows, length):
    """Every size at 1 (one row of one score, k = 1: Triton passes such arguments as
    constants), at multiples of 16 and odd, with slots as topk_slots writes them for a
    decode batch (one row per request, one block table row each)."""
    scores = make_scores(num_rows, length, 3, seed=length)
    lengths = torch.full((num_rows,), length)
    k = min(2048, length)
    block_size = 16
    blocks = -(-length // block_size)
    block_table = torch.arange(num_rows * blocks, dtype=torch.int32).view(num_rows, blocks)
    row_request = torch.arange(num_rows, dtype=torch.int32)
    got = interpreted.topk_triton(scores, k, lengths, block_table, row_request, block_size)
    want = positions_to_slots_torch(topk_positions_torch(scores, k, lengths), block_table,
                                    row_request, block_size)
    assert torch.equal(got, want)


# The launches the benchmark measures beside the default (a default may move to one).
GPU_PIPELINES = {"cumsum": {"staged_ballot": False}, "ways16": {"search_ways": 16},
                 # the default at >= 64 rows (these batches have 8)
                 "fused_threshold": {"fuse_threshold": True},
                 # the defaults below 64 rows: stages 1 and 1b apart, the overflow kernel
                 "split": {"fuse_threshold": False, "fuse_overflow": False, "search_ways": 64}}


def mixed_rows(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores and lengths of a batch of mixed rows: the full row, a row just over k, a short
    row, an empty row; a long run of ties, scores rising with the position, all equal, a
    -inf tail."""
    scores = make_scores(8, length, 0, seed=length, device="cuda")
    scores[1, : length // 2] = scores[1, 0]
    scores[5] = torch.arange(length, device="cuda") // 4
    scores[6] = 0.25
    scores[7, 1000:] = -torch.inf
    lengths = torch.tensor([length, min(length, 2049), min(length, 100), 0, length, length,
                            max(0, length - 1), length], device="cuda")
    return scores, lengths


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1, 2049, 5000, 131072, 1 << 20], ids=lambda n: f"L{n}")
def test_topk_triton_gpu_matches_torch(length):
    from atomk31.triton_kernels.topk import topk_triton

    scores, lengths = mixed_rows(length)
    got = topk_triton(scores, 2048, lengths)
    assert torch.equal(got, topk_positions_torch(scores, 2048, lengths))


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", list(GPU_PIPELINES))
def test_topk_triton_gpu_pipelines_match_torch(pipeline):
    from atomk31.triton_kernels.topk import topk_triton

    scores, lengths = mixed_rows(1 << 20)  # with rows of length 2049, 100 and 0
    got = topk_triton(scores, 2048, lengths, config=TopkConfig(**GPU_PIPELINES[pipeline]))
    assert torch.equal(got, topk_positions_torch(scores, 2048, lengths))


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{"collect_programs_per_sm": 2}, {"threshold_parts": 1}],
                         ids=["staged_2_per_sm", "threshold_parts1"])
def test_topk_triton_gpu_collect_variants(options):
    from atomk31.triton_kernels.topk import topk_triton

    # The collect variants at real size: distinct scores at 1M, ties, rising runs, a short
    # row; the staged collect on 8 times fewer, longer chunks than its default.
    length = 1 << 20
    scores = make_scores(4, length, 0, seed=7, device="cuda")
    scores[1] = make_scores(1, length, 5, seed=8, device="cuda")[0]
    scores[2] = torch.arange(length, device="cuda") // 4
    lengths = torch.tensor([length, length - 3, length - 2047, 3001], device="cuda")
    got = topk_triton(scores, 2048, lengths, config=TopkConfig(**options))
    assert torch.equal(got, topk_positions_torch(scores, 2048, lengths))


@pytest.mark.gpu
@pytest.mark.parametrize("length, pipeline", [(3000, None), (131072, None),
                                              *((131072, name) for name in GPU_PIPELINES)],
                         ids=lambda v: v if isinstance(v, str) or v is None else f"L{v}")
def test_topk_triton_gpu_writes_slots(length, pipeline):
    from atomk31.triton_kernels.topk import topk_triton

    block_size, num_rows = 64, 8
    scores = make_scores(num_rows, length, 0, seed=length + 1, device="cuda")
    scores[3] = 1.0  # every candidate tied: the overflow rescan feeds the slot mapping too
    lengths = torch.tensor([length, length - 1, 77, length, 0, 5, length, 2048], device="cuda")
    num_blocks = -(-length // block_size)
    block_table = torch.randperm(4 * num_blocks, device="cuda").view(4, num_blocks).int()
    block_table[2, num_blocks // 2:] = -1
    row_request = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3], dtype=torch.int32, device="cuda")
    got = topk_triton(scores, 2048, lengths, block_table, row_request, block_size,
                      config=TopkConfig(**GPU_PIPELINES.get(pipeline, {})))
    want = positions_to_slots_torch(topk_positions_torch(scores, 2048, lengths), block_table,
                                    row_request, block_size)
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{"threshold_slack": -1}, {"group_max_stages": 1},
                                     {"collect_stages": 1},
                                     {"staging_pieces": 1},
                                     {"collect_block": 512},
                                     {"staged_ballot": True, "collect_block": 512,
                                      "staging_pieces": 1},
                                     {"threshold_warps": 4, "finish_warps": 8},
                                     {"fuse_overflow": False}],
                         ids=["exact_threshold", "group_max_stages1", "collect_stages1",
                              "staged_pieces1",
                              "staged_tile512", "ballot_tile512_pieces1",
                              "threshold4_finish8_warps", "overflow_kernel"])
def test_topk_triton_gpu_tuning_variants(options):
    from atomk31.triton_kernels.topk import topk_triton

    # Tuning variants at real size: distinct scores at 1M, ties in 5 levels, rising runs of
    # 4, a row of all equal scores (it overflows: the rescan), a short row.
    length = 1 << 20
    scores = make_scores(5, length, 0, seed=17, device="cuda")
    scores[1] = make_scores(1, length, 5, seed=18, device="cuda")[0]
    scores[2] = torch.arange(length, device="cuda") // 4
    scores[3] = -2.5
    lengths = torch.tensor([length, length - 3, length - 2047, length, 3001], device="cuda")
    got = topk_triton(scores, 2048, lengths, config=TopkConfig(**options))
    assert torch.equal(got, topk_positions_torch(scores, 2048, lengths))


@pytest.mark.gpu
@pytest.mark.parametrize("search_ways", [4, 16, 64, 128], ids=lambda w: f"ways{w}")
def test_topk_triton_gpu_finish_variants(search_ways):
    from atomk31.triton_kernels.topk import topk_triton

    # The finish's cut search at real size: distinct scores, scores in 5 levels (the cut
    # inside a long run of ties), rising runs of 4, and a short row.
    length = 131072
    scores = make_scores(4, length, 0, seed=5, device="cuda")
    scores[1] = make_scores(1, length, 5, seed=6, device="cuda")[0]
    scores[2] = torch.arange(length, device="cuda") // 4
    lengths = torch.tensor([length, length - 3, length, 3000], device="cuda")
    got = topk_triton(scores, 2048, lengths, config=TopkConfig(search_ways=search_ways))
    assert torch.equal(got, topk_positions_torch(scores, 2048, lengths))


@pytest.mark.gpu
def test_topk_triton_gpu_repeated_calls_stay_exact():
    from atomk31.triton_kernels.topk import topk_triton

    # The finish's bitmap lives in a fresh workspace each call, zeroed by stage 1, and its
    # words are read back after atomics and a barrier: repeat a mixed batch to catch stale
    # words or a missed ordering.
    scores, lengths = mixed_rows(131072)
    want = topk_positions_torch(scores, 2048, lengths)
    for options in ({}, {"staged_ballot": False}):
        for _ in range(20):
            assert torch.equal(topk_triton(scores, 2048, lengths,
                                           config=TopkConfig(**options)), want)


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", [None, "fused_threshold", "split"])
def test_topk_triton_gpu_graph_replays_stay_exact(pipeline):
    from atomk31.triton_kernels.topk import topk_triton

    # What a decode step runs: the launches captured in a CUDA graph, replayed on new scores
    # each time; a missed dependency would read stale maxima, thresholds or candidates.
    scores, lengths = mixed_rows(131072)
    config = TopkConfig(**GPU_PIPELINES.get(pipeline, {}))
    topk_triton(scores, 2048, lengths, config=config)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = topk_triton(scores, 2048, lengths, config=config)
    for seed in range(8):
        new_scores, _ = mixed_rows(131072)
        new_scores[0] = torch.randn(131072, generator=torch.Generator().manual_seed(seed))
        scores.copy_(new_scores)
        graph.replay()
        assert torch.equal(got, topk_positions_torch(scores, 2048, lengths)), seed
