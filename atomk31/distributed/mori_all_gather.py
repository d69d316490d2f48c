"""The DCP all-gather over ROCm peer memory with mori's symmetric heap (HIP IPC in a node).

Each rank owns one symmetric buffer of ``world_size * max_bytes`` bytes; mori maps every peer's
buffer into this process (``shmem_ptr_p2p``). ``all_gather`` writes the local tensor into
slot ``rank`` of every peer's buffer (device-to-device copies over the GPU links), waits at
mori's barrier, and returns slot 0..W-1 of the local buffer viewed as [W, *shape].

The barrier is host-side (the stream is synchronised before it), so this adapter trades
a host round trip for skipping the collective library; a device-side flag barrier is the
next step. Not verified on hardware here (no AMD GPU); the interface and the torch fallback
are tested on CPU.
"""

import torch
import torch.distributed as dist


class MoriAllGather:
    """DcpAllGather through mori peer memory; one instance per DCP group and device."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device,
                 max_bytes: int) -> None:
        import mori

        self._shmem = mori.shmem
        group_name = (group or dist.group.WORLD).group_name
        self._shmem.shmem_torch_process_group_init(group_name)
        self.rank = self._shmem.shmem_mype()
        self.world_size = self._shmem.shmem_npes()
        self.max_bytes = max_bytes
        self.device = torch.device(device)
        total = self.world_size * max_bytes
        self._local_ptr = self._shmem.shmem_malloc(total)
        self._buffers = [
            _bytes_at(self._shmem.shmem_ptr_p2p(self._local_ptr, self.rank, peer), total,
                      self.device)
            for peer in range(self.world_size)]

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        nbytes = x.numel() * x.element_size()
        if nbytes > self.max_bytes:
            raise ValueError(f"mori all-gather holds {self.max_bytes} B per rank, got a "
                             f"{nbytes} B tensor; raise max_bytes in make_dcp_all_gather")
        payload = x.view(torch.uint8).reshape(-1)
        start = self.rank * self.max_bytes
        for peer_buffer in self._buffers:
            peer_buffer[start:start + nbytes].copy_(payload, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        self._shmem.shmem_barrier_all()
        local = self._buffers[self.rank].view(self.world_size, self.max_bytes)[:, :nbytes]
        return local.clone().view(x.dtype).reshape(self.world_size, *x.shape)

    def close(self) -> None:
        self._shmem.shmem_barrier_all()
        self._shmem.shmem_free(self._local_ptr)


def _bytes_at(pointer: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over ``nbytes`` of device memory at ``pointer`` (no ownership)."""
    if pointer == 0:
        raise ValueError("mori returned no peer mapping (0): the peer is not reachable by "
                         "peer memory (another node?); use the torch DCP all-gather")

    class _DeviceArray:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (pointer, False), "version": 3}

    return torch.as_tensor(_DeviceArray(), device=device)
