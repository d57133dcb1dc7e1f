"""MindSpeed-RL integration (docs/mindspeed_rl.md, docs/mindspeed_rl_adapters.md).

``config_import``: a MindSpeed-RL GRPO / DAPO YAML as this project's Hydra overrides (pure,
standard library plus PyYAML to read the file). Importing this package never imports
mindspeed_rl, torch_npu, megatron or vllm_ascend.
"""
