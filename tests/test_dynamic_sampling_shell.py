"""The shells' small pieces of dynamic sampling: the refill passes the core draws on
(schedule/planning.refill_passes) and the observer that frees rejected groups' payloads."""
from mindspeed_rl_asp.control.core import ControlConfig, ControlCore
from mindspeed_rl_asp.control.loop import Done
from mindspeed_rl_asp.schedule.planning import refill_passes
from mindspeed_rl_asp.runtime.ray_cluster import RayCluster, RejectedPayloads


def test_refill_passes_continue_the_epochs_and_never_repeat_an_id():
    mbs = [("e0g0m0", ("a", "b")), ("e1g0m0", ("a@e1", "b@e1"))]
    refill = refill_passes(mbs)
    assert refill(1) == [("r1.e0g0m0", ("a@e2", "b@e2")), ("r1.e1g0m0", ("a@e3", "b@e3"))]
    assert refill(2)[0] == ("r2.e0g0m0", ("a@e4", "b@e4"))
    assert refill(1) == refill_passes(mbs)(1)                     # pure
    # A resumed run's remaining list, with later epochs already trained: go past them.
    resumed = refill_passes([("e1g0m0", ("b@e1",))], taken=["a", "a@e1", "a@e3", "b@e3"])
    assert resumed(1) == [("r1.e1g0m0", ("b@e4",))]


def test_rejected_groups_payloads_are_released():
    cluster = RayCluster.__new__(RayCluster)       # only its Training Queue references matter here
    cluster.queue_refs = {"p0": "ref0", "p1": "ref0", "p2": "ref1"}
    cfg = ControlConfig(num_actors=1, global_batch_size=2, n_samples_per_prompt=2, max_staleness=1,
                        queue_capacity=16, filter_groups="std")
    core = ControlCore(cfg, [("m0", ("p0", "p1")), ("m1", ("p2", "p3"))])
    observer = RejectedPayloads(cluster)
    [g] = core.poll()
    event = Done(g, rewards={"p0": (1.0, 1.0), "p1": (0.0, 1.0)})
    core.on_generated(0, "m0", event.rewards)
    observer.observed(event, core, 0.0)
    assert cluster.queue_refs == {"p1": "ref0", "p2": "ref1"} and observer.seen == 1
    observer.observed(event, core, 0.0)                           # nothing new: nothing more released
    assert cluster.queue_refs == {"p1": "ref0", "p2": "ref1"}


def test_generation_scoring_is_on_only_for_dapo_and_checks_its_keys():
    import pytest

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.schema import TaskConfig
    from mindspeed_rl_asp.config.validate import ConfigError
    from mindspeed_rl_asp.runtime.actor_configs import scoring_config

    names, task = ["maze_integrity", "maze_correctness"], TaskConfig()
    cfg = load_config(["generate.sampling_config.max_tokens=64"], local_install=False)
    assert scoring_config(cfg, task, (), names) is None            # the trainer scores
    cfg.algo.overlong_buffer_len = 8
    shaped = scoring_config(cfg, task, (), names)
    assert shaped.algo.overlong_buffer_len == 8 and shaped.max_tokens == 64 and shaped.task is task
    cfg.algo.filter_groups, cfg.algo.filter_groups_metric = "std", "maze_correctness"
    assert scoring_config(cfg, task, (), names).algo.filter_groups == "std"
    cfg.algo.filter_groups_metric = "format"
    with pytest.raises(ConfigError, match="algo.filter_groups_metric='format' is not a reward of this task"):
        scoring_config(cfg, task, (), names)
    cfg.algo.filter_groups_metric, cfg.algo.overlong_buffer_len = "acc", 64
    with pytest.raises(ConfigError, match="algo.overlong_buffer_len=64 must be below "
                                          "generate.sampling_config.max_tokens=64"):
        scoring_config(cfg, task, (), names)
