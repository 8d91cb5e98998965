"""Shared fixtures: small specs built directly (no catalogue files), so unit tests are independent."""
import pytest

from autoplan.cluster import ClusterSpec, GpuSpec
from autoplan.model import ModelSpec
from autoplan.workload import Workload


def make_gpu(**kw) -> GpuSpec:
    base = dict(id="h100", name="H100 SXM", peak_tflops={"bf16": 989.0, "fp8": 1979.0},
                gemm_efficiency={"bf16": 0.80, "fp8": 0.71}, hbm_gib=79.1, hbm_bandwidth_tbps=3.35,
                nvlink_bandwidth_gbytes_per_s=450.0, nvlink_domain_size=8, gpus_per_node=8, nics_per_node=8,
                nic_gbit_per_s=400.0, source="test")
    base.update(kw)
    return GpuSpec(**base)


def make_dense(**kw) -> ModelSpec:
    base = dict(name="dense-test", num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                num_query_groups=4, kv_channels=64, vocab_size=32000, max_position_embeddings=8192)
    base.update(kw)
    return ModelSpec(**base)


def make_moe(**kw) -> ModelSpec:
    base = dict(name="moe-test", num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                num_query_groups=4, kv_channels=64, vocab_size=32000, max_position_embeddings=8192,
                num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024, first_k_dense_layers=1)
    base.update(kw)
    return ModelSpec(**base)


@pytest.fixture
def gpu():
    return make_gpu()


@pytest.fixture
def dense():
    return make_dense()


@pytest.fixture
def moe():
    return make_moe()


def cluster(n=8, **kw) -> ClusterSpec:
    return ClusterSpec(gpu=make_gpu(**kw), num_gpus=n)


def workload(seq=2048, gbs=32) -> Workload:
    return Workload(seq_len=seq, global_batch_size=gbs)


# --- Deadlines of timing-dependent tests --------------------------------------------------------------------------
# A test that waits for processes (a probe, a launch, a kill) must not carry a deadline tuned to one machine: the
# suite has to pass on a loaded 2-core host as on a fast one. `startup_s()` measures what a probe rank pays before its
# first step on this machine as loaded as it is now: a fresh interpreter importing torch and deepspeed. Load changes
# during a session (other jobs start), so the measurement is repeated when the last one is older than
# STARTUP_REMEASURE_S, and the largest seen is used: a deadline never shrinks below what this session has observed.
# Deadlines are multiples of it (`deadline_s`), each multiple stated where it is used.
import os
import subprocess
import sys
import time
from pathlib import Path

STARTUP_REMEASURE_S = 120.0
_startup = {"at": None, "max_s": 0.0}


def _measure_startup() -> float:
    runs = []
    for _ in range(2):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch, deepspeed"], check=True, capture_output=True)
        runs.append(time.monotonic() - start)
    return max(runs)


def startup_s() -> float:
    """Seconds for a fresh `python -c "import torch, deepspeed"` here (the slower of two runs), re-measured when the
    last measurement is older than STARTUP_REMEASURE_S; the largest measurement of this session."""
    now = time.monotonic()
    if _startup["at"] is None or now - _startup["at"] > STARTUP_REMEASURE_S:
        _startup["max_s"] = max(_startup["max_s"], _measure_startup())
        _startup["at"] = time.monotonic()
    return _startup["max_s"]


def deadline_s(startups: float, floor_s: float = 5.0) -> float:
    """`startups` x startup_s(), at least floor_s (process start and signal delivery on an idle machine)."""
    return max(floor_s, startups * startup_s())


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of the autoplan CLI run in this process."""
    from autoplan.cli.main import main

    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


class Timeout(Exception):
    pass


def call_within(seconds, fn, what="fn()"):
    """fn(), or Timeout after `seconds` (SIGALRM: a hang fails the test instead of stalling it)."""
    import signal

    def alarm(*_):
        raise Timeout(f"{what}: no answer within {seconds:.1f} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# DeepSpeed's CPU all-reduce, in a run its own launcher starts on one node (it sets LOCAL_SIZE, which torchrun and
# the probes' launchers do not), makes one shared-memory file per rank,
# /dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>, 66 MB each (deepspeed/ops/csrc/cpu/
# comm/shm_interface.cpp `initialize`, shm.cpp `shm_initialize` / `shared_create`), and never unlinks it (its
# `shared_close` is not called). The tests that run an emitted launch.sh on 2 CPU ranks would leave 132 MB of memory
# behind each, until a busy machine that runs the suite again and again runs out of it.
DS_SHM_DIR = Path("/dev/shm")
DS_SHM_PREFIX = "deepspeed_allreduce_buffer"


def remove_deepspeed_shm(since: float, folder: Path = DS_SHM_DIR) -> int:
    """Remove this user's DeepSpeed all-reduce files (DS_SHM_PREFIX) in `folder` modified at or after `since`
    (time.time()) that no live process maps (/proc/<pid>/maps), so that a run still going beside (another
    pytest worker's, or another suite's) keeps its own; how many were removed. The files of ended runs go whoever
    made them: a test cannot count on finding its run's files after the run."""
    found = []
    for path in folder.glob(f"{DS_SHM_PREFIX}_{os.getuid()}_*"):
        try:
            if path.stat().st_mtime >= since:
                found.append(path)
        except FileNotFoundError:
            pass
    if not found:
        return 0
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        mapped.update(p for p in found if str(p) in text)
    removed = 0
    for path in found:
        if path not in mapped:
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
    return removed


@pytest.fixture(autouse=True)
def _no_deepspeed_shm_left():
    """After each test, the DeepSpeed all-reduce files its runs made (DS_SHM_PREFIX) are removed."""
    started = time.time() - 1.0  # file times are whole ticks: a second's margin
    yield
    remove_deepspeed_shm(started)
