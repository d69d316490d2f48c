"""The DCP all-gather interface (atomk31/distributed/all_gather.py): torch.distributed on two
CPU ranks (gloo), the single-rank case, and the backend choice. The mori adapter needs ROCm
GPUs (``-m amd``)."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from atomk31.distributed import SingleRankAllGather, TorchAllGather, make_dcp_all_gather
from atomk31.distributed.all_gather import dcp_all_gather_backend


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gather_on_rank(rank: int, world_size: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        gather = make_dcp_all_gather("auto", torch.device("cpu"))
        assert isinstance(gather, TorchAllGather)
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 100 * rank
        results[rank] = gather.all_gather(x)
    finally:
        dist.destroy_process_group()


def test_torch_all_gather_stacks_every_rank_in_rank_order():
    world_size = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_gather_on_rank, args=(world_size, _free_port(), results), nprocs=world_size)
        gathered = dict(results)
    expected = torch.stack([torch.arange(6.0).reshape(2, 3) + 100 * r for r in range(2)])
    for rank in range(world_size):
        assert torch.equal(gathered[rank], expected), f"rank {rank} gathered {gathered[rank]}"


def test_single_rank_all_gather_adds_the_rank_dim():
    x = torch.randn(3, 5)
    out = make_dcp_all_gather("auto", torch.device("cpu")).all_gather(x)
    assert isinstance(make_dcp_all_gather("torch", "cpu"), SingleRankAllGather)
    assert out.shape == (1, 3, 5) and torch.equal(out[0], x)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="choose one of"):
        make_dcp_all_gather("nccl", torch.device("cpu"))


def test_mori_requested_without_rocm_says_why(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(ValueError, match="mori DCP all-gather cannot run here: needs ROCm"):
        make_dcp_all_gather("mori", torch.device("cpu"))


def test_the_engine_takes_mori_only_for_eager_steps():
    """mori's host barrier cannot be captured in a decode graph (all_gather.py)."""
    assert dcp_all_gather_backend(enforce_eager=False) == "torch"
    assert dcp_all_gather_backend(enforce_eager=True) == "auto"
