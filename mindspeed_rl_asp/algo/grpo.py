"""GRPO with off-policy correction for stale samples: small pure functions.

In the asynchronous system a sample reaches the trainer some versions after the weights
that generated it. Three log-probs of each response token matter:

* ``behaviour`` (mu): recorded by the generator when it sampled the token (the policy
  version of ``extras["versions"]``, computed by the generation engine);
* ``proximal`` (pi_prox): the trainer's weights at the start of this training step
  (optional: costs one extra forward pass);
* ``logprobs`` (pi_theta): the current, differentiable policy.

:func:`grpo_loss` implements PPO-clip (``off_policy="none"``), truncated importance
sampling (``"tis"``) and decoupled PPO (``"decoupled"``) on padded ``[B, T]`` tensors;
:func:`make_loss_fn` adapts it to the training engines' ``loss_fn(values, mask, batch,
index)``. ``docs/grpo.md`` gives the formulas exactly as implemented.

Only :func:`grpo_loss` and :func:`make_loss_fn` need torch, and import it when called.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any, Hashable, Mapping, Optional, Sequence

OFF_POLICY_MODES = ("none", "tis", "decoupled")
LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
KL_ESTIMATORS = ("k1", "k2", "k3")

# exp() of a log-ratio is taken after clamping it to [-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]
# (ratio within about [2e-9, 4.9e8]): finite values and gradients for any finite input.
LOG_RATIO_LIMIT = 20.0


# --------------------------------------------------------------------------- advantages


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], eps: float = 1e-6, scale: bool = True,
    ddof: int = 0,
) -> list[float]:
    """GRPO advantages: each reward normalised within its group (same prompt).

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with the group's standard deviation, the
    population one (``ddof=0``, this project's default, ``algo.adv_std=population``) or the
    sample one (``ddof=1``, MindSpeed-RL's ``group_norm``, ``algo.adv_std=sample``), or
    ``A_i = r_i - mean_g`` when ``scale=False``. A group whose rewards are all equal
    (including a group of one) gets exactly 0. Groups need not be contiguous; the output is
    aligned with ``rewards``.
    """
    if ddof not in (0, 1):
        raise ValueError(f"ddof={ddof!r} must be 0 (population std) or 1 (sample std)")
    if len(rewards) != len(group_ids):
        raise ValueError(f"rewards ({len(rewards)}) and group_ids ({len(group_ids)}) differ in length")
    if not eps >= 0:
        raise ValueError(f"eps={eps!r} must be >= 0")
    values = [float(r) for r in rewards]
    for i, r in enumerate(values):
        if not math.isfinite(r):
            raise ValueError(f"reward {i} is {r!r}; rewards must be finite")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        members[gid].append(i)
    advantages = [0.0] * len(values)
    for rows in members.values():
        group = [values[i] for i in rows]
        if max(group) == min(group):
            continue  # all equal: no signal, exactly zero (no rounding residue of the mean)
        mean = math.fsum(group) / len(group)
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in group) / (len(group) - ddof))
        for i in rows:
            centred = values[i] - mean
            advantages[i] = centred / (std + eps) if scale else centred
    return advantages


# --------------------------------------------------------------------------- config


@dataclass
class GRPOLossKeys:
    """The GRPO loss keys and their defaults, declared here and nowhere else.

    They are the fields of :class:`GRPOLossConfig` and, through
    ``config/schema.AlgoConfig`` (which extends this class), the ``algo`` keys of the
    typed config tree, so the YAML keys and the loss's cannot drift apart. Plain and
    mutable because OmegaConf merges YAML and overrides into it as a structured config
    (hence ``Optional[float]``, which OmegaConf reads, rather than ``float | None``);
    nothing is checked here: :class:`GRPOLossConfig` checks.

    ``tis_cap``: cap C on the importance weight ``exp(proximal - behaviour)``; required
    (a number >= 1) for ``tis``; ``None`` leaves the ``decoupled`` weight uncapped.
    ``proximal_from_current``: when no proximal log-probs are given, use the current
    log-probs, detached. Exact when the batch gets one optimizer update from the weights
    it is evaluated at (what ``HFTrainingEngine.train_step`` does).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    off_policy: str = "tis"
    tis_cap: Optional[float] = 2.0
    loss_agg: str = "token_mean"
    proximal_from_current: bool = False


# Not frozen only because a dataclass cannot be frozen over a mutable base; nothing
# assigns to a loss config after it is built.
@dataclass
class GRPOLossConfig(GRPOLossKeys):
    """The GRPO loss keys (:class:`GRPOLossKeys`), checked when built: a bad value raises
    ValueError naming it and the valid ones (see docs/grpo.md for when to use which)."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "GRPOLossConfig":
        """The loss keys of ``values`` (e.g. the ``algo`` config node as a dict); keys that
        are not the loss's, such as ``scale_advantages``, are ignored, missing ones default."""
        return cls(**{f.name: values[f.name] for f in fields(GRPOLossKeys) if f.name in values})

    def __post_init__(self) -> None:
        if self.off_policy not in OFF_POLICY_MODES:
            raise ValueError(f"off_policy={self.off_policy!r} is not one of {', '.join(OFF_POLICY_MODES)}")
        if self.loss_agg not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg={self.loss_agg!r} is not one of {', '.join(LOSS_AGG_MODES)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator={self.kl_estimator!r} is not one of {', '.join(KL_ESTIMATORS)}")
        if not (isinstance(self.clip_ratio_low, (int, float)) and 0.0 <= self.clip_ratio_low < 1.0):
            raise ValueError(f"clip_ratio_low={self.clip_ratio_low!r} must be a number in [0, 1)")
        if not (isinstance(self.clip_ratio_high, (int, float)) and 0.0 <= self.clip_ratio_high < math.inf):
            raise ValueError(f"clip_ratio_high={self.clip_ratio_high!r} must be a finite number >= 0")
        if not (isinstance(self.kl_coef, (int, float)) and 0.0 <= self.kl_coef < math.inf):
            raise ValueError(f"kl_coef={self.kl_coef!r} must be a finite number >= 0")
        if self.tis_cap is None:
            if self.off_policy == "tis":
                raise ValueError("tis_cap=None is not valid with off_policy='tis'; use a number >= 1 "
                                 "(or off_policy='decoupled' for an uncapped weight)")
        elif not (isinstance(self.tis_cap, (int, float)) and 1.0 <= self.tis_cap < math.inf):
            raise ValueError(f"tis_cap={self.tis_cap!r} must be a finite number >= 1, or None (decoupled only)")


# --------------------------------------------------------------------------- loss


def _aggregate(token_values, mask, loss_agg: str):
    """Reduce ``[B, T]`` per-token values over the real tokens, per ``loss_agg``.

    Rows without tokens are left out of the sequence means; with no real token at all
    the result is 0 (still attached to the graph).
    """
    import torch

    masked = torch.where(mask, token_values, torch.zeros_like(token_values))
    counts = mask.sum(dim=-1)
    if loss_agg == "token_mean":
        return masked.sum() / counts.sum().clamp(min=1)
    rows = counts > 0
    per_seq = masked.sum(dim=-1)
    if loss_agg == "seq_mean_token_mean":
        per_seq = per_seq / counts.clamp(min=1)
    per_seq = torch.where(rows, per_seq, torch.zeros_like(per_seq))
    return per_seq.sum() / rows.sum().clamp(min=1)


def _token_mean(token_values, mask) -> float:
    import torch

    with torch.no_grad():
        masked = torch.where(mask, token_values, torch.zeros_like(token_values))
        return float(masked.sum() / mask.sum().clamp(min=1))


def kl_penalty(logprobs, ref_logprobs, estimator: str = "k3"):
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

    With ``d = ref - logp`` (clamped to +-20 for exp): k1 = -d, k2 = d^2 / 2,
    k3 = exp(d) - d - 1 (non-negative, unbiased, low variance).
    """
    import torch

    d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    raise ValueError(f"kl_estimator={estimator!r} is not one of {', '.join(KL_ESTIMATORS)}")


def grpo_loss(
    logprobs,
    mask,
    advantages,
    behaviour_logprobs,
    cfg: GRPOLossConfig,
    proximal_logprobs=None,
    ref_logprobs=None,
):
    """The GRPO policy loss on padded tensors; returns ``(loss, metrics)``.

    ``logprobs`` [B, T] (differentiable), ``mask`` [B, T] (bool, real tokens),
    ``advantages`` [B] (or [B, T]), ``behaviour_logprobs``, ``proximal_logprobs``,
    ``ref_logprobs`` [B, T]. Masked positions of every input are replaced by 0 before
    any arithmetic (``torch.where``), so they may hold anything, inf and nan included,
    and get zero gradient. ``proximal`` and ``ref`` are used detached.
    """
    import torch

    if cfg.kl_coef > 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} > 0 needs ref_logprobs (log-probs of the reference policy)")
    if cfg.off_policy == "decoupled" and proximal_logprobs is None and not cfg.proximal_from_current:
        raise ValueError("off_policy='decoupled' needs proximal_logprobs (log-probs of the trainer's weights "
                         "at the start of the step), or proximal_from_current=True")
    t = _Masked(logprobs, mask)
    logp = t.clean(logprobs, "logprobs", detach=False)
    behaviour = t.clean(behaviour_logprobs, "behaviour_logprobs")
    adv = t.advantages(advantages)
    if proximal_logprobs is not None:
        proximal = t.clean(proximal_logprobs, "proximal_logprobs")
    elif cfg.proximal_from_current and cfg.off_policy != "none":
        proximal = logp.detach()
    else:
        proximal = None
    old, weight, capped = _importance_weights(cfg, t, behaviour, proximal)

    ratio = _exp_clamped(logp - old)
    clipped_ratio = ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * clipped_ratio
    is_clipped = (clipped_loss > unclipped_loss) & t.mask  # the clip is active: no gradient
    pg_tokens = weight * torch.where(is_clipped, clipped_loss, unclipped_loss)

    token_loss = pg_tokens
    kl_tokens = None
    if cfg.kl_coef > 0:
        ref = t.clean(ref_logprobs, "ref_logprobs")
        kl_tokens = torch.where(t.mask, kl_penalty(logp, ref, cfg.kl_estimator), t.zeros)
        token_loss = pg_tokens + cfg.kl_coef * kl_tokens

    loss = _aggregate(token_loss, t.mask, cfg.loss_agg)
    terms = {"pg_tokens": pg_tokens, "is_clipped": is_clipped, "ratio": ratio, "weight": weight, "capped": capped,
             "kl_tokens": kl_tokens}
    return loss, _loss_metrics(cfg, t, loss, logp, behaviour, terms)


class _Masked:
    """The loss's inputs on the mask's shape, device and (at least float32) dtype, with
    masked positions replaced by 0 before any arithmetic."""

    def __init__(self, logprobs, mask):
        import torch

        self.mask = mask.to(dtype=torch.bool, device=logprobs.device)
        if logprobs.shape != self.mask.shape:
            raise ValueError(f"logprobs {tuple(logprobs.shape)} and mask {tuple(self.mask.shape)} differ in shape")
        self.device = logprobs.device
        self.dtype = torch.promote_types(logprobs.dtype, torch.float32)
        self.zeros = torch.zeros(self.mask.shape, dtype=self.dtype, device=self.device)

    def clean(self, x, name: str, detach: bool = True):
        import torch

        x = torch.as_tensor(x, device=self.device).to(self.dtype)
        if x.shape != self.mask.shape:
            raise ValueError(f"{name} {tuple(x.shape)} does not match mask {tuple(self.mask.shape)}")
        return torch.where(self.mask, x.detach() if detach else x, self.zeros)

    def advantages(self, advantages):
        """[B] (one per sequence, broadcast over its tokens) or [B, T], detached."""
        import torch

        adv = torch.as_tensor(advantages, device=self.device).to(self.dtype).detach()
        if adv.dim() == 1:
            adv = adv.unsqueeze(-1).expand(self.mask.shape)
        if adv.shape != self.mask.shape:
            raise ValueError(f"advantages {tuple(adv.shape)} is neither [B] nor [B, T] for mask "
                             f"{tuple(self.mask.shape)}")
        return torch.where(self.mask, adv, self.zeros)


def _exp_clamped(x):
    import torch

    return torch.exp(x.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def _importance_weights(cfg: GRPOLossConfig, t: _Masked, behaviour, proximal) -> tuple:
    """``(old, weight, capped)``: the policy the clipped ratio is taken against, the
    detached importance weight per token (1 where masked) and where the TIS cap cut it."""
    import torch

    weight = torch.ones_like(t.zeros)
    capped = torch.zeros(t.mask.shape, dtype=torch.bool, device=t.device)
    if cfg.off_policy == "none" or proximal is None:  # "none", or "tis" without proximal
        old = behaviour
    else:  # "tis" or "decoupled" with proximal
        old = proximal
        weight = _exp_clamped(proximal - behaviour)
        if cfg.tis_cap is not None:
            capped = weight > cfg.tis_cap
            weight = weight.clamp(max=cfg.tis_cap)
    return old, torch.where(t.mask, weight, torch.ones_like(weight)).detach(), capped


def _loss_metrics(cfg: GRPOLossConfig, t: _Masked, loss, logp, behaviour, terms: dict) -> dict:
    """The loss's metrics, without gradient: the loss, the policy-gradient part, the clip
    and cap fractions, ratio and weight means, k3 KL to the behaviour policy, the KL term."""
    import torch

    mask = t.mask
    with torch.no_grad():
        log_ratio_b = (logp - behaviour).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        approx_kl = torch.exp(log_ratio_b) - log_ratio_b - 1.0  # k3 of KL(mu || pi_theta), samples from mu
        metrics = {
            "loss": float(loss.detach()),
            "pg_loss": float(_aggregate(terms["pg_tokens"], mask, cfg.loss_agg)),
            "clip_fraction": _token_mean(terms["is_clipped"].to(t.dtype), mask),
            "ratio_mean": _token_mean(terms["ratio"], mask),
            "is_weight_mean": _token_mean(terms["weight"], mask),
            "is_weight_capped_fraction": _token_mean(terms["capped"].to(t.dtype), mask),
            "approx_kl": _token_mean(approx_kl, mask),
        }
        if terms["kl_tokens"] is not None:
            metrics["kl"] = _token_mean(terms["kl_tokens"], mask)
    return metrics


# --------------------------------------------------------------------------- engine adapter

# metrics that are token means (rescaled like token_mean under global_norm)
_TOKEN_METRICS = ("clip_fraction", "ratio_mean", "is_weight_mean", "is_weight_capped_fraction", "approx_kl", "kl")


def _pad_rows(rows: Sequence[Sequence[float]], lengths: Sequence[int], name: str, index, shape, dtype, device):
    import torch

    B, T = shape
    out = torch.zeros((B, T), dtype=dtype)
    for b, (i, row, n) in enumerate(zip(index, rows, lengths)):
        if row is None:
            raise ValueError(f"extras[{name!r}][{i}] is None")
        row = torch.as_tensor(row, dtype=dtype).flatten()
        if row.numel() != n:
            raise ValueError(f"extras[{name!r}][{i}] has {row.numel()} values for a response of {n} tokens")
        out[b, :n] = row
    return out.to(device)


def make_loss_fn(cfg: GRPOLossConfig, global_norm: bool = True):
    """``loss_fn(values, mask, batch, index)`` for the training engines.

    Reads ``batch.extras``: ``advantages`` (float per sample), ``behaviour_logprobs``
    (per-token list per sample), optionally ``proximal_logprobs`` and ``ref_logprobs``
    (same layout). Rows ``index`` are right-padded to ``values.shape``; each list must have
    exactly as many entries as the row's real tokens in ``mask``.

    ``global_norm``: the engine adds ``loss * len(index) / len(batch)`` over
    micro-batches. With ``global_norm=True`` the micro-batch loss is rescaled so that sum
    equals ``grpo_loss`` over the whole batch (the gradient does not depend on the
    micro-batch size): by ``(n / m) * tokens_mb / tokens_all`` for ``token_mean`` and
    ``(n / m) * rows_mb / rows_all`` for the sequence means (rows with >= 1 token). The
    token-mean metrics are rescaled the same way, so the engine's sums are batch token
    means. With one micro-batch holding the whole batch the factor is exactly 1.
    """
    import torch

    def loss_fn(values, mask, batch, index):
        extras = batch.extras
        index = list(index)
        for key in ("advantages", "behaviour_logprobs"):
            if key not in extras:
                raise ValueError(f"batch.extras has no {key!r} (keys: {sorted(extras)})")
        mask_b = mask.to(dtype=torch.bool)
        lengths = [int(n) for n in mask_b.sum(dim=-1).tolist()]
        dtype = torch.promote_types(values.dtype, torch.float32)

        def gather(name):
            if extras.get(name) is None:
                return None
            return _pad_rows([extras[name][i] for i in index], lengths, name, index, values.shape, dtype,
                             values.device)

        advantages = torch.tensor([float(extras["advantages"][i]) for i in index], dtype=dtype, device=values.device)
        loss, metrics = grpo_loss(
            values, mask_b, advantages, gather("behaviour_logprobs"), cfg,
            proximal_logprobs=gather("proximal_logprobs"), ref_logprobs=gather("ref_logprobs"),
        )
        if global_norm:
            n, m = len(batch), len(index)
            all_lengths = [len(r) for r in batch.response_ids]
            tokens_all = sum(all_lengths)
            token_factor = (n / m) * sum(lengths) / tokens_all if tokens_all else 0.0
            if cfg.loss_agg == "token_mean":
                loss_factor = token_factor
            else:
                rows_all = sum(1 for x in all_lengths if x > 0)
                loss_factor = (n / m) * sum(1 for x in lengths if x > 0) / rows_all if rows_all else 0.0
            loss = loss * loss_factor
            metrics = {
                key: value * (token_factor if key in _TOKEN_METRICS else loss_factor) for key, value in metrics.items()
            }
        return loss, metrics

    return loss_fn


__all__ = [
    "GRPOLossConfig", "GRPOLossKeys", "KL_ESTIMATORS", "LOSS_AGG_MODES", "OFF_POLICY_MODES", "group_advantages", "grpo_loss",
    "kl_penalty", "make_loss_fn",
]
