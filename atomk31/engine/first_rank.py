"""The first rank's side of a distributed engine: start or join the ranks, send them the steps.

`RankLink.start(options)`: outside torchrun it opens the rendezvous store, starts ranks
1..N-1 on this node (``distributed/launch.py``) and joins them as rank 0; under torchrun
(``atomk31 serve`` on every node) it joins as rank 0 through torchrun's environment, the other
ranks having been started by torchrun.

Each step the engine's runner hands its requests to `publish`, which broadcasts them with the
KDA slot changes the scheduler made (``step_message.py``); `keepalive` sends a heartbeat while
the engine is idle (so no rank's wait in the broadcast outlasts the collective timeout) and
asks the watchdog whether a started rank died. Under several ranks a failed collective, or a
step that raised, is fatal: the ranks can no longer agree on the next collective, so the
engine raises `RankFailure`, which stops the server's engine loop (``/health`` then fails).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from atomk31.config import EngineConfig, torchrun_rank
from atomk31.distributed.launch import WorkerRanks, open_store, rank_device
from atomk31.distributed.parallel_context import ParallelContext, RankFailure, leave_ranks
from atomk31.engine.step_batch import StepRequest
from atomk31.engine.step_message import Heartbeat, StepMessage, Stop
from atomk31.engine.worker import join, run_spawned_worker

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0


class RankLink:
    def __init__(self, parallel: ParallelContext, device: torch.device,
                 workers: WorkerRanks | None, store: object | None = None):
        self.parallel = parallel
        self.device = device
        self.workers = workers          # None under torchrun (torchrun watches its ranks)
        self._store = store             # the rendezvous store, open for the ranks' lifetime
        self._last_message = time.monotonic()
        self._failure: str | None = None
        self.is_stopped = False

    @classmethod
    def start(cls, options: EngineConfig) -> "RankLink":
        if dist.is_initialized():
            raise ValueError("this process already runs a distributed engine (torch.distributed "
                             "is initialised); shut it down (llm.shutdown()) before starting "
                             "another")
        world = options.tensor_parallel_size
        launched = torchrun_rank()
        if launched is not None:
            if launched.rank != 0 or launched.world_size != world:
                raise ValueError(
                    f"under torchrun this process is rank {launched.rank} of "
                    f"{launched.world_size}; the engine runs on rank 0 with "
                    f"--tensor-parallel-size {launched.world_size} (the other ranks run "
                    "atomk31.engine.worker.run_torchrun_worker, as `atomk31 serve` does)")
            device = rank_device(options.device, launched.local_rank)
            return cls(join(options, 0, device), device, None)
        device = rank_device(options.device, 0)
        store = open_store(world, options.distributed_timeout_s)
        workers = WorkerRanks.start(run_spawned_worker, world,
                                    (store.port, options, logging.getLogger().level))
        try:
            parallel = join(options, 0, device, store)
        except BaseException:
            workers.stop(timeout_s=5)
            raise
        return cls(parallel, device, workers, store)

    def failure(self) -> str | None:
        if self._failure is None and self.workers is not None:
            self._failure = self.workers.failure()
        return self._failure

    def fail(self, what: str, error: BaseException | None = None) -> RankFailure:
        """The RankFailure to raise after ``what`` went wrong (naming a dead rank if any);
        from then on every send fails at once."""
        dead = self.failure()
        self._failure = self._failure or f"{what}: {error!r}"
        detail = dead if dead else repr(error)
        return RankFailure(f"{what} ({detail}); the ranks can no longer agree on the next "
                           "step: restart the engine")

    def publish(self, requests: list[StepRequest], state_ops: list) -> None:
        self._send(StepMessage(requests, state_ops), "sending a step to the other ranks")

    def keepalive(self) -> None:
        """Between steps: fail if a rank died; send a heartbeat if idle for HEARTBEAT_S."""
        if self.failure() is not None:
            raise self.fail("a rank died")
        if time.monotonic() - self._last_message >= HEARTBEAT_S:
            self._send(Heartbeat(), "a heartbeat to the other ranks")

    def shutdown(self) -> None:
        """Tell the ranks to stop, wait for them, leave torch.distributed."""
        if self.is_stopped:
            return
        self.is_stopped = True
        failed = self.failure() is not None
        if not failed:
            try:
                self.parallel.tp.broadcast_object(Stop())
            except Exception:       # a rank is gone: nothing to tell it
                logger.warning("could not tell every rank to stop", exc_info=True)
                failed = True
        if failed:
            # the ranks still alive wait in a collective for a rank that is gone: leaving the
            # group ends their wait; then they are terminated if they linger
            leave_ranks()
            if self.workers is not None:
                self.workers.stop(timeout_s=2.0)
            return
        if self.workers is not None:
            self.workers.stop()
        leave_ranks()

    def _send(self, message: object, what: str) -> None:
        if self.failure() is not None:
            raise self.fail(what)
        try:
            self.parallel.tp.broadcast_object(message)
        except Exception as error:
            raise self.fail(what, error) from error
        self._last_message = time.monotonic()
