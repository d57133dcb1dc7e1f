"""GRPO loss with off-policy correction: hand-computed cases (see docs/grpo.md)."""
import math

import pytest
import torch

from mindspeed_rl_asp.algo.grpo import (
    GRPOLossConfig,
    group_advantages,
    grpo_loss,
    kl_penalty,
    make_loss_fn,
)
from mindspeed_rl_asp.engines.base import TrainBatch

LN = math.log


def cfg(**kw):
    return GRPOLossConfig(**kw)


# ----------------------------------------------------------------------------- advantages


def test_group_advantages_hand_example():
    # groups interleaved: a = [1, 0, 0, 1], b = [0.5, 0.5], c = [5, 1, 0], d = [2], e = [0.1] * 3
    rewards = [1.0, 0.0, 0.5, 0.0, 0.5, 1.0, 5.0, 2.0, 1.0, 0.1, 0.1, 0.1, 0.0]
    groups = ["a", "a", "b", "a", "b", "a", "c", "d", "c", "e", "e", "e", "c"]
    adv = group_advantages(rewards, groups, eps=0.0)
    # a = [1, 0, 0, 1]: mean 0.5, population std 0.5 -> +-1
    assert [adv[i] for i in (0, 1, 3, 5)] == pytest.approx([1.0, -1.0, -1.0, 1.0])
    # b = [0.5, 0.5]: all equal -> 0; d = [2]: single -> 0; e = [0.1]*3: exactly 0 (no rounding residue)
    assert adv[2] == adv[4] == adv[7] == 0.0
    assert adv[9] == adv[10] == adv[11] == 0.0
    # c = [5, 1, 0]: mean 2, deviations [3, -1, -2], population var 14/3
    std = math.sqrt(14 / 3)
    assert [adv[6], adv[8], adv[12]] == pytest.approx([3 / std, -1 / std, -2 / std])

    centred = group_advantages(rewards, groups, scale=False)
    assert [centred[6], centred[8], centred[12]] == pytest.approx([3.0, -1.0, -2.0])
    assert centred[0] == pytest.approx(0.5) and centred[2] == 0.0

    with_eps = group_advantages([1.0, 0.0], ["g", "g"], eps=1e-6)
    assert with_eps == pytest.approx([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6)], rel=1e-12)


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="length"):
        group_advantages([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="nan"):
        group_advantages([1.0, float("nan")], ["a", "a"])


# ----------------------------------------------------------------------------- hand loss, 2 x 3

BEHAVIOUR = [[-1.0, -2.0, -0.5], [-0.7, -1.3, -2.2]]
RATIOS = [[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]]
ADV = [1.0, -2.0]


def hand_inputs():
    b = torch.tensor(BEHAVIOUR, dtype=torch.float64)
    logp = (b + torch.log(torch.tensor(RATIOS, dtype=torch.float64))).requires_grad_(True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    return logp, mask, torch.tensor(ADV, dtype=torch.float64), b


def test_ppo_clip_hand_example():
    # eps = 0.2: A=+1: r=1 -> -1, r=1.5 -> clipped -1.2, r=0.5 -> -0.5 (unclipped: min(0.5, 0.8))
    #            A=-2: r=1 -> 2, r=1.5 -> 3 (unclipped: min(-3, -2.4)), r=0.5 -> clipped 1.6
    logp, mask, adv, b = hand_inputs()
    loss, m = grpo_loss(logp, mask, adv, b, cfg(off_policy="none"))
    assert loss.item() == pytest.approx((-1 - 1.2 - 0.5 + 2 + 3 + 1.6) / 6)  # 0.65
    assert m["loss"] == pytest.approx(0.65)
    assert m["clip_fraction"] == pytest.approx(2 / 6)
    assert m["ratio_mean"] == pytest.approx(1.0)
    assert m["is_weight_mean"] == 1.0
    # approx_kl = mean(r - 1 - ln r)
    assert m["approx_kl"] == pytest.approx(2 * (0.5 - LN(1.5) + -0.5 - LN(0.5)) / 6)
    loss.backward()
    # d loss / d logp = -A * r / 6 where unclipped, 0 where clipped
    expected = torch.tensor([[-1 / 6, 0.0, -0.5 / 6], [2 / 6, 3 / 6, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected)


def test_asymmetric_clip_high():
    # clip_ratio_high=0.28: A=+1, r=1.5 -> -1.28 instead of -1.2
    logp, mask, adv, b = hand_inputs()
    loss, _ = grpo_loss(logp, mask, adv, b, cfg(off_policy="none", clip_ratio_high=0.28))
    assert loss.item() == pytest.approx((-1 - 1.28 - 0.5 + 2 + 3 + 1.6) / 6)


@pytest.mark.parametrize(
    "agg, expected",
    [
        ("token_mean", 3.9 / 6),
        ("seq_mean_token_mean", ((-2.7 / 3) + (6.6 / 3)) / 2),
        ("seq_mean_token_sum", (-2.7 + 6.6) / 2),
    ],
)
def test_loss_agg_equal_lengths(agg, expected):
    logp, mask, adv, b = hand_inputs()
    loss, _ = grpo_loss(logp, mask, adv, b, cfg(off_policy="none", loss_agg=agg))
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "agg, expected",
    [
        # on-policy, token loss = -A: row 0 (A=1, 3 tokens): -1,-1,-1; row 1 (A=-2, 1 token): 2; row 2 empty
        ("token_mean", (-3 + 2) / 4),
        ("seq_mean_token_mean", (-1 + 2) / 2),
        ("seq_mean_token_sum", (-3 + 2) / 2),
    ],
)
def test_loss_agg_unequal_lengths(agg, expected):
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    logp = torch.tensor([[-1.0, -0.3, -2.0], [-0.1, 9.0, 9.0], [4.0, 4.0, 4.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, mask, torch.tensor([1.0, -2.0, 7.0]), logp.detach(), cfg(loss_agg=agg))
    assert loss.item() == pytest.approx(expected)


# ----------------------------------------------------------------------------- gradient sign


def test_positive_advantage_increases_token_logprob():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, requires_grad=True)
    tokens = torch.tensor([[3], [1]])
    opt = torch.optim.SGD([logits], lr=0.5)

    def logp():
        return torch.log_softmax(logits, -1).gather(-1, tokens)

    before = logp().detach()
    loss, _ = grpo_loss(logp(), torch.ones(2, 1, dtype=torch.bool), torch.tensor([1.0, -1.0]), before, cfg())
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = logp().detach()
    assert after[0, 0] > before[0, 0]  # positive advantage: more likely
    assert after[1, 0] < before[1, 0]  # negative advantage: less likely


# ----------------------------------------------------------------------------- on-policy equivalence


def test_on_policy_all_variants_equal_plain_policy_gradient():
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    base = torch.randn(3, 4) - 1.0
    adv = torch.tensor([0.7, -1.3, 2.0])
    n = mask.sum()
    expected_grad = torch.where(mask, -adv[:, None].expand(3, 4) / n, torch.zeros(3, 4))
    expected_loss = -(adv[:, None] * mask).sum() / n
    results = []
    for variant, prox in [("none", None), ("tis", None), ("tis", base), ("decoupled", base)]:
        logp = base.clone().requires_grad_(True)
        loss, m = grpo_loss(logp, mask, adv, base, cfg(off_policy=variant), proximal_logprobs=prox)
        loss.backward()
        assert loss.item() == pytest.approx(expected_loss.item())
        assert torch.allclose(logp.grad, expected_grad)
        assert m["clip_fraction"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0)
        assert m["is_weight_mean"] == pytest.approx(1.0) and m["approx_kl"] == pytest.approx(0.0, abs=1e-7)
        results.append(loss.item())
    assert len(set(results)) == 1


def test_decoupled_with_proximal_equal_to_behaviour_equals_none():
    torch.manual_seed(2)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    behaviour = torch.randn(2, 4) - 1.0
    current = behaviour + 0.4 * torch.randn(2, 4)  # ratios both inside and outside the clip range
    adv = torch.tensor([1.5, -0.5])
    out = {}
    for variant, prox in [("none", None), ("decoupled", behaviour)]:
        logp = current.clone().requires_grad_(True)
        loss, m = grpo_loss(logp, mask, adv, behaviour, cfg(off_policy=variant), proximal_logprobs=prox)
        loss.backward()
        out[variant] = (loss.item(), logp.grad.clone(), m["clip_fraction"])
    assert out["none"][2] > 0  # the example exercises the clip
    assert out["decoupled"][0] == pytest.approx(out["none"][0])
    assert torch.allclose(out["decoupled"][1], out["none"][1])


# ----------------------------------------------------------------------------- off-policy weights


def test_tis_cap_applied():
    # logp == proximal (ratio 1); exp(prox - behaviour) = 3 (capped to 2) and 0.5 (kept)
    prox = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    behaviour = prox - torch.tensor([[LN(3.0), LN(0.5)]], dtype=torch.float64)
    logp = prox.clone().requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = grpo_loss(logp, mask, torch.tensor([1.0]), behaviour, cfg(off_policy="tis", tis_cap=2.0),
                        proximal_logprobs=prox)
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2)
    assert m["is_weight_mean"] == pytest.approx(1.25)
    assert m["is_weight_capped_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -0.25]], dtype=torch.float64))  # -w * A / 2

    # decoupled uncapped keeps the weight 3; decoupled with the default cap truncates like tis
    loss_unc, m_unc = grpo_loss(prox.clone(), mask, torch.tensor([1.0]), behaviour,
                                cfg(off_policy="decoupled", tis_cap=None), proximal_logprobs=prox)
    assert loss_unc.item() == pytest.approx(-(3.0 + 0.5) / 2) and m_unc["is_weight_capped_fraction"] == 0.0
    loss_cap, _ = grpo_loss(prox.clone(), mask, torch.tensor([1.0]), behaviour, cfg(off_policy="decoupled"),
                            proximal_logprobs=prox)
    assert loss_cap.item() == pytest.approx(loss.item())


def test_tis_without_proximal_is_plain_clip_against_behaviour():
    logp, mask, adv, b = hand_inputs()
    loss_tis, m = grpo_loss(logp, mask, adv, b, cfg(off_policy="tis"))
    loss_none, _ = grpo_loss(logp, mask, adv, b, cfg(off_policy="none"))
    assert loss_tis.item() == pytest.approx(loss_none.item()) == pytest.approx(0.65)
    assert m["is_weight_mean"] == 1.0


def test_decoupled_hand_example():
    # logp - prox = ln 1.5 (clipped to 1.2 for A>0), prox - behaviour = ln 0.5 -> loss = -0.5 * 1.2
    b = torch.tensor([[-1.0]], dtype=torch.float64)
    prox = b + LN(0.5)
    logp = (prox + LN(1.5)).requires_grad_(True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, m = grpo_loss(logp, mask, torch.tensor([1.0]), b, cfg(off_policy="decoupled"), proximal_logprobs=prox)
    assert loss.item() == pytest.approx(-0.6)
    assert m["clip_fraction"] == 1.0 and m["ratio_mean"] == pytest.approx(1.5)
    assert m["is_weight_mean"] == pytest.approx(0.5)
    # approx_kl against behaviour: logp - b = ln 0.75
    assert m["approx_kl"] == pytest.approx(0.75 - 1 - LN(0.75))


def test_decoupled_requires_proximal():
    logp, mask, adv, b = hand_inputs()
    with pytest.raises(ValueError, match="proximal_logprobs"):
        grpo_loss(logp, mask, adv, b, cfg(off_policy="decoupled"))


def test_proximal_from_current_equals_explicit_detached_current():
    torch.manual_seed(3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    behaviour = torch.randn(2, 3) - 1.0
    current = behaviour + 0.5 * torch.randn(2, 3)
    adv = torch.tensor([1.0, -1.0])
    grads = []
    for kw, prox in [(dict(proximal_from_current=True), None), ({}, current)]:
        logp = current.clone().requires_grad_(True)
        loss, m = grpo_loss(logp, mask, adv, behaviour, cfg(off_policy="decoupled", **kw), proximal_logprobs=prox)
        loss.backward()
        grads.append((loss.item(), logp.grad.clone()))
        assert m["clip_fraction"] == 0.0  # ratio against the current policy is exactly 1
    assert grads[0][0] == pytest.approx(grads[1][0])
    assert torch.allclose(grads[0][1], grads[1][1])
    # that is the truncated-IS policy gradient: -min(exp(logp - b), 2) * A / N
    w = torch.exp(current - behaviour).clamp(max=2.0)
    assert torch.allclose(grads[0][1], -w * adv[:, None] / 6)


# ----------------------------------------------------------------------------- KL


def test_k3_kl_hand_value_and_zero():
    logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    ref = logp.detach() + LN(2.0)  # ref - logp = ln 2
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(1 - LN(2.0))  # 2 - ln2 - 1
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(-LN(2.0))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * LN(2.0) ** 2)

    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, m = grpo_loss(logp, mask, torch.tensor([0.0]), logp.detach(), cfg(kl_coef=0.1), ref_logprobs=ref)
    assert loss.item() == pytest.approx(0.1 * (1 - LN(2.0)))
    assert m["kl"] == pytest.approx(1 - LN(2.0)) and m["pg_loss"] == pytest.approx(0.0)
    loss.backward()
    assert logp.grad.item() == pytest.approx(0.1 * (1 - 2.0))  # d/dlogp k3 = 1 - exp(ref - logp)

    for est in ("k1", "k2", "k3"):
        x = torch.randn(2, 3)
        assert torch.equal(kl_penalty(x, x, est), torch.zeros(2, 3))
        loss0, m0 = grpo_loss(x, torch.ones(2, 3, dtype=torch.bool), torch.zeros(2), x,
                              cfg(kl_coef=0.5, kl_estimator=est), ref_logprobs=x)
        assert loss0.item() == 0.0 and m0["kl"] == 0.0


def test_kl_requires_ref():
    logp, mask, adv, b = hand_inputs()
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logp, mask, adv, b, cfg(kl_coef=0.1))


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("variant", ["none", "tis", "decoupled"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_padding_is_irrelevant(variant, agg):
    torch.manual_seed(4)
    lengths = [3, 1]
    behaviour = torch.randn(2, 3) - 1.0
    current = behaviour + 0.5 * torch.randn(2, 3)
    prox = behaviour + 0.3 * torch.randn(2, 3)
    ref = behaviour + 0.2 * torch.randn(2, 3)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    c = cfg(off_policy=variant, loss_agg=agg, kl_coef=0.1)

    def run(width, fill):
        pad = width - 3
        m = torch.cat([mask, torch.zeros(2, pad, dtype=torch.bool)], 1)

        def widen(x):
            y = torch.cat([x, torch.full((2, pad), fill)], 1)
            for i, n in enumerate(lengths):
                y[i, n:] = fill
            return y

        logp = widen(current).requires_grad_(True)
        loss, metrics = grpo_loss(logp, m, adv, widen(behaviour), c, proximal_logprobs=widen(prox),
                                  ref_logprobs=widen(ref))
        loss.backward()
        return loss.item(), logp.grad, metrics

    ref_loss, ref_grad, ref_metrics = run(3, 0.0)
    for width, fill in [(5, 37.0), (5, -1e4), (6, float("nan")), (4, float("inf")), (4, -float("inf"))]:
        loss, grad, metrics = run(width, fill)
        assert loss == pytest.approx(ref_loss)
        wide_mask = torch.cat([mask, torch.zeros(2, width - 3, dtype=torch.bool)], 1)
        assert torch.allclose(grad[:, :3][mask], ref_grad[mask])
        assert torch.all(grad[~wide_mask] == 0)  # finite zeros, even next to nan/inf inputs
        assert all(math.isfinite(v) for v in metrics.values())
        assert metrics == pytest.approx(ref_metrics)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kw, bad, valid",
    [
        (dict(off_policy="is"), "'is'", "decoupled"),
        (dict(loss_agg="mean"), "'mean'", "seq_mean_token_sum"),
        (dict(kl_estimator="k4"), "'k4'", "k3"),
        (dict(clip_ratio_low=1.5), "1.5", "[0, 1)"),
        (dict(clip_ratio_high=-0.1), "-0.1", ">= 0"),
        (dict(kl_coef=-1.0), "-1.0", ">= 0"),
        (dict(tis_cap=0.5), "0.5", ">= 1"),
        (dict(tis_cap=None), "None", "off_policy='tis'"),
    ],
)
def test_bad_config_values_raise_naming_them(kw, bad, valid):
    with pytest.raises(ValueError) as err:
        GRPOLossConfig(**kw)
    assert bad in str(err.value) and valid in str(err.value)


def test_config_defaults_and_decoupled_uncapped_ok():
    c = GRPOLossConfig()
    assert (c.clip_ratio_low, c.clip_ratio_high, c.kl_coef, c.kl_estimator, c.off_policy, c.tis_cap, c.loss_agg) == (
        0.2, 0.2, 0.0, "k3", "tis", 2.0, "token_mean")
    assert GRPOLossConfig(off_policy="decoupled", tis_cap=None).tis_cap is None


# ----------------------------------------------------------------------------- engine adapter


def make_batch():
    behaviour = [[-1.0, -2.0, -0.5], [-0.7], [-0.3, -1.1]]
    return TrainBatch(
        prompt_ids=[[1, 2], [3], [4, 5, 6]],
        response_ids=[[7, 8, 9], [10], [11, 12]],
        extras={
            "advantages": [1.0, -2.0, 0.5],
            "behaviour_logprobs": behaviour,
            "proximal_logprobs": [[v + 0.1 for v in row] for row in behaviour],
            "ref_logprobs": [[v - 0.2 for v in row] for row in behaviour],
            "versions": [3, 2, 3],
        },
    )


def engine_values(batch, index, garbage=5.0):
    lengths = [len(batch.response_ids[i]) for i in index]
    T = max(lengths)
    values = torch.full((len(index), T), garbage)
    mask = torch.zeros(len(index), T, dtype=torch.bool)
    for b, i in enumerate(index):
        n = lengths[b]
        values[b, :n] = torch.tensor(batch.extras["behaviour_logprobs"][i]) + 0.05 * (b + 1)
        mask[b, :n] = True
    return values.requires_grad_(True), mask


def test_make_loss_fn_matches_grpo_loss_on_micro_batch():
    batch = make_batch()
    c = GRPOLossConfig(off_policy="decoupled", kl_coef=0.05)
    index = [0, 2]
    values, mask = engine_values(batch, index)
    loss, metrics = make_loss_fn(c, global_norm=False)(values, mask, batch, index)
    loss.backward()
    assert values.grad is not None and torch.all(values.grad[~mask] == 0)

    b = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.1, 0.0]])
    direct, direct_metrics = grpo_loss(values.detach(), mask, torch.tensor([1.0, 0.5]), b, c,
                                       proximal_logprobs=b + 0.1, ref_logprobs=b - 0.2)
    assert loss.item() == pytest.approx(direct.item())
    assert metrics == pytest.approx(direct_metrics)
    assert set(metrics) >= {"loss", "clip_fraction", "ratio_mean", "is_weight_mean", "approx_kl", "kl"}


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_make_loss_fn_global_norm_is_micro_batch_invariant(agg):
    batch = make_batch()
    c = GRPOLossConfig(off_policy="tis", loss_agg=agg)
    fn = make_loss_fn(c)
    n = len(batch)
    # full batch in one micro-batch: factor 1
    values, mask = engine_values(batch, [0, 1, 2])
    full, full_metrics = fn(values, mask, batch, [0, 1, 2])
    full.backward()
    plain, _ = make_loss_fn(c, global_norm=False)(values, mask, batch, [0, 1, 2])
    assert full.item() == pytest.approx(plain.item())
    # micro-batches of 2 and 1, accumulated the way HFTrainingEngine.train_step does
    total, grads, totals = 0.0, {}, {}
    for index in ([0, 1], [2]):
        v, m = engine_values(batch, index)
        # same per-row current log-probs as in the full batch
        with torch.no_grad():
            for b, i in enumerate(index):
                v[b, : m[b].sum()] = values[i, : m[b].sum()]
        loss, metrics = fn(v, m, batch, index)
        (loss * len(index) / n).backward()
        total += loss.item() * len(index) / n
        for b, i in enumerate(index):
            grads[i] = v.grad[b, : m[b].sum()]
        for k, x in metrics.items():
            totals[k] = totals.get(k, 0.0) + x * len(index) / n
    assert total == pytest.approx(full.item())
    for i in range(n):
        k = len(batch.response_ids[i])
        assert torch.allclose(grads[i], values.grad[i, :k])
    assert totals == pytest.approx(full_metrics)


def test_make_loss_fn_errors():
    batch = make_batch()
    values, mask = engine_values(batch, [0, 1])
    bad = TrainBatch(batch.prompt_ids, batch.response_ids, dict(batch.extras))
    bad.extras["behaviour_logprobs"] = [[-1.0, -2.0], [-0.7], [-0.3, -1.1]]
    with pytest.raises(ValueError, match=r"behaviour_logprobs.*\[0\] has 2 values for a response of 3"):
        make_loss_fn(GRPOLossConfig())(values, mask, bad, [0, 1])
    missing = TrainBatch(batch.prompt_ids, batch.response_ids, {"advantages": [0.0] * 3})
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        make_loss_fn(GRPOLossConfig())(values, mask, missing, [0, 1])
    no_prox = TrainBatch(batch.prompt_ids, batch.response_ids,
                         {k: v for k, v in batch.extras.items() if k != "proximal_logprobs"})
    with pytest.raises(ValueError, match="proximal_logprobs"):
        make_loss_fn(GRPOLossConfig(off_policy="decoupled"))(values, mask, no_prox, [0, 1])
