"""Start a training program on N ranks and wait for it, with a timeout that kills everything it started.

Three launchers share one request/outcome pair:
- `local`: this process spawns the ranks itself (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set the
  way torch.distributed's env:// rendezvous reads them).
- `torchrun`: `python -m torch.distributed.run`; one node `--standalone --nproc-per-node N`, several nodes
  `--nnodes --node-rank --rdzv-backend c10d --rdzv-endpoint host:port` (torch/distributed/run.py).
- `slurm`: `sbatch --parsable` of a generated job script that runs torchrun on every node through `srun`, then
  polls `squeue -j ID -h -o %T` until the job leaves the queue and reads its final state with
  `sacct -j ID -n -P -o State`; on timeout `scancel ID`.

Every local child starts in a new session (its own process group); a hang or an exit that leaves stragglers is
cleaned up with `os.killpg` SIGTERM, then SIGKILL after a grace period, so nothing outlives the launch. The same
happens when this process is interrupted (SIGINT/SIGTERM raise here and the cleanup runs on the way out) and when
it dies without a chance to clean up (SIGKILL, a crash): a small reaper process, started first, holds the read end
of a pipe from this process; when the pipe closes without a release it kills every group of the launch, so ranks
never outlive their launcher, and their ports go with them. Each command starts behind a gate (`GATE`) that lets
it run only once the reaper knows its group, so a launcher killed in between leaves nothing either. A group is
killed as a whole (`killpg`), so torchrun's workers and anything the ranks started go too.
"""
from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from autoplan.errors import InputError
from autoplan.integrations.extlocks import extension_roots

LauncherName = Literal["local", "torchrun", "slurm"]
LAUNCHERS = ("local", "torchrun", "slurm")
KILL_GRACE_S = 5.0


class LaunchRequest(BaseModel):
    """What to run and on how many ranks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    script: str = Field(description="Path of the Python training script.")
    args: List[str] = Field(default_factory=list, description="Arguments of the script.")
    nproc_per_node: int = Field(1, gt=0, description="Ranks (processes) per node.")
    nnodes: int = Field(1, gt=0, description="Nodes.")
    node_rank: int = Field(0, ge=0, description="This node's index (torchrun multi-node only).")
    rdzv_endpoint: Optional[str] = Field(None, description="host:port of the rendezvous (multi-node torchrun).")
    env: Dict[str, str] = Field(default_factory=dict, description="Extra environment variables for every rank.")
    cwd: str = Field(".", description="Working directory of the ranks.")
    python: str = Field(sys.executable, description="Python interpreter that runs the script.")
    gpus_per_node: int = Field(0, ge=0, description="GPUs to request per node (Slurm only); 0 = none.")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


class LaunchOutcome(BaseModel):
    """How a launch ended."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    launcher: LauncherName = Field(description="Which launcher ran it.")
    command: List[str] = Field(description="The command line that was started (argv).")
    returncode: Optional[int] = Field(description="Exit status (worst over ranks); None when killed on timeout.")
    timed_out: bool = Field(description="The timeout expired and the job was killed.")
    wall_time_s: float = Field(description="From start to end (or kill), s.")
    log_path: str = Field(description="File that holds stdout and stderr of every rank.")
    job_id: Optional[str] = Field(None, description="Slurm job id.")
    job_state: Optional[str] = Field(None, description="Slurm's final job state (sacct State).")


def free_port() -> int:
    """An unused TCP port on this host for the rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still exists (zombies of our own children are reaped by wait)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


# The gate every command starts behind: it waits for one byte on an inherited pipe before it becomes the command
# (exec keeps its pid, session and environment). The launcher sends the byte only after the reaper knows the new
# process group, so a launcher killed between starting a rank and registering it (SIGKILL under load) leaves a gate
# that reads end of file and exits, never a rank nobody will end.
GATE = """
import os, sys
fd = int(sys.argv[1])
go = os.read(fd, 1)
os.close(fd)
if go != b"g":
    os._exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _spawn(argv: List[str], env: Dict[str, str], cwd: str, log, register: Callable[[int], None]) -> subprocess.Popen:
    """Start `argv` in a new session (the child leads its own process group, which killpg reaches with all its
    descendants) behind GATE, call `register(pid)`, then let it run."""
    # As Popen itself would raise: a bare name is looked up on the command's PATH, a path from its working folder.
    if os.sep in argv[0]:
        found = os.access(os.path.join(cwd, argv[0]), os.X_OK)
    else:
        found = shutil.which(argv[0], path=os.pathsep.join(os.get_exec_path(env))) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-c", GATE, str(read_end), *argv], env=env, cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                pass_fds=(read_end,))
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    try:
        register(proc.pid)
        os.write(write_end, b"g")
    finally:
        os.close(write_end)
    return proc


# The reaper: reads "pgid" lines and "locks SINCE ROOT" lines, then "release" (the launch cleaned up itself) or end
# of file (this process died): on end of file it ends every group, SIGTERM then SIGKILL, and then removes the torch
# extension-build locks under each ROOT that were created since SINCE and that no process builds in any more (a
# build its kill interrupted; extlocks.clear_orphans), so a killed launch leaves no lock behind either. It runs in
# its own session, so a terminal's SIGINT to this process group does not reach it, and holds no other descriptor of
# ours.
REAPER = """
import os, signal, sys, time
pgids, locks = [], []
for line in sys.stdin:
    if line.strip() == "release":
        sys.exit(0)
    if line.startswith("locks "):
        since, root = line[len("locks "):].rstrip("\\n").split(" ", 1)
        locks.append((float(since), root))
        continue
    pgids.append(int(line))
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
for sig, wait_s in ((signal.SIGTERM, float(sys.argv[1])), (signal.SIGKILL, 0.0)):
    for g in pgids:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    end = time.monotonic() + wait_s
    while time.monotonic() < end and any(alive(g) for g in pgids):
        time.sleep(0.05)
if locks:
    # SIGKILLed builders (ninja, the compiler) may take a moment to go; a lock is removed only once nothing works in
    # its folder, so wait for the groups to be gone first (bounded).
    end = time.monotonic() + 10.0
    while time.monotonic() < end and any(alive(g) for g in pgids):
        time.sleep(0.05)
    from pathlib import Path
    from autoplan.integrations.extlocks import clear_orphans
    for since, root in locks:
        clear_orphans([Path(root)], since)
"""


class Reaper:
    """Ends the launch's process groups if this process dies before it cleans up (see the module doc)."""

    def __init__(self, grace_s: float = KILL_GRACE_S):
        self.proc = subprocess.Popen([sys.executable, "-c", REAPER, str(grace_s)], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     text=True)

    def watch(self, pgid: int) -> None:
        self.proc.stdin.write(f"{pgid}\n")
        self.proc.stdin.flush()

    def watch_locks(self, roots: List[Path], since: float) -> None:
        """Build locks under `roots` created since `since` (time.time()) are removed if this process dies."""
        for root in roots:
            self.proc.stdin.write(f"locks {since!r} {root}\n")
        self.proc.stdin.flush()

    def release(self) -> None:
        """The launch cleaned up after itself: stop the reaper without it killing anything."""
        try:
            self.proc.stdin.write("release\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        self.proc.wait()


def kill_groups(procs: List[subprocess.Popen], grace_s: float = KILL_GRACE_S) -> None:
    """End the process groups `procs` lead (each started in a session of its own) and reap the leaders: SIGTERM
    every group, wait until all of them are gone or `grace_s` has passed, SIGKILL what is left. A leader that ended
    is reaped while waiting, so its zombie does not keep its group counted alive for the whole grace period."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None or group_alive(p.pid) for p in procs):
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None or group_alive(proc.pid):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for proc in procs:
        proc.wait()


def run_group(commands: List[List[str]], envs: List[Dict[str, str]], cwd: str, log_path: Path,
              timeout_s: float, launcher: LauncherName,
              on_tick: Optional[Callable[[], None]] = None) -> LaunchOutcome:
    """Start every command in its own new process group, wait for all or the timeout, leave nothing running,
    whether the launch ends, times out, or this process is interrupted or killed. `on_tick` runs at every poll."""
    start = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    reaper = Reaper()
    reaper.watch_locks(sorted({root for env in envs for root in extension_roots(env)}), time.time())
    procs: List[subprocess.Popen] = []
    codes = None
    try:
        with open(log_path, "ab", buffering=0) as log:
            for cmd, env in zip(commands, envs):
                procs.append(_spawn(cmd, env, cwd, log, reaper.watch))
            codes = _wait_all(procs, start + timeout_s, on_tick)
    finally:
        # On a hang, an interrupt, or when one rank died while its peers wait forever in a collective, this ends
        # the ranks; after a clean exit it ends stragglers the ranks forked and left behind.
        kill_groups(procs, grace_s=KILL_GRACE_S if codes_failed(procs) else 1.0)
        reaper.release()
    timed_out = codes is None
    return LaunchOutcome(launcher=launcher, command=commands[0], timed_out=timed_out,
                         returncode=None if timed_out else _cause_code(codes),
                         wall_time_s=time.monotonic() - start, log_path=str(log_path))


def _cause_code(codes: List[Optional[int]]) -> int:
    """The exit status that explains the run: the first rank that failed on its own, else 0."""
    return next((c for c in codes if c not in (None, 0)), 0)


def codes_failed(procs: List[subprocess.Popen]) -> bool:
    return any(p.poll() != 0 for p in procs)


def _wait_all(procs: List[subprocess.Popen], deadline: float,
              on_tick: Optional[Callable[[], None]] = None) -> Optional[List[int]]:
    """Exit codes once every process ended, or as soon as one fails (its peers would hang; they get None),
    or None on timeout."""
    while time.monotonic() < deadline:
        if on_tick:
            on_tick()
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            grace_end = min(deadline, time.monotonic() + 2.0)
            while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            return [p.poll() for p in procs]  # None marks a peer that had to be killed
        if all(c is not None for c in codes):
            return codes
        time.sleep(0.05)
    return None


def _base_env(req: LaunchRequest) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(req.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def local_commands(req: LaunchRequest) -> tuple[List[List[str]], List[Dict[str, str]]]:
    """One process per rank with torch's env:// variables; single node only."""
    if req.nnodes != 1:
        raise InputError(f"launcher local runs on one node, got nnodes={req.nnodes}; use --launcher torchrun or slurm")
    port = str(free_port())
    commands, envs = [], []
    for rank in range(req.nproc_per_node):
        env = _base_env(req)
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(req.world_size),
                   LOCAL_WORLD_SIZE=str(req.nproc_per_node), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        commands.append([req.python, req.script, *req.args])
        envs.append(env)
    return commands, envs


def torchrun_command(req: LaunchRequest) -> List[str]:
    """torchrun argv (torch/distributed/run.py): --standalone for one node, c10d rendezvous for several."""
    argv = [req.python, "-m", "torch.distributed.run"]
    if req.nnodes == 1:
        argv += ["--standalone", f"--nproc-per-node={req.nproc_per_node}"]
    else:
        if not req.rdzv_endpoint:
            raise InputError(f"torchrun with nnodes={req.nnodes} needs a rendezvous endpoint; pass host:port")
        argv += [f"--nnodes={req.nnodes}", f"--node-rank={req.node_rank}", f"--nproc-per-node={req.nproc_per_node}",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={req.rdzv_endpoint}"]
    return argv + [req.script, *req.args]


def run_local(req: LaunchRequest, log_path: Path, timeout_s: float) -> LaunchOutcome:
    commands, envs = local_commands(req)
    return run_group(commands, envs, req.cwd, log_path, timeout_s, "local")


def run_torchrun(req: LaunchRequest, log_path: Path, timeout_s: float) -> LaunchOutcome:
    return run_group([torchrun_command(req)], [_base_env(req)], req.cwd, log_path, timeout_s, "torchrun")


def launch(launcher: LauncherName, req: LaunchRequest, log_path: Path, timeout_s: float) -> LaunchOutcome:
    """Run `req` with the named launcher."""
    if launcher == "local":
        return run_local(req, log_path, timeout_s)
    if launcher == "torchrun":
        return run_torchrun(req, log_path, timeout_s)
    if launcher == "slurm":
        return run_slurm(req, log_path, timeout_s)
    raise InputError(f"unknown launcher {launcher!r}; valid launchers: {', '.join(LAUNCHERS)}")


def shell_join(argv: List[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


# --- Slurm -------------------------------------------------------------------------------------------------------
SLURM_POLL_S = 2.0
# Several nodes: the c10d rendezvous port on the first node follows the job id, so every task computes the same port
# and two jobs whose first node is the same one do not join one store (a fixed port did: the second job's ranks met
# the first job's store). One node: torchrun --standalone binds the store to port 0, a free port the kernel picks on
# that node (torch/distributed/run.py `run`: rdzv_endpoint "localhost:0", a fresh uuid as rdzv_id).
RDZV_PORT_BASE, RDZV_PORT_SPAN = 20000, 20000
RDZV_PORT = f"$(({RDZV_PORT_BASE}+SLURM_JOB_ID%{RDZV_PORT_SPAN}))"  # one shell word: the line leaves it unquoted
_SLURM_DONE_OK = {"COMPLETED"}


def slurm_script(req: LaunchRequest, log_path: Path, timeout_s: float) -> str:
    """A batch script: one task per node, each runs torchrun with a c10d rendezvous on the first node."""
    minutes = max(1, int(timeout_s // 60) + 1)
    lines = ["#!/bin/bash", "#SBATCH --job-name=autoplan-probe", f"#SBATCH --nodes={req.nnodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={log_path}", f"#SBATCH --time={minutes}"]
    if req.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={req.gpus_per_node}")
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(Path(req.cwd).resolve()))}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(req.env.items())]
    lines.append('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1 || hostname)')
    rdzv = (["--standalone"] if req.nnodes == 1 else
            ["--rdzv-id=$SLURM_JOB_ID", "--rdzv-backend=c10d", f"--rdzv-endpoint=$MASTER_ADDR:{RDZV_PORT}"])
    torchrun = [req.python, "-m", "torch.distributed.run", f"--nnodes={req.nnodes}",
                f"--nproc-per-node={req.nproc_per_node}", *rdzv, req.script, *req.args]
    # Node rank comes from the c10d rendezvous, so every task runs the same line (torch/distributed/run.py).
    lines.append("srun " + " ".join(a if a.startswith("--rdzv") else shlex.quote(a) for a in torchrun))
    return "\n".join(lines) + "\n"


def _run_tool(argv: List[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise InputError(f"launcher slurm needs {argv[0]!r} on PATH; run on a Slurm login node") from None
    if done.returncode != 0:
        raise RuntimeError(f"{shell_join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def slurm_state(job_id: str) -> Optional[str]:
    """The job's state while queued or running (squeue), None once it has left the queue."""
    out = _run_tool(["squeue", "-h", "-j", job_id, "-o", "%T"])
    return out.splitlines()[0].strip() if out else None


def slurm_final_state(job_id: str) -> str:
    """Final state from accounting; first line is the allocation itself ('CANCELLED by 0' -> 'CANCELLED')."""
    out = _run_tool(["sacct", "-n", "-P", "-j", job_id, "-o", "State"])
    return out.splitlines()[0].split()[0] if out else "UNKNOWN"


def run_slurm(req: LaunchRequest, log_path: Path, timeout_s: float, poll_s: float = SLURM_POLL_S) -> LaunchOutcome:
    """Submit, poll until the job leaves the queue or the timeout, scancel on timeout."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    script_path = log_path.with_suffix(".sbatch")
    script_path.write_text(slurm_script(req, log_path, timeout_s))
    command = ["sbatch", "--parsable", str(script_path)]
    start = time.monotonic()
    job_id = _run_tool(command).split(";")[0].strip()  # --parsable prints 'id' or 'id;cluster'
    timed_out = False
    while slurm_state(job_id) is not None:
        if time.monotonic() - start > timeout_s:
            _run_tool(["scancel", job_id])
            timed_out = True
            break
        time.sleep(poll_s)
    state = "TIMEOUT" if timed_out else slurm_final_state(job_id)
    return LaunchOutcome(launcher="slurm", command=command, returncode=None if timed_out else
                         (0 if state in _SLURM_DONE_OK else 1), timed_out=timed_out,
                         wall_time_s=time.monotonic() - start, log_path=str(log_path), job_id=job_id,
                         job_state=state)
