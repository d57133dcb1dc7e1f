"""Contract tests against a real MindSpeed-RL checkout (MINDSPEED_RL_CHECKOUT=/path/to/it).

The checks run in one child process (tests/mindspeed_stubs/all_checks_child.py) with the
stubs of MindSpeed-RL's NPU-only imports and the checkout on its PYTHONPATH, so the stub
named vllm never shadows the real vllm of this session, and with a Ray of its own that
offers 32 logical CPUs (GRPOTransferDock and TransferQueueManager reserve 10 each; the
session's cluster has 4). The same child runs the engine=mindspeed cpu path's checks
(test_cpu_path, see tests/test_mindspeed_cpu_path.py). What the contract checks:
``import mindspeed_rl`` with the stubs; the engine's calls against the real signatures; the
weight map against MindSpeed-RL's QKV split, name adaptors and fc1 gather; the queue
adapter through the real GRPOTransferDock and TransferQueue; the in-process dock model
against the real dock; MindSpeed-RL's own advantage stage over ASP's samples. Without a checkout they skip, saying why; the tests
at the bottom run everywhere.
"""
import importlib.util
import sys

import pytest
from types import SimpleNamespace

from mindspeed_child import run_child, skip_reason

CONTRACT_CHECKS = ("import_mindspeed_rl_with_stubs", "engine_api_signatures", "engine_cli_functions",
                   "qkv_split_matches_mindspeed_rl", "names_match_mindspeed_rl_weight_adaptors",
                   "fc1_gather_matches_mindspeed_rl", "transfer_dock_round_trip", "dock_model_matches_the_real_dock",
                   "default_gbs_train_returns_nothing_on_the_real_dock",
                   "mindspeed_rl_advantage_stage_reads_asp_samples", "transfer_queue_round_trip")
# engine=mindspeed on CPU through MindSpeed-RL's own orchestration (tests/mindspeed_stubs/cpu_path_child.py).
CPU_PATH_CHECKS = ("job_composes_with_its_model_group", "rl_config_is_what_its_launcher_reads",
                   "validate_rl_args_sets_the_dispatch_sizes", "job_errors_name_the_key",
                   "kl_controller_is_mindspeed_rls", "worker_group_is_placed_on_asps_groups",
                   "stale_batch_equals_the_hf_engine", "dropping_the_weights_changes_the_loss",
                   "update_without_a_kl_controller_is_refused", "weights_come_back_through_the_megatron_map")


@pytest.fixture(scope="module")
def child_results(tmp_path_factory):
    """Both check lists from one child: one interpreter, one ``import mindspeed_rl`` and one
    Ray instead of two. Only this file reads them: with scripts/test.sh's pytest-xdist
    workers (--dist loadfile) another file would run its own child."""
    return run_child("all_checks_child.py", tmp_path_factory.mktemp("mindspeed_checks"))


def check_outcome(results: dict, name: str) -> None:
    assert name in results, f"the child ran no check {name!r}"
    assert results[name] == "ok", results[name]


@pytest.mark.slow   # its child runs MindSpeed-RL's dock, queue and cpu worker actors: over a minute
@pytest.mark.parametrize("name", CONTRACT_CHECKS)
def test_contract(child_results, name):
    check_outcome(child_results["contract"], name)


@pytest.mark.slow
@pytest.mark.parametrize("name", CPU_PATH_CHECKS)
def test_cpu_path(child_results, name):
    check_outcome(child_results["cpu_path"], name)


# ----------------------------------------------------------------------------- everywhere
def test_engine_api_check_can_fail(monkeypatch):
    """check_mindspeed_api names a missing target and a missing parameter."""
    import types

    from mindspeed_rl_asp.integrations.mindspeed.engine import ApiCall, check_mindspeed_api

    module = types.ModuleType("fake_mindspeed_api")

    class Worker:
        def __init__(self, megatron_config, rl_config):
            pass

    module.Worker = Worker
    monkeypatch.setitem(sys.modules, "fake_mindspeed_api", module)
    problems = check_mindspeed_api([ApiCall("fake_mindspeed_api", "Worker.__init__", ("megatron_config", "tokenizer")),
                                    ApiCall("fake_mindspeed_api", "Gone.update", ())])
    assert len(problems) == 2
    assert "takes no ['tokenizer']" in problems[0] and "AttributeError" in problems[1]
    assert check_mindspeed_api([ApiCall("fake_mindspeed_api", "Worker.__init__", ("rl_config",))]) == []


@pytest.mark.skipif(importlib.util.find_spec("mindspeed_rl") is not None, reason="mindspeed_rl is importable here")
def test_engine_mindspeed_without_mindspeed_rl_says_what_to_install():
    from types import SimpleNamespace

    from mindspeed_rl_asp.engines.base import EngineError
    from mindspeed_rl_asp.engines.registry import (make_generation_engine, make_reference_policy,
                                                   make_training_engine)

    cfg = SimpleNamespace(name="mindspeed", device="npu", dtype="bfloat16", num_threads=0)
    for build in (lambda: make_training_engine(cfg, "model", None, None, 1.0),
                  lambda: make_generation_engine(cfg, "model"),
                  lambda: make_reference_policy(cfg, "model", 1.0)):
        with pytest.raises(EngineError, match="mindspeed_rl is not importable.*checkout of Ascend/MindSpeed-RL"):
            build()


def test_skip_reason_names_the_variable(monkeypatch):
    import mindspeed_child

    monkeypatch.setattr(mindspeed_child, "CHECKOUT", "")
    assert "MINDSPEED_RL_CHECKOUT is not set" in skip_reason()
    monkeypatch.setattr(mindspeed_child, "CHECKOUT", "/nonexistent-checkout")
    assert "has no mindspeed_rl package" in skip_reason()


class FakeWorkerGroup:
    """A RayActorGroup that does on the dock what MindSpeed-RL's workers do (as read from
    actor_hybrid_worker.py / reference_worker.py): read their columns for every row as
    their consumer, write their output column; ``update`` records what it read."""

    def __init__(self, shards=None):
        self.td = None
        self.inits = 0
        self.updates = []
        self.shards = shards or {}

    def sync_init_transfer_dock(self, transfer_dock):
        self.td = transfer_dock
        self.inits += 1

    def _stage(self, consumer, output):
        import torch

        rows = list(range(self.td.max_len))
        batch, index = self.td.get_experience(consumer, ["input_ids", "responses", "response_length", "prompt_length"],
                                              indexes=rows)
        lengths = batch["response_length"].reshape(-1).tolist()
        values = [torch.tensor([-0.5 * float(t) for t in batch["responses"][i][:n]]) for i, n in enumerate(lengths)]
        self.td.put_experience({output: values}, indexes=index)

    def compute_log_prob(self, blocking=False):
        self._stage("actor_log_prob", "old_log_prob")

    def compute_ref_log_prob(self, blocking=False):
        self._stage("ref_log_prob", "ref_log_prob")

    def update(self, kl_ctrl, skip_actor_log_prob):
        columns = ["responses", "advantages", "old_log_prob", "ref_log_prob", "input_ids", "response_length",
                   "prompt_length"]
        if kl_ctrl is None or not hasattr(kl_ctrl, "value"):
            raise AttributeError("MindSpeed-RL's loss reads kl_ctrl.value")   # what its GRPO loss does
        batch, _ = self.td.get_experience("actor_train", columns, indexes=list(range(self.td.max_len)))
        self.updates.append((skip_actor_log_prob, batch))

    def save_checkpoint(self, iteration):
        self.saved = iteration

    def execute_sync_command(self, method_name, *args, **kwargs):
        assert method_name == "asp_state_dict"
        return [((r.pp, r.tp, r.ep), state) for r, state in self.shards.items()]


def fake_engine(shards=None):
    from mindspeed_rl_asp.integrations.mindspeed.dock_model import InProcessDock
    from mindspeed_rl_asp.integrations.mindspeed.engine import DockCalls, MindSpeedTrainingEngine
    from mindspeed_rl_asp.integrations.mindspeed.queue import ASP_COLUMNS

    engine = MindSpeedTrainingEngine.__new__(MindSpeedTrainingEngine)   # no Megatron here: the glue only
    engine.actor = FakeWorkerGroup(shards)   # the integrated worker: actor and reference in one group
    engine.kl_ctrl, engine.loss_cfg = SimpleNamespace(value=0.0), None
    engine.docks = DockCalls([engine.actor],
                             make_dock=lambda rows: InProcessDock(rows, 1, GBS_train=rows,
                                                                  addition_columns=list(ASP_COLUMNS)),
                             call=lambda dock, name, **kw: getattr(dock, name)(**kw))
    engine.version = 0
    return engine


def test_engine_logprobs_and_reference_through_the_dock():
    engine = fake_engine()
    prompts, responses = [[1, 2], [3]], [[4, 5, 6], [7]]
    assert engine.logprobs(prompts, responses) == [[-2.0, -2.5, -3.0], [-3.5]]
    assert engine.reference_logprobs(prompts, responses) == [[-2.0, -2.5, -3.0], [-3.5]]
    engine.logprobs([[1]] * 3, [[2]] * 3)          # another row count: another dock, handed to the workers
    assert engine.actor.inits == 2
    engine.logprobs(prompts, responses)            # back to 2 rows: the first dock again
    assert len(engine.docks.docks) == 2 and engine.actor.inits == 3


def test_engine_train_step_puts_what_mindspeed_rl_update_reads():
    from mindspeed_rl_asp.engines.base import TrainBatch

    from mindspeed_rl_asp.algo.grpo import GRPOLossConfig

    engine = fake_engine()
    engine.configure_loss(GRPOLossConfig(off_policy="tis", tis_cap=2.0))
    batch = TrainBatch([[1, 2], [3]], [[4, 5, 6], [7]],
                       {"advantages": [0.5, -1.0], "behaviour_logprobs": [[-1.0, -0.1, -0.5], [-2.0]],
                        "proximal_logprobs": [[-0.1, -0.2, -0.3], [-0.4]], "ref_logprobs": [[-9.0] * 3, [-9.0]]})
    metrics = engine.train_step(batch, loss_fn=None)
    assert engine.version == 1 and metrics["asp_loss_fn_used"] == 0.0
    skip, seen = engine.actor.updates[0]
    assert skip is False   # old_log_prob is in the dock; MindSpeed-RL must not drop it
    # Truncated importance weights min(exp(proximal - behaviour), 2) folded into the advantages.
    import math

    want = [0.5 * min(math.exp(p - b), 2.0) for p, b in zip([-0.1, -0.2, -0.3], [-1.0, -0.1, -0.5])]
    assert seen["advantages"][0][:3].tolist() == pytest.approx(want) and want[0] == 1.0 and want[1] < 0.5
    assert seen["advantages"][1][:1].tolist() == [-2.0]
    assert [round(x, 4) for x in seen["old_log_prob"][0][:3].tolist()] == [-0.1, -0.2, -0.3]   # ratio vs proximal
    assert seen["ref_log_prob"][1][:1].tolist() == [-9.0]
    assert seen["input_ids"][0][:5].tolist() == [1, 2, 4, 5, 6]
    engine.configure_loss(GRPOLossConfig(off_policy="none"))   # no correction: behaviour log-probs, A as is
    engine.train_step(batch)
    assert [round(x, 4) for x in engine.actor.updates[1][1]["old_log_prob"][0][:3].tolist()] == [-1.0, -0.1, -0.5]
    assert engine.actor.updates[1][1]["advantages"][0][:3].tolist() == [0.5] * 3


def test_engine_train_step_passes_a_kl_controller():
    """MindSpeed-RL's loss reads kl_ctrl.value: update(None, ...) failed there (and in the fake)."""
    from mindspeed_rl_asp.engines.base import TrainBatch

    engine = fake_engine()
    engine.kl_ctrl = SimpleNamespace(value=0.05)
    batch = TrainBatch([[1]], [[2]], {"advantages": [1.0], "behaviour_logprobs": [[-1.0]]})
    assert engine.train_step(batch)["kl_coef"] == 0.05
    engine.kl_ctrl = None
    with pytest.raises(AttributeError, match="kl_ctrl.value"):
        engine.train_step(batch)


def test_engine_exports_hugging_face_tensors_from_megatron_ranks():
    import torch

    from test_mindspeed_weight_map import QWEN3, random_hf

    from mindspeed_rl_asp.integrations.mindspeed.weight_map import Parallel, hf_to_megatron

    hf = random_hf(QWEN3)
    parallel = Parallel(tp=2, pp=2)
    engine = fake_engine(hf_to_megatron(hf, QWEN3, parallel))
    engine.shape, engine.parallel = QWEN3, parallel
    engine.version = 3
    snapshot = engine.export_weights()
    assert snapshot.version == 3 and sorted(snapshot.tensors) == sorted(hf)
    assert all(torch.equal(snapshot.tensors[k], hf[k]) for k in hf)


def test_engine_save_writes_a_loadable_hugging_face_policy(tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hf_random import save_random_checkpoint

    from mindspeed_rl_asp.integrations.mindspeed.weight_map import ModelShape, Parallel, hf_to_megatron

    start = save_random_checkpoint(tmp_path / "start", family="qwen3")
    model = AutoModelForCausalLM.from_pretrained(start)
    trained = {k: v.detach() + 1.0 for k, v in model.state_dict().items()}   # "after training"
    shape, parallel = ModelShape.from_hf_config(AutoConfig.from_pretrained(start)), Parallel(tp=2)
    engine = fake_engine(hf_to_megatron(trained, shape, parallel))
    engine.shape, engine.parallel, engine.version = shape, parallel, 2
    engine.model_path, engine.tokenizer = str(start), AutoTokenizer.from_pretrained(start)
    engine.save(str(tmp_path / "policy"))
    assert engine.actor.saved == 2                      # MindSpeed-RL's own checkpoint too
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "policy").state_dict()
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
    assert engine.optimizer_state() == {}
