"""Training Unit: reward, advantages, log-prob evaluation, policy update, weight export.

One Ray actor. It owns the training engine and the task (rebuilt from the task config
with the engine's tokenizer, deterministic: the same prompts the driver planned), so a
training step needs only prompt ids and the Training Queue's payload references. It
scores through the task protocol only (``Task.score``). Its version counts completed training steps; the snapshot it
exports after step ``s`` is version ``s``.

With ``train.ranks`` > 1 the Training Unit is one such actor per rank: the driver joins
them into a torch.distributed world (``join_world``) and the engine becomes the FSDP
one (``engines/hf_fsdp.py``). Every rank gets every step's payloads and scores all the
samples (cheap, and it keeps advantages and global loss normalisation exact); the
engine runs each rank's block of rows. Rank 0's report stands for the step; exports
gather the full weights on rank 0. Rank 0 also sends versions for the collective
transport (``open_weight_sender``, ``send_weights`` on a transport thread).
"""
from __future__ import annotations

import time

from ..control.reports import StepReport


def rollout_records(rows, scores, advantages, decode, limit: int) -> list[dict]:
    """The step's samples as records for rollouts.jsonl: prompt id, sample index within
    its group, response text, reward and its components, length in tokens, the policy
    version that wrote it, its advantage. ``rows[i]`` is (prompt id, prompt ids, response
    ids, log-probs, version); ``decode(ids) -> str``; ``limit``: -1 all, else the first N."""
    kept = rows if limit < 0 else rows[:limit]
    seen: dict[str, int] = {}
    records = []
    for (pid, _, response, _, version), score, advantage in zip(kept, scores, advantages):
        seen[pid] = seen.get(pid, -1) + 1   # the sample's index within its group
        records.append({"prompt_id": pid, "sample": seen[pid], "response": decode(response),
                        "reward": score["reward"], "components": dict(score["components"]),
                        "length": len(response), "version": int(version), "advantage": float(advantage)})
    return records


def epoch_sums(rows, scores, key: str = "correctness") -> dict[str, list[float]]:
    """``{epoch: [sum of score[key], samples]}`` over a step's samples (``rows[i][0]`` is
    the sample's prompt id)."""
    from ..tasks import prompt_epoch

    sums: dict[str, list[float]] = {}
    for row, score in zip(rows, scores):
        entry = sums.setdefault(str(prompt_epoch(row[0])), [0.0, 0])
        entry[0] += score[key]
        entry[1] += 1
    return sums


def step_metrics(step: int, rows, scores, group_versions) -> dict:
    """A step's metrics from its samples: rewards, rates and components, lengths, the
    groups with a GRPO signal, per-epoch sums, policy ages (``control/policy_age.py``).
    ``rows[i]`` is (prompt id, prompt ids, response ids, log-probs, version)."""
    from ..control.policy_age import age_histogram, age_metrics

    n = len(rows)
    by_group: dict[str, list[float]] = {}
    for row, score in zip(rows, scores):
        by_group.setdefault(row[0], []).append(score["reward"])
    informative = {pid for pid, values in by_group.items() if max(values) != min(values)}
    return {
        "reward_mean": sum(s["reward"] for s in scores) / n,
        "integrity_rate": sum(s["integrity"] for s in scores) / n,
        "correctness_rate": sum(s["correctness"] for s in scores) / n,
        # Mean of each named reward component (what `reward_mean` is the weighted sum of).
        "reward_components": {name: sum(s["components"][name] for s in scores) / n
                              for name in scores[0]["components"]},
        "response_length_mean": sum(len(r[2]) for r in rows) / n,
        "samples": n,
        "response_tokens": sum(len(r[2]) for r in rows),
        # Samples of groups whose rewards have a spread: the only ones with a GRPO signal
        # (a flat group's advantages are all 0). Dynamic sampling trains on these only.
        "informative_groups": len(informative),
        "informative_response_tokens": sum(len(r[2]) for r in rows if r[0] in informative),
        # Per epoch: [correct (intact) samples, samples]. Every epoch replays the same
        # prompts, so these are comparable across epochs where single steps are not.
        "epoch_correctness": epoch_sums(rows, scores),
        "epoch_integrity": epoch_sums(rows, scores, "integrity"),
        **age_metrics(age_histogram(step, group_versions)),
    }


class TrainingWorker:
    """The actor body (wrapped with ``ray.remote`` by the runtime)."""

    def __init__(self, config, model_path: str):
        """``config``: the actor's ``TrainerActorConfig`` (``runtime/actor_configs.py``);
        ``model_path``: the weights to train from (a resumed run: its checkpoint's policy;
        the KL reference stays ``config.reference_path``, the run's starting checkpoint)."""
        from ..algo.grpo import GRPOLossConfig, make_loss_fn
        from ..config.validate import rollouts_per_step
        from ..engines.registry import make_reference_policy, make_training_engine
        from ..tasks import make_task
        from ..tasks.rewards import user_import_roots_on_path

        rl, algo = config.rl, config.algo
        # record.rollouts: samples per step written to rollouts.jsonl.
        self.rollouts_per_step = rollouts_per_step(config.record_rollouts)
        self.source_path = config.reference_path   # the run's starting checkpoint: exports follow it
        self.engine = make_training_engine(config.engine, model_path, config.train, rl, config.temperature,
                                           worker_bundles=config.worker_bundles)
        self.tokenizer = self.engine.tokenizer
        self.scale_advantages = algo.scale_advantages
        # algo.adv_std: population (ddof=0) or sample (ddof=1, MindSpeed-RL's group_norm).
        self.adv_ddof = 1 if algo.adv_std == "sample" else 0
        self.adv_eps = float(algo.adv_eps)
        # Dynamic sampling and overlong shaping score on the rollout side (the groups bring
        # their scores); the trainer scores only the groups that come without.
        self.scored_by_generators = algo.filter_groups != "none" or algo.overlong_buffer_len > 0
        self.loss_cfg = GRPOLossConfig.from_mapping(vars(algo))
        self.loss_fn = make_loss_fn(self.loss_cfg)
        if hasattr(self.engine, "configure_loss"):   # engine=mindspeed folds the correction into its own loss
            self.engine.configure_loss(self.loss_cfg)
        # The KL term needs log-probs of the starting policy: a frozen copy, loaded only then.
        self.reference = (make_reference_policy(config.engine, config.reference_path, config.temperature,
                                                training_engine=self.engine)
                          if self.loss_cfg.kl_coef > 0 else None)
        self.updates_per_step = rl.global_batch_size // rl.mini_batch_size
        # The driver's user reward modules import here as they did there.
        user_import_roots_on_path(config.import_roots)
        self.task = make_task(config.task, self.tokenizer, rl.max_prompt_length)
        self.prompts = self.task.by_id()
        # train.data_channel: each step's samples through MindSpeed-RL's TransferDock or
        # TransferQueue (integrations/mindspeed/queue.py); None: the Ray payloads as they are.
        from ..integrations.mindspeed.queue import make_channel

        self.channel = make_channel(config.train.data_channel, rl.global_batch_size, rl.n_samples_per_prompt)
        self.version = 0
        self.rank = 0
        self.sender = None   # the collective transport's sending side (rank 0)
        self._fail_at_step: int | None = None
        self._fail_next_export = False

    def ready(self) -> int:
        return self.version

    def inject_failure(self, step: int) -> None:
        """Debug seam for fault tests: ``train_step(step)`` raises."""
        self._fail_at_step = step

    def inject_export_failure(self) -> None:
        """Debug seam for fault tests: the next export (of any transport) raises, once."""
        self._fail_next_export = True

    def train_step(self, step: int, prompt_ids: list[str], *payloads: dict) -> StepReport:
        """One GRPO step on the samples of ``prompt_ids``, found in ``payloads``: gather
        the groups, score them (unless the generation actors did), advantages, one or
        more optimizer updates, the step's metrics."""
        if step != self.version:
            raise RuntimeError(f"train_step({step}) on a trainer at version {self.version}: steps out of order")
        if step == self._fail_at_step:
            raise RuntimeError(f"injected trainer failure at step {step}")
        start = time.time()
        groups, scored = self._gather_groups(step, prompt_ids, payloads)
        rows, scores = self._scored_rows(prompt_ids, groups, scored)
        batch = self._train_batch(rows, [s["reward"] for s in scores])
        loss_metrics = self._update(batch)
        self.version += 1
        metrics = {**step_metrics(step, rows, scores, [groups[p].version for p in prompt_ids]), **loss_metrics}
        rollouts = rollout_records(rows, scores, batch.extras["advantages"], self._decode, self.rollouts_per_step) \
            if self.rollouts_per_step and self.rank == 0 else []
        return StepReport(step, self.version, start, time.time(), metrics, rollouts)

    def _gather_groups(self, step: int, prompt_ids: list[str], payloads) -> tuple[dict, dict]:
        """(prompt id -> its ``SampleGroup``, prompt id -> the scores the generation actors
        gave it or None), through ``train.data_channel`` when one is set."""
        groups = {}
        for payload in payloads:
            groups.update(payload)
        missing = [p for p in prompt_ids if p not in groups]
        if missing:
            raise RuntimeError(f"step {step}: no samples for prompts {missing[:3]}")
        scored = {p: getattr(groups[p], "scores", None) for p in prompt_ids}   # the dock keeps no scores
        if self.scored_by_generators and any(v is None for v in scored.values()):
            raise RuntimeError(f"step {step}: algo.filter_groups / algo.overlong_buffer_len need the samples "
                               "scored by the generation actors, and some groups came without scores")
        if self.channel is not None:   # into the dock, read back as MindSpeed-RL's trainer stage reads
            self.channel.put_groups([groups[p] for p in prompt_ids])
            groups = {g.prompt_id: g for g in self.channel.get_groups()}
            self.channel.clear()
        return groups, scored

    def _scored_rows(self, prompt_ids: list[str], groups: dict, scored: dict) -> tuple[list, list]:
        """One row per sample, ``(prompt id, prompt ids, response ids, log-probs, version)``,
        and its score (the task's reward, components and rates)."""
        from ..algo.dapo import score_samples
        from ..tasks import base_prompt_id

        rows, scores = [], []
        for pid in prompt_ids:
            group = groups[pid]
            # Scored on the rollout side (dynamic sampling, overlong shaping), else here.
            group_scores = scored[pid] or score_samples(
                self.task.score, self.prompts[base_prompt_id(pid)],
                [self._decode(r) for r in group.response_ids], [len(r) for r in group.response_ids], {}, 0)
            for response, logprobs, score in zip(group.response_ids, group.logprobs, group_scores):
                rows.append((pid, group.prompt_ids, response, logprobs, group.version))
                scores.append(score)
        return rows, scores

    def _train_batch(self, rows: list, rewards: list[float]):
        """The engine's batch: the rows with their group advantages, behaviour log-probs and
        versions, plus the proximal log-probs (off-policy correction) and the reference's
        (KL term) when the loss needs them."""
        from ..algo.grpo import group_advantages
        from ..engines.base import TrainBatch

        advantages = group_advantages(rewards, [r[0] for r in rows], scale=self.scale_advantages,
                                      eps=self.adv_eps, ddof=self.adv_ddof)
        batch = TrainBatch(
            prompt_ids=[r[1] for r in rows], response_ids=[r[2] for r in rows],
            extras={"advantages": advantages, "behaviour_logprobs": [r[3] for r in rows],
                    "versions": [r[4] for r in rows]},
        )
        if self.loss_cfg.off_policy in ("decoupled", "tis"):
            # Proximal policy: the trainer's weights at the start of this step.
            batch.extras["proximal_logprobs"] = self.engine.logprobs(batch.prompt_ids, batch.response_ids)
        if self.reference is not None:
            shard_map = getattr(self.engine, "shard_map_rows", None)   # sharded: each rank its rows
            batch.extras["ref_logprobs"] = (
                shard_map(lambda rows: self.reference.logprobs([batch.prompt_ids[i] for i in rows],
                                                               [batch.response_ids[i] for i in rows]), len(batch))
                if shard_map else self.reference.logprobs(batch.prompt_ids, batch.response_ids))
        return batch

    def _decode(self, response) -> str:
        from ..policy.evaluate import strip_eos

        ids = response.tolist() if hasattr(response, "tolist") else list(response)
        return strip_eos(self.tokenizer.decode(ids, skip_special_tokens=False), self.tokenizer.eos_token)

    def _update(self, batch) -> dict:
        """``rl.global_batch_size / rl.mini_batch_size`` optimizer updates over the step's samples."""
        from ..engines.base import TrainBatch

        n = len(batch)
        per_update = n // self.updates_per_step
        totals: dict[str, float] = {}
        for u in range(self.updates_per_step):
            index = list(range(u * per_update, n if u == self.updates_per_step - 1 else (u + 1) * per_update))
            sub = TrainBatch([batch.prompt_ids[i] for i in index], [batch.response_ids[i] for i in index],
                             {k: [v[i] for i in index] for k, v in batch.extras.items()})
            for key, value in self.engine.train_step(sub, self.loss_fn).items():
                totals[key] = totals.get(key, 0.0) + value / self.updates_per_step
        return totals

    # ------------------------------------------------------------------ ranks
    def open_rendezvous(self, local: bool, world: int, timeout_s: float = 600.0) -> tuple[str, int]:
        """Rank 0: listen for the other ranks; returns (host, port) for them."""
        from .distributed import open_rendezvous, rendezvous_host

        host = rendezvous_host(local)
        self._store, port = open_rendezvous(host, world, timeout_s)
        return host, port

    def join_world(self, rank: int, world: int, host: str, port: int, device_type: str,
                   timeout_s: float = 600.0) -> int:
        """Join the trainer ranks' process group and shard the engine over it (FSDP)."""
        from ..engines.base import EngineError
        from ..engines.hf import HFTrainingEngine
        from ..engines.hf_fsdp import HFShardedTrainingEngine
        from .distributed import backend_for, init_world

        if not isinstance(self.engine, HFTrainingEngine):
            raise EngineError(f"train.ranks={world} needs the hf training engine (FSDP); "
                              f"{type(self.engine).__name__} trains on one rank only")
        if self.channel is not None:   # each rank would fill its own dock (or the same topic)
            raise EngineError(f"train.data_channel needs train.ranks=1 (got {world}); use train.data_channel=local")
        init_world(backend_for(device_type), rank, world, host, port, timeout_s,
                   store=getattr(self, "_store", None) if rank == 0 else None)
        self.engine = HFShardedTrainingEngine(self.engine)
        self.rank = rank
        return rank

    # ------------------------------------------------------------------ weights out
    def export_weights(self, transport: str = "object_store", target=None):
        """The version just trained, as ``transport`` delivers it (``runtime/transport.py``):
        a ``WeightSnapshot`` (object_store), a ``FileHandle`` after writing into the
        directory ``target`` (files), or a ``CollectiveHandle`` after packing it for
        sending (collective; ``target``: the versions still to keep staged). Every rank
        calls it (the sharded engine gathers); ranks other than 0 return None."""
        from ..engines.base import WeightSnapshot

        if self._fail_next_export:
            self._fail_next_export = False
            raise RuntimeError(f"injected export failure at version {self.version}")
        if transport == "object_store":
            snapshot = self.engine.export_weights()
            return None if snapshot is None else WeightSnapshot(self.version, snapshot.tensors)
        tensors = self.engine.state_tensors()
        if tensors is None:
            return None
        if transport == "files":
            from ..weights.store import DirectorySnapshots
            from .transport import FileHandle

            DirectorySnapshots(target, keep=None).publish(self.version, tensors)
            return FileHandle(self.version, str(target))
        if transport == "collective":
            if self.sender is None:
                raise RuntimeError("weights.transport=collective but this trainer has no weight sender "
                                   "(open_weight_sender runs on rank 0 at start-up)")
            self.sender.keep_only(target or ())
            return self.sender.stage(self.version, tensors)
        raise ValueError(f"weights.transport={transport!r} is not one of object_store, collective, files")

    def export_snapshot(self):
        """The object-store publish: ``(receipt, snapshot)``, called with two Ray returns.
        The driver fetches only the receipt (this version), so an export that raises, or a
        rank that died, fails the publish there; the snapshot stays in the object store for
        the actors to resolve (ranks other than 0: None)."""
        return self.version, self.export_weights("object_store")

    def open_weight_sender(self, device_type: str, local: bool, bucket_mb: float, timeout_s: float) -> int:
        """Rank 0: the collective transport's sending side; returns its store's port."""
        from ..weights.collective import WeightSender, backend_for
        from .distributed import rendezvous_host

        self.sender = WeightSender(backend_for(device_type), rendezvous_host(local),
                                   bucket_bytes=max(1, int(bucket_mb * (1 << 20))), timeout_s=timeout_s)
        return self.sender.port

    def send_weights(self, actor: int, version: int, generation: int, seq: int) -> dict:
        """Send ``version`` to generation actor ``actor`` (the transport thread's call).
        A failure is returned (``ok: False``), not raised: the receiving side's load fails."""
        try:
            stats = self.sender.send(actor, version, generation, seq)
        except Exception as error:  # noqa: BLE001 - reported by the load that waits on this transfer
            return {"ok": False, "version": version, "error": str(error)}
        return {"ok": True, "version": stats.version, "bytes": stats.bytes, "seconds": stats.seconds}

    def inject_transfer_failure(self, after_buckets: int) -> None:
        """Fault seam for tests: the next weight transfer stops after ``after_buckets`` buckets."""
        self.sender.inject_failure(after_buckets)

    def save(self, path: str) -> None:
        """The final policy (``final_policy/``) in the starting checkpoint's dtype, with its
        config and tokenizer files (``engines/export.py``); engine=mindspeed also writes
        MindSpeed-RL's own actor checkpoint."""
        from ..engines.export import export_policy

        native = getattr(self.engine, "save_native", None)
        if native is not None:
            native()
        tensors = self.engine.state_tensors()   # sharded: every rank gathers, rank 0 gets them
        if tensors is not None:
            export_policy(path, tensors, self.source_path)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> None:
        """The trainer's part of a checkpoint (``runtime/checkpoint.py``) into the directory
        ``path``: ``policy/`` (the weights) and ``trainer_state.pt`` (AdamW state by
        parameter name, every rank's RNG states). Every rank calls it; rank 0 writes."""
        import os

        import torch

        from .checkpoint import POLICY, TRAINER_STATE, rng_states

        self.engine.save(os.path.join(path, POLICY))
        optimizer = self.engine.optimizer_state()
        rngs = self._gather_objects(rng_states())
        if self.rank == 0:
            target = os.path.join(path, TRAINER_STATE)
            torch.save({"optimizer": optimizer, "rng": rngs}, target + ".tmp")
            os.replace(target + ".tmp", target)

    def load_checkpoint(self, path: str, version: int) -> None:
        """Restore :meth:`save_checkpoint`'s optimizer and RNG states (the weights came with
        ``model_path``); the trainer is at ``version`` (the checkpoint's: its next step is
        ``version``, its next export ``version + 1``). Every rank calls it, after the ranks
        joined their world."""
        import os

        import torch

        from .checkpoint import TRAINER_STATE, set_rng_states

        # Our own file, written by save_checkpoint: it holds RNG tuples as well as tensors.
        state = torch.load(os.path.join(path, TRAINER_STATE), map_location="cpu", weights_only=False)
        self.engine.load_optimizer_state(state["optimizer"] if self.rank == 0 else None)
        rngs = state["rng"]
        set_rng_states(rngs[self.rank] if self.rank < len(rngs) else rngs[0])
        self.version = version

    def _gather_objects(self, value) -> list:
        """``value`` of every rank, in rank order (one rank: ``[value]``)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return [value]
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, value)
        return parts
