"""The emitted DeepSpeed launch.sh: one node starts without a hostfile (DeepSpeed's runner would check ssh to any
host a hostfile names), several nodes with it; the one-node script really trains 2 CPU ranks with no ssh."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from autoplan.errors import InputError
from autoplan.integrations.deepspeed import emit_deepspeed, hostfile_text, node_slots
from autoplan.integrations.extlocks import with_own_build_folder
from engine_checks.plans import LLAMA_8B, TINY, make_plan
from conftest import DS_SHM_PREFIX, deadline_s, remove_deepspeed_shm

FAKE_DEEPSPEED = """#!/usr/bin/env bash
# Records the runner's argv and the hostfile it was given, one JSON object.
hostfile=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do [[ "${args[i]}" == --hostfile ]] && hostfile="${args[i+1]}"; done
python3 -c 'import json, sys; print(json.dumps({"argv": sys.argv[2:], "hostfile": open(sys.argv[1]).read() \
if sys.argv[1] not in ("", "/dev/null") else None}))' "$hostfile" "$@"
"""
TRAINING_ENV = {"MODEL_CONFIG": "/m/config.json", "DATA_PATH": "/d/corpus"}  # the training run's model and data
FAKE_SSH = "#!/bin/sh\ntouch \"$(dirname \"$0\")/ssh-was-called\"\nexit 255\n"


def write_files(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def fake_bin(tmp_path, **tools):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_launch(folder, bin_dir, env_extra=None, args=()):
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("SLURM_JOB_NODELIST", None)
    env.update(env_extra or {})
    out = subprocess.run(["bash", str(folder / "launch.sh"), *args], capture_output=True, text=True, env=env,
                         timeout=deadline_s(20))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_node_launches_without_a_hostfile(tmp_path):
    files = emit_deepspeed(make_plan(TINY, 8, 64, 16, zero=1))
    assert "hostfile" not in files
    write_files(tmp_path / "run", files)
    seen = run_launch(tmp_path / "run", fake_bin(tmp_path, deepspeed=FAKE_DEEPSPEED),
                      {"MASTER_PORT": "29777", **TRAINING_ENV}, ["--lr", "1e-4"])
    argv = seen["argv"]
    assert seen["hostfile"] is None
    assert argv[:6] == ["--hostfile", "/dev/null", "--num_gpus", "8", "--master_port", "29777"]
    assert "--num_nodes" not in argv and "--master_addr" not in argv
    assert argv[6].endswith("/run/ds_hf_train.py") and argv[-2:] == ["--lr", "1e-4"]
    assert argv[9:13] == ["--model-config", "/m/config.json", "--data-path", "/d/corpus"]


def test_several_nodes_launch_with_the_hostfile(tmp_path):
    files = emit_deepspeed(make_plan(LLAMA_8B, 16, 4096, 64, zero=3))
    assert files["hostfile"].splitlines()[1:] == ["node0 slots=8", "node1 slots=8"]
    write_files(tmp_path / "run", files)
    seen = run_launch(tmp_path / "run", fake_bin(tmp_path, deepspeed=FAKE_DEEPSPEED), TRAINING_ENV)
    argv = seen["argv"]
    assert argv[:4] == ["--hostfile", str(tmp_path / "run" / "hostfile"), "--num_nodes", "2"]
    assert argv[4:8] == ["--master_addr", "node0", "--master_port", "29500"]
    assert seen["hostfile"] == files["hostfile"]


def test_slurm_rewrites_the_hostfile_with_the_allocated_nodes(tmp_path):
    # 20 H100: two full nodes and one of 4 GPUs.
    plan = make_plan(TINY, 20, 64, 20, zero=1)
    assert node_slots(plan) == [8, 8, 4]
    write_files(tmp_path / "run", emit_deepspeed(plan))
    scontrol = "#!/bin/sh\nprintf 'gpu-a\\ngpu-b\\ngpu-c\\n'\n"
    seen = run_launch(tmp_path / "run", fake_bin(tmp_path, deepspeed=FAKE_DEEPSPEED, scontrol=scontrol),
                      {"SLURM_JOB_NODELIST": "gpu-[a-c]", **TRAINING_ENV})
    assert seen["hostfile"].splitlines() == ["gpu-a slots=8", "gpu-b slots=8", "gpu-c slots=4"]
    assert seen["argv"][2:6] == ["--num_nodes", "3", "--master_addr", "gpu-a"]


def test_hostfile_is_for_several_nodes_only():
    with pytest.raises(InputError, match="without a hostfile"):
        hostfile_text(make_plan(TINY, 4, 64, 16))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_one_node_launch_trains_two_cpu_ranks_without_ssh(tmp_path):
    pytest.importorskip("deepspeed")
    write_files(tmp_path / "run", emit_deepspeed(make_plan(TINY, 2, 64, 8, zero=1), probe=True))
    bin_dir = fake_bin(tmp_path, ssh=FAKE_SSH, pdsh=FAKE_SSH)
    # launch.sh runs `deepspeed` by name: the one installed beside this interpreter, activated or not.
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
           "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    # This environment's own op-build folder, as probes use: the shared default one is rebuilt (and can be left
    # locked) by other environments of the host (integrations/extlocks.py `environment_root`).
    with_own_build_folder(env, sys.executable)
    env.pop("SLURM_JOB_NODELIST", None)
    proc = subprocess.Popen(["bash", str(tmp_path / "run" / "launch.sh"), "--iters", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, log[-3000:]
    records = [json.loads(line.split("AUTOPLAN_ITER ", 1)[1]) for line in log.splitlines() if "AUTOPLAN_ITER " in line]
    assert sorted((r["rank"], r["iteration"]) for r in records) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert {r["world_size"] for r in records} == {2}
    assert not (bin_dir / "ssh-was-called").exists()


def test_deepspeed_shm_cleanup_keeps_what_a_live_run_maps(tmp_path):
    """The suite's cleanup (tests/conftest.py remove_deepspeed_shm) removes a recent file no process maps and keeps
    one a live process maps (a run of another pytest worker), an older one and another user's."""
    uid = os.getuid()
    names = {k: tmp_path / f"{DS_SHM_PREFIX}_{u}_127.0.0.1_{port}_{r}" for k, (u, port, r) in {
        "ended": (uid, 4001, 0), "live": (uid, 4001, 1), "old": (uid, 4002, 0), "other": (uid + 1, 4003, 0)}.items()}
    for path in names.values():
        path.write_bytes(b"x" * 4096)
    os.utime(names["old"], (time.time() - 3600, time.time() - 3600))
    holder = subprocess.Popen([sys.executable, "-c", "import mmap, sys; f = open(sys.argv[1], 'r+b'); "
                               "m = mmap.mmap(f.fileno(), 0); print('mapped', flush=True); sys.stdin.read()",
                               str(names["live"])], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert remove_deepspeed_shm(time.time() - 600, tmp_path) == 1
        assert {k for k, p in names.items() if p.exists()} == {"live", "old", "other"}
    finally:
        holder.communicate("")
    assert remove_deepspeed_shm(time.time() - 600, tmp_path) == 1  # its holder gone, that file goes too
    assert {k for k, p in names.items() if p.exists()} == {"old", "other"}


def test_training_run_asks_for_its_data_and_model(tmp_path):
    write_files(tmp_path / "run", emit_deepspeed(make_plan(TINY, 8, 64, 16, zero=1)))
    bin_dir = fake_bin(tmp_path, deepspeed=FAKE_DEEPSPEED)
    for env, message in (({"MODEL_CONFIG": "/m"}, "set DATA_PATH"), ({"DATA_PATH": "/d"}, "set MODEL_CONFIG")):
        full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
        for name in {"MODEL_CONFIG", "DATA_PATH", "PRETRAINED"} - set(env):
            full.pop(name, None)
        out = subprocess.run(["bash", str(tmp_path / "run" / "launch.sh")], capture_output=True, text=True, env=full,
                             timeout=60)
        assert out.returncode != 0 and message in out.stderr and out.stdout == ""
    seen = run_launch(tmp_path / "run", bin_dir, {"PRETRAINED": "/ckpt/llama", "DATA_PATH": "/d"})
    assert seen["argv"][9:11] == ["--pretrained", "/ckpt/llama"]
