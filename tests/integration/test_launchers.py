"""Launchers: local ranks, torchrun and Slurm (fake sbatch/squeue/sacct/scancel); hangs leave nothing running."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autoplan.errors import InputError
from autoplan.integrations.launchers import (KILL_GRACE_S, LaunchRequest, _spawn, kill_groups, launch,
                                            torchrun_command)
from conftest import deadline_s

FAKE_BIN = Path(__file__).parents[1] / "fixtures" / "bin"

PROGRAM = textwrap.dedent("""
    import os, socket, subprocess, sys, time
    mode, pid_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("RANK", "0"))
    print(f"rank={rank} world={os.environ.get('WORLD_SIZE')}", flush=True)
    if mode == "ok":
        sys.exit(0)
    if mode == "fail" and rank == 1:
        print("ValueError: injected failure", flush=True)
        sys.exit(3)
    if mode == "build":  # as torch's JIT build: the lock file, and the build's processes working in its folder
        op_dir = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], f"op_rank{rank}")
        os.makedirs(op_dir, exist_ok=True)
        open(os.path.join(op_dir, "lock"), "w").close()
        os.chdir(op_dir)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    # Local ranks: rank 0 holds the rendezvous port, as torch's env:// rank 0 does (under torchrun its agent does).
    if rank == 0 and os.environ.get("MASTER_PORT") and "TORCHELASTIC_RUN_ID" not in os.environ:
        server = socket.socket()
        server.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))
        server.listen()
        print(f"port={os.environ['MASTER_PORT']}", flush=True)
    with open(os.path.join(pid_dir, f"pids.{rank}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _pids(pid_dir: Path):
    return [int(p) for f in pid_dir.glob("pids.*") for p in f.read_text().split()]


def _request(tmp_path: Path, mode: str, nproc: int = 2) -> LaunchRequest:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    return LaunchRequest(script=str(script), args=[mode, str(tmp_path)], nproc_per_node=nproc, cwd=str(tmp_path))


def _wait_for(check, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout_s:.0f} s")


def test_local_two_ranks_ok(tmp_path):
    out = launch("local", _request(tmp_path, "ok"), tmp_path / "run.log", timeout_s=30)
    assert out.returncode == 0 and not out.timed_out
    log = (tmp_path / "run.log").read_text()
    assert "rank=0 world=2" in log and "rank=1 world=2" in log


@pytest.mark.slow
def test_local_failure_kills_waiting_peer(tmp_path):
    out = launch("local", _request(tmp_path, "fail"), tmp_path / "run.log", timeout_s=600)
    assert out.returncode == 3 and not out.timed_out
    # Two interpreters start, one fails, the peer is killed then: the launch ends within a few start-ups of this
    # machine (load-scaled), not at the 600 s timeout it would wait for otherwise.
    assert out.wall_time_s < deadline_s(6)
    time.sleep(0.2)
    assert _pids(tmp_path) and not any(_alive(p) for p in _pids(tmp_path))


IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
               "time.sleep(300)"


def test_kill_groups_ends_when_the_groups_do_and_reaps_them():
    """kill_groups (the launchers' and the engine tests' one way to end a launched group) returns once a group that
    exits on SIGTERM is gone, not after the whole grace period its leader's zombie used to fill, and reaps the
    leader; a group that ignores SIGTERM is killed when the grace period ends."""
    grace = deadline_s(4, floor_s=20.0)
    quits = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    stays = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert stays.stdout.readline().strip() == "ready"
    start = time.monotonic()
    kill_groups([quits], grace_s=grace)
    assert time.monotonic() - start < grace / 2
    assert quits.returncode == -signal.SIGTERM
    kill_groups([stays], grace_s=0.5)
    assert stays.returncode == -signal.SIGKILL
    stays.stdout.close()


@pytest.mark.slow
def test_local_hang_killed_with_grandchildren(tmp_path):
    # Long enough for both ranks and their children to start on this machine, now (load-scaled).
    out = launch("local", _request(tmp_path, "hang"), tmp_path / "run.log", timeout_s=deadline_s(2))
    assert out.timed_out and out.returncode is None
    time.sleep(0.2)
    pids = _pids(tmp_path)
    assert len(pids) == 4  # two ranks, each with a sleeping child
    assert not any(_alive(p) for p in pids)


LAUNCHER_PARENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from autoplan.integrations.launchers import LaunchRequest, launch
    req = LaunchRequest.model_validate_json(Path(sys.argv[1]).read_text())
    launch("local", req, Path(sys.argv[2]), timeout_s=600)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_launcher_killed_leaves_no_rank_and_no_port(tmp_path, sig):
    """The process that launched the ranks dies without cleaning up (SIGKILL, or SIGTERM with no handler): its
    ranks, their children and the rendezvous port go with it."""
    req_file = tmp_path / "req.json"
    req_file.write_text(_request(tmp_path, "hang").model_dump_json())
    parent = subprocess.Popen([sys.executable, "-c", LAUNCHER_PARENT, str(req_file), str(tmp_path / "run.log")])
    pids = _wait_for(lambda: len(_pids(tmp_path)) == 4 and _pids(tmp_path), deadline_s(6), "two ranks started")
    port = int(_wait_for(lambda: [line for line in (tmp_path / "run.log").read_text().splitlines()
                                  if line.startswith("port=")], deadline_s(2), "port bound")[0][5:])
    parent.send_signal(sig)
    parent.wait(timeout=deadline_s(1))
    # SIGTERM, a grace period for the ranks to exit (they do at once), then SIGKILL.
    _wait_for(lambda: not any(_alive(p) for p in pids), KILL_GRACE_S + deadline_s(2, floor_s=10.0),
              "every rank gone")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# The launcher dies in the moment between starting a rank and telling the reaper about it (register exits the
# process before it returns): the rank must never start.
DIES_BEFORE_REGISTERING = textwrap.dedent("""
    import os, sys
    from autoplan.integrations.launchers import _spawn
    marker = sys.argv[1]
    with open(os.devnull, "wb") as log:
        _spawn([sys.executable, "-c", "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(300)", marker],
               dict(os.environ), ".", log, register=lambda pid: (print(pid, flush=True), os._exit(9)))
""")


def test_launcher_killed_before_registering_a_rank_leaves_nothing(tmp_path):
    marker = tmp_path / "rank-ran"
    done = subprocess.run([sys.executable, "-c", DIES_BEFORE_REGISTERING, str(marker)], capture_output=True,
                          text=True, timeout=deadline_s(4))
    assert done.returncode == 9, done.stderr
    gate = int(done.stdout.split()[0])
    _wait_for(lambda: not _alive(gate), deadline_s(2), "the gated process gone")
    assert not marker.exists()  # the command never ran


def test_spawn_of_a_missing_program_raises_as_popen_does(tmp_path):
    with open(os.devnull, "wb") as log, pytest.raises(FileNotFoundError):
        _spawn([str(tmp_path / "no-such-program")], dict(os.environ), str(tmp_path), log, register=lambda pid: None)
    with open(os.devnull, "wb") as log, pytest.raises(FileNotFoundError):
        _spawn(["no-such-program-on-path"], dict(os.environ), str(tmp_path), log, register=lambda pid: None)
    # A relative path is found from the command's working folder, as Popen(cwd=...) finds it.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "prog").write_text("#!/bin/sh\nexit 7\n")
    (tmp_path / "bin" / "prog").chmod(0o755)
    with open(os.devnull, "wb") as log:
        proc = _spawn(["bin/prog"], dict(os.environ), str(tmp_path), log, register=lambda pid: None)
    assert proc.wait(timeout=deadline_s(2)) == 7


def test_launcher_killed_mid_build_leaves_no_build_lock(tmp_path):
    """The launching process is SIGKILLed while its ranks hold torch extension-build locks (a JIT op build): the
    reaper ends the ranks and then removes the locks they left, so the next start does not find a stale lock."""
    ext = tmp_path / "torch_extensions"
    req = _request(tmp_path, "build").model_copy(update={"env": {"TORCH_EXTENSIONS_DIR": str(ext)}})
    req_file = tmp_path / "req.json"
    req_file.write_text(req.model_dump_json())
    parent = subprocess.Popen([sys.executable, "-c", LAUNCHER_PARENT, str(req_file), str(tmp_path / "run.log")])
    pids = _wait_for(lambda: len(_pids(tmp_path)) == 4 and _pids(tmp_path), deadline_s(6), "two ranks building")
    assert len(list(ext.glob("*/lock"))) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=deadline_s(1))
    _wait_for(lambda: not any(_alive(p) for p in pids), KILL_GRACE_S + deadline_s(2, floor_s=10.0),
              "every rank gone")
    _wait_for(lambda: not list(ext.glob("*/lock")), deadline_s(2), "the build locks removed")


def test_local_rejects_several_nodes(tmp_path):
    req = _request(tmp_path, "ok").model_copy(update={"nnodes": 2})
    with pytest.raises(InputError, match="one node"):
        launch("local", req, tmp_path / "run.log", timeout_s=5)


def test_torchrun_command_single_and_multi_node():
    req = LaunchRequest(script="train.py", args=["--x"], nproc_per_node=4, python="py")
    assert torchrun_command(req) == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                                     "train.py", "--x"]
    multi = req.model_copy(update={"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "node0:29500"})
    assert torchrun_command(multi) == ["py", "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1",
                                       "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500",
                                       "train.py", "--x"]
    with pytest.raises(InputError, match="rendezvous"):
        torchrun_command(req.model_copy(update={"nnodes": 2}))


@pytest.mark.slow
def test_torchrun_runs_two_ranks(tmp_path):
    out = launch("torchrun", _request(tmp_path, "ok"), tmp_path / "run.log", timeout_s=120)
    assert out.returncode == 0, (tmp_path / "run.log").read_text()
    log = (tmp_path / "run.log").read_text()
    assert "rank=0 world=2" in log and "rank=1 world=2" in log


@pytest.mark.slow
def test_torchrun_hang_leaves_nothing(tmp_path):
    out = launch("torchrun", _request(tmp_path, "hang"), tmp_path / "run.log", timeout_s=deadline_s(6))
    assert out.timed_out
    time.sleep(0.5)
    pids = _pids(tmp_path)
    assert pids and not any(_alive(p) for p in pids)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path / "slurm"))
    return tmp_path / "slurm"


@pytest.mark.slow
def test_slurm_completed(tmp_path, fake_slurm):
    from autoplan.integrations import launchers

    out = launchers.run_slurm(_request(tmp_path, "ok"), tmp_path / "run.log", timeout_s=120, poll_s=0.2)
    assert out.returncode == 0 and out.job_state == "COMPLETED", (tmp_path / "run.log").read_text()
    assert out.job_id == "1000"
    assert out.command[:2] == ["sbatch", "--parsable"]
    script = (tmp_path / "run.sbatch").read_text()
    assert "#SBATCH --nodes=1" in script and "srun " in script and "--standalone" in script
    assert "rank=1 world=2" in (tmp_path / "run.log").read_text()


@pytest.mark.slow
def test_slurm_job_does_not_join_a_store_already_on_its_node(tmp_path, fake_slurm):
    """Another job's rendezvous store on the node (here a listener on the port a fixed-port script used, 29500) is
    not joined: a single-node job's store takes a free port. With the fixed port the ranks connected to the
    listener and the job failed (seen with two test runs on one machine)."""
    from autoplan.integrations import launchers

    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", 29500))
        squatter.listen(8)
    except OSError:
        pass  # something else listens there already: the same situation
    try:
        out = launchers.run_slurm(_request(tmp_path, "ok"), tmp_path / "run.log", timeout_s=deadline_s(16),
                                  poll_s=0.2)
    finally:
        squatter.close()
    assert out.returncode == 0 and out.job_state == "COMPLETED", (tmp_path / "run.log").read_text()


def test_slurm_several_nodes_rendezvous_on_a_port_of_the_job():
    """Every node's task computes the same port from the job id, and two jobs get different ones."""
    from autoplan.integrations import launchers

    req = LaunchRequest(script="train.py", nproc_per_node=4, nnodes=2, python="py")
    script = launchers.slurm_script(req, Path("run.log"), 60)
    assert "--standalone" not in script
    endpoint = next(w for w in script.split() if w.startswith("--rdzv-endpoint="))
    port_expr = endpoint.split(":", 1)[1]
    ports = [int(subprocess.run(["bash", "-c", f"echo {port_expr}"], env={"SLURM_JOB_ID": str(job)},
                                capture_output=True, text=True, check=True).stdout) for job in (1000, 1001, 1000)]
    assert ports[0] == ports[2] != ports[1]
    assert all(1024 < p < 65536 for p in ports)


def test_slurm_failed_job(tmp_path, fake_slurm):
    from autoplan.integrations import launchers

    out = launchers.run_slurm(_request(tmp_path, "fail"), tmp_path / "run.log", timeout_s=120, poll_s=0.2)
    assert out.job_state == "FAILED" and out.returncode == 1 and not out.timed_out


@pytest.mark.slow
def test_slurm_timeout_scancels(tmp_path, fake_slurm):
    from autoplan.integrations import launchers

    out = launchers.run_slurm(_request(tmp_path, "hang"), tmp_path / "run.log", timeout_s=12, poll_s=0.2)
    assert out.timed_out and out.job_state == "TIMEOUT"
    assert (fake_slurm / "1000.state").read_text().startswith("CANCELLED")
    time.sleep(1.0)
    pids = _pids(tmp_path)
    assert pids and not any(_alive(p) for p in pids)


def test_slurm_missing_tools_is_input_error(tmp_path, monkeypatch):
    from autoplan.integrations import launchers

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError, match="sbatch"):
        launchers.run_slurm(_request(tmp_path, "ok"), tmp_path / "run.log", timeout_s=5)
