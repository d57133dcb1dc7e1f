"""model.path=DIR: a Hugging Face causal LM checkpoint (the Qwen2, Qwen3 and Llama
families are tested), with its own tokenizer, for generation, training and export (random
checkpoints saved here)."""
import pytest
import torch

from hf_random import save_random_checkpoint
from mindspeed_rl_asp.engines.base import SamplingParams, TrainBatch
from mindspeed_rl_asp.engines.hf import HFGenerationEngine, HFTrainingEngine, load_tokenizer, nll_loss


@pytest.fixture(scope="module", params=["qwen3", "qwen2", "llama"])
def checkpoint(request, tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def test_its_own_tokenizer_loads_with_its_chat_template(checkpoint):
    import json

    assert json.loads((checkpoint / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    tokenizer = load_tokenizer(checkpoint)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer" and tokenizer.padding_side == "left"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    ids = tokenizer("<|0-0|><|up_left_wall|><|origin|>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3  # maze tags are single tokens of this tokenizer


def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from hf_random import qwen_tokenizer

    bare = PreTrainedTokenizerFast(tokenizer_object=qwen_tokenizer().backend_tokenizer, eos_token="<|im_end|>")
    assert bare.pad_token is None
    bare.save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.pad_token == "<|im_end|>" and tokenizer.pad_token_id == tokenizer.eos_token_id


def test_generate_train_export_and_save(checkpoint, tmp_path):
    generator = HFGenerationEngine(checkpoint, num_threads=1)
    trainer = HFTrainingEngine(checkpoint, num_threads=1, lr=1e-2, micro_batch_size=4)
    tokenizer = generator.tokenizer
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"]
               for t in ("What is 3 + 4?", "MAZE:\n<|0-0|><|up_left_wall|><|origin|>", "x y")]
    out = generator.generate(prompts, SamplingParams(max_tokens=12, seed=0))
    assert all(0 < len(r) <= 12 for r in out.response_ids)
    # The sampler's log-probs are the trainer's forward of the same weights.
    for sampled, evaluated in zip(out.response_logprobs, trainer.logprobs(out.prompt_ids, out.response_ids)):
        assert torch.allclose(torch.tensor(sampled), torch.tensor(evaluated), atol=1e-4)
    batch = TrainBatch(out.prompt_ids, out.response_ids, {})
    before = sum(sum(lp) for lp in trainer.logprobs(batch.prompt_ids, batch.response_ids))
    for _ in range(3):
        trainer.train_step(batch, nll_loss)
    assert sum(sum(lp) for lp in trainer.logprobs(batch.prompt_ids, batch.response_ids)) > before
    snapshot = trainer.export_weights()
    generator.load_weights(snapshot)  # untied lm_head included
    assert generator.weight_version == snapshot.version == 3
    trainer.save(tmp_path / "final")
    reloaded = HFGenerationEngine(tmp_path / "final", num_threads=1)
    assert reloaded.tokenizer.chat_template == tokenizer.chat_template
    for name, tensor in reloaded.model.state_dict().items():
        assert torch.equal(tensor, snapshot.tensors[name]), name
