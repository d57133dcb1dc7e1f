"""engine=vllm against engine=hf: actor start-up, steady generation tokens/s, in-place
weight reload. Each engine in its own Ray actor (one CPU, one torch thread), the same
load: ``--prompts`` maze prompts x ``--samples`` samples per prompt in one call (what a
generation actor does with a minibatch), max_tokens 256, temperature 1. Not a test.

    HF_HUB_OFFLINE=1 python benchmarks/bench_vllm_engine.py                # 32 prompts x 4 samples, 3 rounds
    HF_HUB_OFFLINE=1 python benchmarks/bench_vllm_engine.py --engines vllm --rounds 5

Prints one markdown table: ready (actor created -> engine built, vLLM import included),
tokens/s per round (first round included: it shows any warm-up left), median of the
later rounds, and for vllm the time of ``load_weights`` of a full snapshot.
"""
from __future__ import annotations

import argparse
import statistics
import time


def actor_class():
    class Bench:
        def __init__(self, cfg: dict, path: str):
            from types import SimpleNamespace

            from mindspeed_rl_asp.engines.registry import make_generation_engine

            self.engine = make_generation_engine(SimpleNamespace(**cfg), path, instance=0)

        def run(self, prompts, sampling):
            out = self.engine.generate(prompts, sampling)
            return out.num_tokens, out.end_time - out.start_time

        def reload(self, snapshot):
            start = time.time()
            self.engine.load_weights(snapshot)
            return time.time() - start

    return Bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()

    import ray

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.validate import resolve_model_path
    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.engines.hf import HFTrainingEngine, load_tokenizer
    from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset
    from omegaconf import OmegaConf

    path = str(resolve_model_path("mindspeed_rl_asp/assets/tiny-maze-qwen3"))
    tokenizer = load_tokenizer(path)
    items = make_dataset(args.prompts, 0, MazeTaskSpec())
    prompts = [tokenizer(it.prompt, add_special_tokens=False)["input_ids"] for it in items]
    flat = [p for p in prompts for _ in range(args.samples)]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows = []
    try:
        for name in args.engines.split(","):
            cfg = OmegaConf.to_container(load_config([f"engine={name}"], validate=False).engine)
            start = time.time()
            actor = ray.remote(actor_class()).options(num_cpus=1, runtime_env={"env_vars": env}).remote(cfg, path)
            rates = []
            for r in range(args.rounds):
                tokens, seconds = ray.get(actor.run.remote(
                    flat, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=r)))
                if r == 0:
                    ready = time.time() - start - seconds
                rates.append(tokens / seconds)
            reload = "-"
            if name == "vllm":
                snapshot = HFTrainingEngine(path, num_threads=1).export_weights()
                reload = f"{ray.get(actor.reload.remote(snapshot)) * 1000:.0f} ms"
            ray.kill(actor)
            steady = statistics.median(rates[1:]) if len(rates) > 1 else rates[0]
            rows.append((name, ready, rates, steady, reload))
    finally:
        ray.shutdown()
    print(f"\n{args.prompts} prompts x {args.samples} samples, max_tokens {args.max_tokens}, one actor, one thread\n")
    print("| engine | ready | tokens/s per round | steady tokens/s | load_weights |")
    print("|---|---|---|---|---|")
    for name, ready, rates, steady, reload in rows:
        print(f"| {name} | {ready:.1f} s | {', '.join(f'{r:,.0f}' for r in rates)} | {steady:,.0f} | {reload} |")


if __name__ == "__main__":
    main()
