"""The ``hf`` training engine, data-parallel and sharded over ranks with FSDP2.

One process per rank (a Ray actor per device); torch.distributed's default group is the
ranks' world (gloo on CPU, NCCL on GPUs, HCCL on Ascend; the runtime initialises it,
``runtime/distributed.py``). :class:`HFShardedTrainingEngine` takes a loaded
:class:`~mindspeed_rl_asp.engines.hf.HFTrainingEngine`, shards every decoder layer and
then the root with ``torch.distributed.fsdp.fully_shard`` (parameters, gradients and
AdamW state each 1/world per rank) and keeps the engine protocol: every rank is given
the whole batch and returns what the single-rank engine returns.

Exactness. Each rank takes a contiguous block of the batch's rows and runs its
micro-batches of ``micro_batch_size`` samples. The micro-batch loss is scaled by the
*global* counts exactly as on one rank (``engines/hf.backward_micro_batch``, the rule both
engines use): ``loss * len(micro) / len(batch)``, where the
loss function's own normalisation (``algo/grpo.make_loss_fn`` with ``global_norm``:
tokens or rows of the whole batch) reads the whole batch. The ranks' gradients are then
*summed* (FSDP's gradient divide factor set to 1, not the default mean over ranks), so
the update is the single-rank update on the same global batch up to the order of float
additions. FSDP needs every rank to run the same number of forwards and backwards, so
a rank with fewer micro-batches runs extra ones on one row with the loss multiplied by
0 (no gradient, no metric); gradients are reduced once, on the last backward.
Metrics are summed over ranks; the gradient norm is that of the full gradient.
"""
from __future__ import annotations

from typing import Sequence

from .base import EngineError, LossFn, TrainBatch, WeightSnapshot
from .hf import HFTrainingEngine, backward_micro_batch, token_logprobs


def shard_rows(n: int, rank: int, world: int) -> range:
    """Rank ``rank``'s contiguous block of ``n`` rows; blocks differ in size by at most one."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def micro_batches(rows: range, size: int) -> list[list[int]]:
    return [list(rows[i:i + size]) for i in range(0, len(rows), size)]


def decoder_layers(model) -> list:
    """The transformer blocks FSDP shards one by one (Qwen2/Qwen3/Llama: ``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def _mesh_device_type(device: str) -> str:
    return device.split(":", 1)[0]


class HFShardedTrainingEngine(HFTrainingEngine):
    """``HFTrainingEngine`` over the default process group's ranks (FSDP2)."""

    def __init__(self, engine: HFTrainingEngine):  # noqa: D107 - built from a loaded engine
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if not dist.is_initialized():
            raise EngineError("HFShardedTrainingEngine needs torch.distributed initialised (runtime/distributed.py)")
        self.__dict__.update(engine.__dict__)   # model, tokenizer, pad_id, micro_batch_size, temperature, ...
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        device = next(self.model.parameters()).device
        self.mesh = init_device_mesh(_mesh_device_type(str(device)), (self.world,))
        for layer in decoder_layers(self.model):
            fully_shard(layer, mesh=self.mesh)
        fully_shard(self.model, mesh=self.mesh)
        self.fsdp_modules = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for module in self.fsdp_modules:
            # Losses are scaled by global counts: the ranks' gradients add up, not average.
            # A plain SUM (gloo has no pre-multiplied sum), divided by 1 afterwards: exact.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
        defaults = engine.optimizer.defaults
        # Parameters are now DTensors (each rank holds its shard): a new optimizer over them.
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=defaults["lr"],
                                           weight_decay=defaults["weight_decay"], betas=defaults["betas"])

    # ------------------------------------------------------------------ helpers
    def _gather(self, mine: dict[int, object], n: int) -> list:
        """Every rank's ``{row: value}`` merged into one list of ``n`` rows, on every rank."""
        import torch.distributed as dist

        parts: list = [None] * self.world
        dist.all_gather_object(parts, mine)
        out: list = [None] * n
        for part in parts:
            for row, value in part.items():
                out[row] = value
        return out

    def _sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        parts: list = [None] * self.world
        dist.all_gather_object(parts, values)
        keys = sorted({k for part in parts for k in part})
        return {k: sum(part.get(k, 0.0) for part in parts) for k in keys}

    def _forward_rows(self, prompt_ids, response_ids, rows: Sequence[int], temperature: float):
        """token log-probs of ``rows`` (or of row 0 as a dummy when ``rows`` is empty)."""
        index = list(rows) or [0]
        return token_logprobs(self.model, [prompt_ids[i] for i in index], [response_ids[i] for i in index],
                              self.pad_id, temperature)

    def shard_map_rows(self, fn, n: int) -> list:
        """``fn(rows) -> [value per row]`` on this rank's rows, gathered to all ``n`` rows on
        every rank (for evaluations outside the sharded model, such as a frozen reference)."""
        rows = list(shard_rows(n, self.rank, self.world))
        values = fn(rows) if rows else []
        return self._gather(dict(zip(rows, values)), n)

    # ------------------------------------------------------------------ the engine protocol
    def logprobs(self, prompt_ids, response_ids, temperature: float | None = None) -> list[list[float]]:
        import torch

        temperature = self.temperature if temperature is None else temperature
        rows = list(shard_rows(len(prompt_ids), self.rank, self.world))
        with torch.no_grad():   # one forward per rank, a dummy one where the block is empty
            values, mask = self._forward_rows(prompt_ids, response_ids, rows, temperature)
        mine = {row: v[m].tolist() for row, v, m in zip(rows, values.cpu(), mask.cpu())}
        return self._gather(mine, len(prompt_ids))

    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer update over the whole (global) batch; every rank gets the same batch."""
        import torch

        if len(batch) == 0:
            raise EngineError("train_step() got an empty batch")
        n = len(batch)
        mine = micro_batches(shard_rows(n, self.rank, self.world), self.micro_batch_size)
        # Every rank runs as many micro-batches as the busiest one (FSDP collectives pair up).
        count = max(len(micro_batches(shard_rows(n, r, self.world), self.micro_batch_size))
                    for r in range(self.world))
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for k in range(count):
            last = k == count - 1
            for module in self.fsdp_modules:  # reduce gradients once, after the last backward
                module.set_requires_gradient_sync(last, recurse=False)
            index = mine[k] if k < len(mine) else []
            values, mask = self._forward_rows(batch.prompt_ids, batch.response_ids, index, self.temperature)
            if index:
                backward_micro_batch(loss_fn, values, mask, batch, index, totals)
            else:  # a dummy micro-batch: the collectives without a contribution
                (values.sum() * 0.0).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.version += 1
        totals = self._sum_over_ranks(totals)
        totals["grad_norm"] = float(grad_norm)
        return totals

    def full_state_dict(self) -> dict | None:
        """The unsharded parameters as CPU tensors on rank 0 (None on the others); every
        rank must call it (it all-gathers)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.rank == 0 else None

    def state_tensors(self) -> dict | None:
        """:meth:`full_state_dict`: gathered CPU copies on rank 0, None elsewhere."""
        return self.full_state_dict()

    def export_weights(self) -> WeightSnapshot | None:
        state = self.full_state_dict()
        return None if state is None else WeightSnapshot(version=self.version, tensors=state)

    def optimizer_state(self) -> dict | None:
        """The full (unsharded) AdamW state keyed by parameter name, on rank 0 (None on the
        others); every rank must call it (it gathers)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(self.model, self.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.rank == 0 else None

    def load_optimizer_state(self, state: dict | None) -> None:
        """Rank 0 passes the full state, the others None: it is broadcast and resharded."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state if self.rank == 0 else {},
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    def save(self, path) -> None:
        """Rank 0 writes the Hugging Face checkpoint; every rank must call it."""
        state = self.full_state_dict()
        if state is not None:
            self.model.save_pretrained(str(path), state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(str(path))


__all__ = ["HFShardedTrainingEngine", "decoder_layers", "micro_batches", "shard_rows"]
