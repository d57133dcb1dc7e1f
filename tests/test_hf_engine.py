"""The hf engine: sampling log-probs equal the trainer's, weights move by version."""
import pytest
import torch

from mindspeed_rl_asp.engines.base import (EngineError, GenerationEngine, SamplingParams, TrainBatch,
                                           TrainingEngine)
from mindspeed_rl_asp.engines.hf import HFGenerationEngine, HFTrainingEngine, nll_loss, pad_batch
from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset


@pytest.fixture(scope="module")
def prompts(random_policy_dir):
    from mindspeed_rl_asp.engines.hf import load_tokenizer

    tok = load_tokenizer(random_policy_dir)
    items = make_dataset(6, 0, MazeTaskSpec(min_size=3, max_size=5))
    return [tok(it.prompt, add_special_tokens=False)["input_ids"] for it in items]


@pytest.fixture(scope="module")
def generator(random_policy_dir):
    return HFGenerationEngine(random_policy_dir, num_threads=1)


@pytest.fixture()
def trainer(random_policy_dir):
    return HFTrainingEngine(random_policy_dir, num_threads=1, lr=1e-2, micro_batch_size=4)


def test_engines_satisfy_protocols(generator, trainer):
    assert isinstance(generator, GenerationEngine) and isinstance(trainer, TrainingEngine)


def test_pad_batch_layout():
    ids, att, pos, mask = pad_batch([[5, 6], [7]], [[8], [9, 10]], pad_id=0)
    assert ids.tolist() == [[5, 6, 8, 0], [0, 7, 9, 10]]
    assert att.tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    assert pos[1, 1:].tolist() == [0, 1, 2] and pos[0, :3].tolist() == [0, 1, 2]
    assert mask.tolist() == [[False, False, True, False], [False, False, True, True]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_match_training_forward(generator, trainer, prompts, temperature):
    out = generator.generate(prompts, SamplingParams(max_tokens=40, temperature=temperature, seed=1))
    assert len(out.response_ids) == len(prompts)
    assert all(len(r) == len(lp) for r, lp in zip(out.response_ids, out.response_logprobs))
    recomputed = trainer.logprobs(out.prompt_ids, out.response_ids, temperature=temperature)
    for sampled, evaluated in zip(out.response_logprobs, recomputed):
        assert torch.allclose(torch.tensor(sampled), torch.tensor(evaluated), atol=1e-4)


def test_responses_stop_at_eos(generator, prompts):
    out = generator.generate(prompts, SamplingParams(max_tokens=60, seed=3))
    eos = generator.eos_id
    for response, done in zip(out.response_ids, out.finished):
        assert eos not in response[:-1]
        assert done == (response[-1] == eos)
        assert done or len(response) == 60
    assert out.num_tokens == sum(out.response_lengths) and out.end_time >= out.start_time


def test_same_seed_same_samples(generator, prompts):
    a = generator.generate(prompts[:2], SamplingParams(max_tokens=20, seed=5))
    b = generator.generate(prompts[:2], SamplingParams(max_tokens=20, seed=5))
    assert a.response_ids == b.response_ids


def test_train_step_learns_and_versions(trainer, generator, prompts):
    batch = TrainBatch(prompts[:4], [[10, 11, 12, 1]] * 4)
    first = trainer.train_step(batch, nll_loss)
    for _ in range(5):
        last = trainer.train_step(batch, nll_loss)
    assert last["loss"] < first["loss"] and trainer.version == 6
    snapshot = trainer.export_weights()
    assert snapshot.version == 6
    generator.load_weights(snapshot)
    assert generator.weight_version == 6
    # After the refresh the sampler draws from the trained policy: log-probs agree again.
    out = generator.generate(prompts[:3], SamplingParams(max_tokens=20, seed=2))
    for sampled, evaluated in zip(out.response_logprobs, trainer.logprobs(out.prompt_ids, out.response_ids)):
        assert torch.allclose(torch.tensor(sampled), torch.tensor(evaluated), atol=1e-4)


def test_snapshot_is_a_copy(trainer, prompts):
    snapshot = trainer.export_weights()
    before = {k: v.clone() for k, v in snapshot.tensors.items()}
    trainer.train_step(TrainBatch(prompts[:2], [[10, 1]] * 2), nll_loss)
    assert all(torch.equal(before[k], snapshot.tensors[k]) for k in before)


def test_bad_snapshot_is_refused(generator):
    from mindspeed_rl_asp.engines.base import WeightSnapshot

    with pytest.raises(EngineError, match="does not fit"):
        generator.load_weights(WeightSnapshot(9, {"nonsense.weight": torch.zeros(1)}))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(EngineError, match="no checkpoint at"):
        HFGenerationEngine(tmp_path / "nothing")


def test_empty_inputs_are_refused(generator, trainer):
    with pytest.raises(EngineError):
        generator.generate([], SamplingParams())
    with pytest.raises(EngineError):
        trainer.train_step(TrainBatch([], []), nll_loss)


def test_threads_are_configurable(random_policy_dir):
    before = torch.get_num_threads()
    try:
        HFGenerationEngine(random_policy_dir, num_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_numpy_rows_lay_out_like_lists():
    import numpy as np

    lists = pad_batch([[5, 6], [7]], [[8], [9, 10]], pad_id=0)
    arrays = pad_batch([np.array([5, 6], np.int32), np.array([7], np.int32)],
                       [np.array([8], np.int32), np.array([9, 10], np.int32)], pad_id=0)
    assert all(torch.equal(a, b) for a, b in zip(lists, arrays))


def test_reference_policy_stays_at_the_starting_weights(random_policy_dir, trainer, prompts):
    from mindspeed_rl_asp.engines.hf import HFReferencePolicy

    def flat(rows):
        return [v for row in rows for v in row]

    reference = HFReferencePolicy(random_policy_dir, num_threads=1)
    responses = [[10, 11, 12, 1]] * 3
    start = flat(trainer.logprobs(prompts[:3], responses))
    assert flat(reference.logprobs(prompts[:3], responses)) == pytest.approx(start, abs=1e-5)
    for _ in range(3):
        trainer.train_step(TrainBatch(prompts[:3], responses), nll_loss)
    moved = flat(trainer.logprobs(prompts[:3], responses))
    assert sum(moved) > sum(start) + 0.1  # the trainer learnt the responses
    assert flat(reference.logprobs(prompts[:3], responses)) == pytest.approx(start, abs=1e-5)  # the reference did not
    assert not any(p.requires_grad for p in reference.model.parameters())


def test_sampled_logprobs_equal_hf_processed_scores(generator, prompts):
    """The recorder keeps one step's log-softmax, yet gives what HF's own warpers and
    ``output_scores`` give (same samples for the same seed, same log-probs), with
    temperature, top-k and top-p all active."""
    from transformers import GenerationConfig

    sampling = SamplingParams(max_tokens=30, temperature=0.7, top_k=5, top_p=0.9, seed=11)
    out = generator.generate(prompts[:3], sampling)
    input_ids, attention, _, _ = pad_batch(prompts[:3], [[] for _ in range(3)], generator.pad_id)
    torch.manual_seed(11)
    with torch.no_grad():
        ref = generator.model.generate(
            input_ids=input_ids, attention_mask=attention, generation_config=GenerationConfig(
                do_sample=True, temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=30,
                pad_token_id=generator.pad_id, eos_token_id=generator.eos_id, return_dict_in_generate=True,
                output_scores=True))
    generated = ref.sequences[:, input_ids.shape[1]:]
    chosen = torch.log_softmax(torch.stack(ref.scores, 1).float(), -1).gather(-1, generated.unsqueeze(-1))[..., 0]
    for i, (response, logprobs) in enumerate(zip(out.response_ids, out.response_logprobs)):
        assert generated[i, :len(response)].tolist() == response
        assert torch.allclose(torch.tensor(logprobs), chosen[i, :len(response)], atol=1e-6)


def test_adam_betas_reach_the_optimizer(random_policy_dir):
    from types import SimpleNamespace

    from mindspeed_rl_asp.engines.registry import make_training_engine

    engine_cfg = SimpleNamespace(name="hf", device="cpu", dtype="float32", num_threads=1)
    train_cfg = SimpleNamespace(lr=1e-4, weight_decay=0.0, clip_grad=1.0, adam_beta1=0.8, adam_beta2=0.95)
    engine = make_training_engine(engine_cfg, str(random_policy_dir), train_cfg, SimpleNamespace(micro_batch_size=2), 1.0)
    assert engine.optimizer.defaults["betas"] == (0.8, 0.95)


def test_the_micro_batch_cut_does_not_change_the_gradient(random_policy_dir, prompts):
    """backward_micro_batch's rule (the loss times the rows' share of the whole batch):
    5 rows of different lengths in micro-batches of 2, 2, 1 give the gradient and the
    metrics of one micro-batch of 5, for a loss that is a mean over its rows."""
    def row_mean_loss(values, mask, batch, index):
        loss = -(values * mask).sum(dim=1).mean()
        return loss, {"loss": float(loss.detach())}

    batch = TrainBatch(prompts[:5], [[10, 11, 12, 1], [10, 1], [13, 14, 15, 16, 17, 1], [11, 1], [12, 12, 1]])
    grads, metrics = [], []
    for size in (5, 2):
        engine = HFTrainingEngine(random_policy_dir, num_threads=1, lr=1e-3, micro_batch_size=size, clip_grad=1e9)
        metrics.append(engine.train_step(batch, row_mean_loss))
        grads.append({k: p.grad.clone() for k, p in engine.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-7), k
    assert metrics[1]["loss"] == pytest.approx(metrics[0]["loss"], rel=1e-5)
