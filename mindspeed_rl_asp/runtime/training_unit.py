"""Training Unit: reward, advantages, log-prob evaluation, policy update, weight export.

One Ray actor. It owns the training engine and the task (rebuilt from the task config
with the engine's tokenizer, deterministic: the same prompts the driver planned), so a
training step needs only prompt ids and the Training Queue's payload references. It
scores through the task protocol only (``Task.score``). Its version counts completed training steps; the snapshot it
exports after step ``s`` is version ``s``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class StepReport:
    step: int
    version: int
    start: float
    end: float
    metrics: dict


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


class TrainingWorker:
    """The actor body (wrapped with ``ray.remote`` by the runtime)."""

    def __init__(self, engine_cfg: dict, model_path: str, train_cfg: dict, rl_cfg: dict, algo_cfg: dict,
                 task_cfg: dict, temperature: float, import_paths: tuple[str, ...] = ()):
        from types import SimpleNamespace

        from ..algo.grpo import GRPOLossConfig, make_loss_fn
        from ..engines.registry import make_reference_policy, make_training_engine
        from ..tasks import make_task
        from ..tasks.rewards import user_import_roots_on_path

        rl = SimpleNamespace(**rl_cfg)
        self.engine = make_training_engine(SimpleNamespace(**engine_cfg), model_path, SimpleNamespace(**train_cfg),
                                           rl, temperature)
        self.tokenizer = self.engine.tokenizer
        self.scale_advantages = algo_cfg.get("scale_advantages", True)
        self.loss_cfg = GRPOLossConfig.from_mapping(algo_cfg)
        self.loss_fn = make_loss_fn(self.loss_cfg)
        # The KL term needs log-probs of the starting policy: a frozen copy, loaded only then.
        self.reference = (make_reference_policy(SimpleNamespace(**engine_cfg), model_path, temperature)
                          if self.loss_cfg.kl_coef > 0 else None)
        self.updates_per_step = rl.global_batch_size // rl.mini_batch_size
        # The driver's user reward modules import here as they did there.
        user_import_roots_on_path(import_paths)
        self.task = make_task(SimpleNamespace(**task_cfg), self.tokenizer, rl.max_prompt_length)
        self.prompts = self.task.by_id()
        self.version = 0
        self._fail_at_step: int | None = None

    def ready(self) -> int:
        return self.version

    def inject_failure(self, step: int) -> None:
        """Debug seam for fault tests: ``train_step(step)`` raises."""
        self._fail_at_step = step

    def train_step(self, step: int, prompt_ids: list[str], *payloads: dict) -> StepReport:
        """One GRPO step on the samples of ``prompt_ids``, found in ``payloads``."""
        from ..algo.grpo import group_advantages, policy_age_histogram
        from ..engines.base import TrainBatch
        from ..policy.evaluate import strip_eos
        from ..tasks import base_prompt_id

        if step != self.version:
            raise RuntimeError(f"train_step({step}) on a trainer at version {self.version}: steps out of order")
        if step == self._fail_at_step:
            raise RuntimeError(f"injected trainer failure at step {step}")
        start = time.time()
        groups = {}
        for payload in payloads:
            groups.update(payload)
        missing = [p for p in prompt_ids if p not in groups]
        if missing:
            raise RuntimeError(f"step {step}: no samples for prompts {missing[:3]}")
        rows, rewards, scores = [], [], []
        for pid in prompt_ids:
            group = groups[pid]
            for response, logprobs in zip(group.response_ids, group.logprobs):
                text = strip_eos(self.tokenizer.decode(response.tolist(), skip_special_tokens=False),
                                 self.tokenizer.eos_token)
                score = self.task.score(self.prompts[base_prompt_id(pid)], text)
                rows.append((pid, group.prompt_ids, response, logprobs, group.version))
                rewards.append(score["reward"])
                scores.append(score)
        advantages = group_advantages(rewards, [r[0] for r in rows], scale=self.scale_advantages)
        batch = TrainBatch(
            prompt_ids=[r[1] for r in rows], response_ids=[r[2] for r in rows],
            extras={"advantages": advantages, "behaviour_logprobs": [r[3] for r in rows],
                    "versions": [r[4] for r in rows]},
        )
        if self.loss_cfg.off_policy in ("decoupled", "tis"):
            # Proximal policy: the trainer's weights at the start of this step.
            batch.extras["proximal_logprobs"] = self.engine.logprobs(batch.prompt_ids, batch.response_ids)
        if self.reference is not None:
            batch.extras["ref_logprobs"] = self.reference.logprobs(batch.prompt_ids, batch.response_ids)
        loss_metrics = self._update(batch)
        self.version += 1
        ages = policy_age_histogram(step, [r[4] for r in rows])
        n = len(rows)
        metrics = {
            "reward_mean": sum(rewards) / n,
            "integrity_rate": sum(s["integrity"] for s in scores) / n,
            "correctness_rate": sum(s["correctness"] for s in scores) / n,
            # Mean of each named reward component (what `reward_mean` is the weighted sum of).
            "reward_components": {name: sum(s["components"][name] for s in scores) / n
                                  for name in scores[0]["components"]},
            "response_length_mean": sum(len(r[2]) for r in rows) / n,
            "samples": n,
            "response_tokens": sum(len(r[2]) for r in rows),
            # Per epoch: [correct (intact) samples, samples]. Every epoch replays the same
            # prompts, so these are comparable across epochs where single steps are not.
            "epoch_correctness": epoch_sums(rows, scores),
            "epoch_integrity": epoch_sums(rows, scores, "integrity"),
            "policy_age_hist": {str(k): v for k, v in ages.items()},
            "policy_age_mean": sum(k * v for k, v in ages.items()) / n,
            "policy_age_max": max(ages),
            **loss_metrics,
        }
        return StepReport(step, self.version, start, time.time(), metrics)

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

    def export_weights(self):
        from ..engines.base import WeightSnapshot

        return WeightSnapshot(self.version, self.engine.export_weights().tensors)

    def save(self, path: str) -> None:
        self.engine.save(path)
