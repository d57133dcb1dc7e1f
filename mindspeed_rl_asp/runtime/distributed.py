"""torch.distributed for the trainer ranks: rendezvous, backend, the default group.

The trainer ranks' world is torch.distributed's default group in each rank's process
(FSDP shards over it). Rank 0 opens a ``TCPStore`` on a port the OS picks and the other
ranks join it; on one machine (a local Ray cluster) it listens on 127.0.0.1 only, on a
cluster that ``asp-launch`` brought up (its ``asp_node_<k>`` markers) on rank 0's node
address. The backend follows ``layout.device_type``: gloo (cpu), nccl (gpu), hccl
(npu, through torch_npu).
"""
from __future__ import annotations

import datetime

from ..weights.collective import backend_for

LOOPBACK = "127.0.0.1"

__all__ = ["LOOPBACK", "backend_for", "connect_trainer_ranks", "init_world", "open_rendezvous",
           "rendezvous_host"]


def rendezvous_host(local: bool) -> str:
    """Where rank 0 listens: loopback on one machine, else this node's address."""
    if local:
        return LOOPBACK
    import ray

    return ray.util.get_node_ip_address()


def open_rendezvous(host: str, world: int, timeout_s: float):
    """Rank 0's store on a free port: (store, port)."""
    import torch.distributed as dist

    store = dist.TCPStore(host, 0, world_size=world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return store, store.port


def init_world(backend: str, rank: int, world: int, host: str, port: int, timeout_s: float, store=None) -> None:
    """Join the trainer ranks' default process group (rank 0 passes its own store)."""
    import torch.distributed as dist

    if backend == "hccl":
        import torch_npu  # noqa: F401  (registers the hccl backend)
    elif backend == "nccl":
        import torch

        torch.cuda.set_device(0)  # Ray gives each rank actor one visible GPU
    if store is None:
        store = dist.TCPStore(host, port, world_size=world, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def connect_trainer_ranks(trainers: list, device_type: str, local: bool, timeout_s: float = 600.0) -> None:
    """Join the trainer rank actors (rank 0 first) into one process group and shard each
    rank's engine over it. One rank: nothing to do."""
    import ray

    world = len(trainers)
    if world == 1:
        return
    host, port = ray.get(trainers[0].open_rendezvous.remote(local, world, timeout_s))
    ray.get([t.join_world.remote(rank, world, host, port, device_type, timeout_s)
             for rank, t in enumerate(trainers)])
