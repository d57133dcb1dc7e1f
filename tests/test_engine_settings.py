"""engine.max_model_len=0 is the run's longest sequence (prompt + response), for the config
check and the actors alike (config/engine.py)."""
from mindspeed_rl_asp.config.engine import engine_settings, run_model_len
from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.validate import engine_problems


def test_zero_means_prompt_plus_response():
    assert run_model_len(0, 256, 512) == 768
    assert run_model_len(4096, 256, 512) == 4096
    cfg = load_config(["engine=vllm", "rl.max_prompt_length=200", "generate.sampling_config.max_tokens=100"],
                      validate=False)
    assert engine_settings(cfg).max_model_len == 300
    assert engine_settings(load_config(["engine=vllm", "engine.max_model_len=640"], validate=False)).max_model_len == 640


def test_kv_budget_is_checked_against_the_run_not_the_checkpoint():
    """The tiny policy has 1,024 positions: 9 KV blocks of 128 tokens x 2,048 bytes. The
    run's 256 + 256 tokens need 5; a budget between the two is enough for the run (before,
    it was refused for the checkpoint's 1,024)."""
    budget = 7 * 128 * 2048
    fits = load_config(["engine=vllm", f"engine.kv_cache_memory_bytes={budget}"], validate=False)
    assert engine_problems(fits, local_install=False) == []
    whole = load_config(["engine=vllm", f"engine.kv_cache_memory_bytes={budget}", "engine.max_model_len=1024"],
                        validate=False)
    problems = engine_problems(whole, local_install=False)
    assert len(problems) == 1 and "engine.kv_cache_memory_bytes" in problems[0]


def test_load_config_with_engine_vllm_checks_the_run_length():
    """Through load_config (the checks get the plain RootConfig): a budget for the run's
    512 tokens but not the checkpoint's 1,024 is accepted."""
    load_config(["engine=vllm", f"engine.kv_cache_memory_bytes={7 * 128 * 2048}"], local_install=False)
