"""A failed publish is a ``Failed(Publish)`` whatever the weight transport.

Through the real Ray shell (``RayCluster``) and a real ``TrainingWorker``: an export that
raises, and a trainer whose process is gone, each end the publish as ``Failed`` for the
object store (whose snapshot the driver never fetches: it fetches a small receipt
beside it), files and collective transports; the store then does not map the version.
A publish that succeeds after the failure is ``Done`` on the same cluster, so the test
tells the two outcomes apart.
"""
import pytest
from omegaconf import OmegaConf

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.validate import resolve_model_path

pytestmark = pytest.mark.slow

TRANSPORTS = ("object_store", "files", "collective")


def configs_of(cfg):
    """The actors' typed configs as the driver makes them (runtime/actor_configs.py)."""
    from mindspeed_rl_asp.runtime.actor_configs import actor_configs
    from mindspeed_rl_asp.schedule.configured import configured_task

    return actor_configs(cfg, configured_task(cfg), str(resolve_model_path(cfg.model.path)))


def worker_args(cfg):
    """A TrainingWorker's arguments: its config and the weights it starts from."""
    return configs_of(cfg).trainer, str(resolve_model_path(cfg.model.path))


def publish(cluster, version):
    from mindspeed_rl_asp.control.core import Publish

    cluster.submit(Publish(version))
    return cluster.next_event()


def start_trainer_and_clusters(ray, tmp_path):
    """One trainer actor and a RayCluster per transport over it (no generation actors: a
    publish needs none)."""
    from mindspeed_rl_asp.runtime.ray_cluster import RayCluster
    from mindspeed_rl_asp.runtime.training_unit import TrainingWorker
    from mindspeed_rl_asp.runtime.transport import actor_class_options, make_transport

    cfg = load_config(["task.num_prompts=8", "rl.global_batch_size=4", "rl.mini_batch_size=2",
                       "weights.transport=collective", "weights.timeout_s=30"])
    trainer = ray.remote(num_cpus=1, **actor_class_options("collective", "train", 1))(TrainingWorker).remote(
        *worker_args(cfg))
    try:
        ray.get(trainer.ready.remote())
        clusters = {}
        for name in TRANSPORTS:
            weights = OmegaConf.merge(cfg.weights, {"transport": name, "dir": str(tmp_path / "weights")})
            clusters[name] = RayCluster([], [trainer], {}, 0, make_transport(weights, [trainer], [], tmp_path))
    except BaseException:
        ray.kill(trainer)
        raise
    return trainer, clusters


@pytest.fixture(scope="module")
def shared_trainer_and_clusters(ray_cluster, tmp_path_factory):
    """For the export failures, one trainer for every transport: each case uses its own
    transport's cluster (and store) once, and starting a trainer is most of a case's time."""
    trainer, clusters = start_trainer_and_clusters(ray_cluster, tmp_path_factory.mktemp("publish"))
    yield ray_cluster, trainer, clusters
    ray_cluster.kill(trainer)


@pytest.fixture
def trainer_and_clusters(ray_cluster, tmp_path):
    """A trainer of the test's own (the test kills it)."""
    trainer, clusters = start_trainer_and_clusters(ray_cluster, tmp_path)
    yield ray_cluster, trainer, clusters
    ray_cluster.kill(trainer)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_export_that_raises_fails_the_publish(shared_trainer_and_clusters, transport):
    from mindspeed_rl_asp.control.loop import Done, Failed

    ray, trainer, clusters = shared_trainer_and_clusters
    cluster = clusters[transport]
    assert cluster.store.latest == 0
    ray.get(trainer.inject_export_failure.remote())
    event = publish(cluster, 1)
    assert isinstance(event, Failed), event
    assert "injected export failure" in event.error
    assert cluster.store.latest == 0     # version 1 was never published

    event = publish(cluster, 1)                    # the seam fires once: the same publish now succeeds
    assert isinstance(event, Done), event
    assert cluster.store.latest == 1 and cluster.store.kept_versions == [1]


def test_a_dead_trainer_fails_the_publish_on_every_transport(trainer_and_clusters):
    from mindspeed_rl_asp.control.loop import Failed

    ray, trainer, clusters = trainer_and_clusters
    ray.kill(trainer, no_restart=True)
    for name, cluster in clusters.items():
        event = publish(cluster, 1)
        assert isinstance(event, Failed), (name, event)
        assert cluster.store.latest == 0, name


def test_a_failed_publish_stops_the_loop_naming_the_version():
    """Through the real loop and core: the event the shell makes of a failed export ends
    the run with TrainerFailed naming the version (never a later load of a broken one)."""
    from mindspeed_rl_asp.control.clusters import OrderedCluster
    from mindspeed_rl_asp.control.core import ControlConfig, ControlCore, LoadWeights, Publish
    from mindspeed_rl_asp.control.loop import TrainerFailed, drive

    submitted = []

    def first_ends_but_publishes_fail(pending):
        return 0, isinstance(pending[0], Publish)

    core = ControlCore(ControlConfig(num_actors=2, global_batch_size=2, n_samples_per_prompt=1, max_staleness=1,
                                     queue_capacity=64, total_steps=3),
                       [(f"m{i}", (f"p{i}",)) for i in range(6)])
    with pytest.raises(TrainerFailed, match="publishing version 1 failed: injected failure"):
        drive(core, OrderedCluster(first_ends_but_publishes_fail, check=submitted.append))
    assert not any(isinstance(a, LoadWeights) and a.version >= 1 for a in submitted)
    assert core.snapshot().trainer_version == 1 and core.snapshot().published_version == 0
