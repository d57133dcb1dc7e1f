"""A cluster no one else can use: token authentication on every node, the token never on a
command line, no head reachable by others without one, and a wrong token cannot join."""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from mindspeed_rl_asp.runtime.launch import is_loopback, new_token, token_problem


def test_new_token_is_random_private_and_kept(tmp_path, capsys):
    from mindspeed_rl_asp.cli.launch import main

    path = tmp_path / "shared" / "token"
    assert main(["--new-token", f"--token-path={path}"]) == 0
    token = path.read_text()
    assert len(token) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token not in capsys.readouterr().out             # never printed
    assert new_token(str(path)) is False and path.read_text() == token   # a second call keeps it
    other = tmp_path / "other"
    new_token(str(other))
    assert other.read_text() != token


def test_printed_commands_carry_the_token_path_not_the_token(tmp_path, capsys):
    from mindspeed_rl_asp.cli.launch import main

    path = tmp_path / "token"
    new_token(str(path))
    assert main(["layout=ascend910b3_t1g1", "head=10.0.0.1", f"--token-path={path}"]) == 0
    out = capsys.readouterr().out
    starts = [line for line in out.splitlines() if " ray start " in f" {line}"]
    assert len(starts) == 2 and all(f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={path} ray start" in s for s in starts)
    assert f"--token-path={path}" in out and path.read_text() not in out
    assert "--dashboard-host=127.0.0.1" in starts[0]


def test_a_reachable_head_without_a_token_is_refused(tmp_path, capsys):
    from mindspeed_rl_asp.cli.launch import main

    missing = tmp_path / "no-token"
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("10.0.0.1")
    assert token_problem("127.0.0.1", str(missing)) is None
    assert "asp-launch --new-token" in token_problem("10.0.0.1", str(missing))
    for flag in (["--node", "0"], ["--wait"], ["--driver"]):
        assert main(["layout=ascend910b3_t1g1", "head=10.0.0.1", f"--token-path={missing}", *flag]) == 2
        err = capsys.readouterr().err
        assert "no token at" in err and len(err.strip().splitlines()) == 1
    assert not missing.exists()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _ray_cli() -> str:
    return os.path.join(os.path.dirname(sys.executable), "ray")


@pytest.mark.slow
def test_a_wrong_token_cannot_join(tmp_path):
    """A head started with one token (our own process, stopped by its pid); a driver with
    another token is refused, one with the right token joins."""
    right, wrong = tmp_path / "right", tmp_path / "wrong"
    new_token(str(right))
    new_token(str(wrong))
    port = 20000 + os.getpid() % 20000
    # The head stops at SIGTERM without Ray's 30 s drain (nothing runs on it to drain).
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(right),
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    env.pop("RAY_ADDRESS", None)
    # A short session directory of its own: Ray's unix sockets live in it (at most 107 bytes a path).
    session = tempfile.mkdtemp(prefix="asp-ray-")
    head = subprocess.Popen([_ray_cli(), "start", "--head", f"--port={port}", "--block", "--num-cpus=1",
                             "--include-dashboard=false", f"--temp-dir={session}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    probe = ("import ray, sys\n"
             "try:\n"
             f"    ray.init(address='127.0.0.1:{port}', log_to_driver=False)\n"
             "except Exception as error:\n"
             "    print('refused', type(error).__name__); sys.exit(3)\n"
             "print('joined', ray.cluster_resources().get('CPU')); ray.shutdown()\n")
    try:
        deadline = time.time() + 180
        while not _listening(port):   # the head takes a while to come up on a loaded machine
            assert time.time() < deadline and head.poll() is None, f"no head: {head.stderr.read()[-2000:] if head.poll() is not None else 'timeout'}"
            time.sleep(1)
        joined = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=180)
        assert joined.returncode == 0 and "joined 1.0" in joined.stdout, (joined.stdout, joined.stderr[-2000:])
        # A refused driver retries the head for about 20 s (one try a second); 3 tries show it all the same.
        bad = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180,
                             env={**env, "RAY_AUTH_TOKEN_PATH": str(wrong), "RAY_gcs_server_port_wait_time_s": "3"})
        assert bad.returncode == 3 and "refused" in bad.stdout, (bad.stdout, bad.stderr[-2000:])
        assert "InvalidAuthToken" in bad.stderr or "Authentication" in bad.stderr
    finally:
        if head.poll() is None:
            os.killpg(head.pid, 15)   # our own head, by the process group we started it in
            head.wait(timeout=60)
        shutil.rmtree(session, ignore_errors=True)
