"""Real DeepSpeed training on CPU with emitted files: one process per planned GPU (torchrun, gloo), a tiny model,
a few steps."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoplan.integrations.deepspeed import emit_deepspeed
from autoplan.integrations.extlocks import clear_orphans, find_locks, is_stale, stale_message, with_own_build_folder
from autoplan.integrations.launchers import kill_groups
from conftest import deadline_s
from engine_checks.plans import TINY, TINY_MOE, make_plan

pytestmark = pytest.mark.slow


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_emitted(tmp_path, plan, iters=3, env_extra=None):
    """Start the emitted ds_train.py under torchrun in its own session: (command, process)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, text in emit_deepspeed(plan, probe=True).items():
        (tmp_path / name).write_text(text)
    s = plan.strategy
    recompute = ["--recompute", s.recompute]
    if s.recompute == "full":
        recompute += ["--recompute-method", s.recompute_method, "--recompute-layers", str(s.recompute_layers)]
    nproc = str(plan.cluster.num_gpus)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", nproc, "--master_port", str(free_port()),
           str(tmp_path / "ds_train.py"), "--deepspeed_config", str(tmp_path / "ds_config.json"),
           "--model-json", str(tmp_path / "model.json"), "--seq-len", str(plan.workload.seq_len),
           "--iters", str(iters), *recompute]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    # This environment's own op-build folder, as probes use: the shared default one is rebuilt (and can be left
    # locked) by other environments of the host (integrations/extlocks.py `environment_root`).
    with_own_build_folder(env, sys.executable)
    # A lock a killed run left behind makes every DeepSpeed start wait on it forever: fail at once, naming it.
    for lock in find_locks([Path(env["TORCH_EXTENSIONS_DIR"])]):
        if is_stale(lock):
            pytest.fail(stale_message(lock))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    proc.extensions_dir, proc.started_at = Path(env["TORCH_EXTENSIONS_DIR"]), time.time()
    return cmd, proc


def terminate_group(proc):
    """End torchrun as the probe launcher ends its ranks (integrations/launchers.py kill_groups): SIGTERM its group
    (torchrun stops the workers, each in a session of its own), SIGKILL it if that hangs too."""
    kill_groups([proc], grace_s=deadline_s(20))
    # Every rank loads DeepSpeed's shm op under torch's build lock (torch/utils/cpp_extension.py `_jit_compile`
    # takes the FileBaton on each load): a rank stopped there leaves it. Remove the ones this run created, as the
    # probe launcher's reaper does (integrations/launchers.py).
    clear_orphans([proc.extensions_dir], since=proc.started_at)


def stop_group(proc):
    """terminate_group, then the rest of stdout."""
    terminate_group(proc)
    return proc.communicate()[0]


def run_emitted(tmp_path, plan, iters=3, env_extra=None, timeout=None):
    """Run the emitted ds_train.py under torchrun; on timeout the whole group is killed."""
    timeout = timeout or deadline_s(200)  # a safety net only: a tiny model trains in a few start-ups
    cmd, proc = start_emitted(tmp_path, plan, iters, env_extra)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stop_group(proc)) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def tagged_records(stdout, tag):
    return [json.loads(line.split(tag + " ", 1)[1]) for line in stdout.splitlines() if tag + " " in line]


def iteration_records(stdout):
    return tagged_records(stdout, "AUTOPLAN_ITER")


def losses(stdout, rank):
    return [r["loss"] for r in sorted(iteration_records(stdout), key=lambda r: r["iteration"]) if r["rank"] == rank]


def check_run(out, iters, loss_ranks):
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    records = iteration_records(out.stdout)
    assert sorted((r["rank"], r["iteration"]) for r in records) == [(r, i) for r in (0, 1) for i in range(1, iters + 1)]
    for r in records:
        assert r["world_size"] == 2 and r["elapsed_ms"] > 0 and r["tokens_per_s"] > 0 and r["host_rss_peak_gib"] > 0
        if r["rank"] in loss_ranks:
            assert 0 < r["loss"] < 20
    assert 'AUTOPLAN_DONE {"iterations": %d, "world_size": 2}' % iters in out.stdout


def test_zero3_moe_selective_recompute(tmp_path):
    plan = make_plan(TINY_MOE, 2, 64, 8, zero=3, mbs=2, recompute="selective")
    check_run(run_emitted(tmp_path, plan), 3, loss_ranks=(0, 1))


def test_two_pipeline_stages_zero1_full_recompute(tmp_path):
    plan = make_plan(TINY, 2, 64, 8, pp=2, zero=1, mbs=2, recompute="full")
    check_run(run_emitted(tmp_path, plan), 3, loss_ranks=(1,))  # the last stage holds the loss


def test_gemma_like_layers_train_under_autotp(tmp_path):
    # GeGLU, partial rotary, q/k norms, sandwich norms and final-logit soft-capping, sharded two ways by AutoTP.
    gemma_like = TINY.model_copy(update={"name": "tiny-gemma", "sandwich_norm": True, "gate_activation": "gelu_tanh",
                                         "rotary_percent": 0.5, "qk_layernorm": True, "logit_softcapping": 30.0})
    check_run(run_emitted(tmp_path, make_plan(gemma_like, 2, 64, 8, tp=2, zero=1, mbs=2)), 3, loss_ranks=(0, 1))


def test_injected_failure_exits_nonzero(tmp_path):
    plan = make_plan(TINY, 2, 32, 4, zero=2, mbs=1)
    out = run_emitted(tmp_path, plan, iters=2, env_extra={"AUTOPLAN_FAULT": "fail", "AUTOPLAN_FAULT_RANK": "1"})
    assert out.returncode != 0 and "injected failure on rank 1" in out.stdout + out.stderr


def test_injected_hang_is_stopped_by_timeout(tmp_path):
    """A rank that stops making progress is stopped by a deadline that starts at the hang, not at launch: how long
    torchrun and two DeepSpeed ranks take to get there depends on how loaded the machine is, which is not under test."""
    plan = make_plan(TINY, 2, 32, 4, zero=1, mbs=1)
    _, proc = start_emitted(tmp_path, plan, iters=2, env_extra={"AUTOPLAN_FAULT": "hang"})
    lines, hung = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "AUTOPLAN_FAULT=hang: rank 0 sleeping" in line:
                hung.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # A safety net only (a run that never reaches the hang fails here): 60 start-ups of torch + deepspeed.
        assert hung.wait(deadline_s(60)), "rank 0 never reached the injected hang:\n" + "".join(lines)[-2000:]
        # Past the hang nothing progresses: the run does not end on its own within the deadline.
        try:
            ended_with = proc.wait(timeout=deadline_s(1))
        except subprocess.TimeoutExpired:
            ended_with = None
        assert ended_with is None, "the run ended on its own past the injected hang"
    finally:
        terminate_group(proc)  # the deadline stops it, as a probe's watchdog does
        reader.join(timeout=deadline_s(20))
    output = "".join(lines)
    assert "AUTOPLAN_FAULT=hang: rank 0 sleeping" in output
    assert "AUTOPLAN_ITER" not in output


def tiny_params_split_by_autotp(model):
    """(replicated, split) parameter counts of ds_train's dense model: Q/K/V/O and the MLP are split by AutoTP;
    embedding, norms and LM head are replicated (ds_train.Gpt._tp_plan)."""
    h, d = model.hidden_size, model.kv_channels
    attn = h * d * (2 * model.num_attention_heads + 2 * model.num_query_groups)
    mlp = 3 * h * model.ffn_hidden_size  # SwiGLU: up, gate, down
    replicated = 2 * model.vocab_size * h + (2 * model.num_layers + 1) * h
    return replicated, model.num_layers * (attn + mlp)


def test_autotp_two_way_trains_like_one_unsharded_process(tmp_path):
    """tp=2 on 2 processes: DeepSpeed counts dp = world / tp = 1 (the emitted batch sizes hold), each rank holds half of
    every split matrix, and the losses match the same model and tokens trained unsharded on 1 process."""
    plan = make_plan(TINY, 2, 32, 8, tp=2, zero=1, mbs=2)  # gbs 8 = mbs 2 x gas 4 x dp 1
    sharded = run_emitted(tmp_path / "tp2", plan)
    check_run(sharded, 3, loss_ranks=(0, 1))
    replicated, split = tiny_params_split_by_autotp(TINY)
    layouts = sorted(tagged_records(sharded.stdout, "AUTOPLAN_LAYOUT"), key=lambda r: r["rank"])
    assert layouts == [{"rank": r, "tensor_parallel": 2, "data_parallel": 1, "local_params": replicated + split // 2}
                       for r in (0, 1)]
    assert losses(sharded.stdout, 0) == losses(sharded.stdout, 1)  # one replica: both shards see the same loss

    whole = run_emitted(tmp_path / "tp1", make_plan(TINY, 1, 32, 8, zero=1, mbs=2))
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-3000:]
    assert tagged_records(whole.stdout, "AUTOPLAN_LAYOUT")[0]["local_params"] == replicated + split
    # Same seed, weights and tokens; only bf16 summation order differs (measured: within 3e-4).
    assert losses(sharded.stdout, 0) == pytest.approx(losses(whole.stdout, 0), abs=2e-3)
