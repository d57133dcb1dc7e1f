import os

# No model hub exists here: every model the tests use is built by the project itself.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def random_policy_dir(tmp_path_factory):
    """A small randomly initialised Qwen3 policy with the maze tokenizer, on disk."""
    from mindspeed_rl_asp.policy.tiny_model import build_tiny_policy
    from mindspeed_rl_asp.policy.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("random_policy")
    tokenizer = build_tokenizer()
    build_tiny_policy(tokenizer, seed=0, hidden_size=32, num_layers=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def ray_cluster():
    """The one local Ray cluster of this test session (with scripts/test.sh's pytest-xdist
    workers: of this worker), with CPU slots for the local layout."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """Files with end-to-end runs first (the most tests marked ``slow`` first), each file's
    tests in their own order. scripts/test.sh runs two pytest-xdist workers that take a
    whole file at a time (``--dist loadfile``): the long files start at once and the many
    short ones fill in at the end, so one worker does not finish a long file alone."""
    slow: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        path = str(item.path)
        first.setdefault(path, index)
        slow[path] = slow.get(path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (-slow[str(item.path)], first[str(item.path)]))
