"""The emitted DeepSpeed training run trains the user's Hugging Face model: a Llama config made here, 2 CPU ranks
(gloo) under the emitted launch.sh, a tokenized Megatron .bin/.idx dataset written here, a checkpoint saved and
resumed, and the log parser reading every step."""
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from autoplan.errors import InputError
from autoplan.integrations.deepspeed import emit_deepspeed
from autoplan.integrations.extlocks import with_own_build_folder
from autoplan.integrations.logparse import parse_log
from autoplan.modelio import from_hf_config
from conftest import deadline_s
from engine_checks.plans import GPT2_SMALL, make_plan

pytestmark = pytest.mark.slow

VOCAB, SEQ = 512, 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_llama(folder):
    """A 2-layer Llama (hidden 64, GQA 4 heads / 2 groups) as its config.json: (folder, the config dict)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def write_dataset(prefix, documents=40, seed=0):
    """Documents of random length ending in token 0 (end of document), written by megatron-core's own
    IndexedDatasetBuilder: the reference writer of the .bin/.idx format."""
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    import torch

    rng = np.random.default_rng(seed)
    builder = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    total = 0
    for _ in range(documents):
        doc = np.append(rng.integers(1, VOCAB, size=int(rng.integers(20, 120))), 0)
        builder.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
        total += len(doc)
    builder.finalize(f"{prefix}.idx")
    return total


def run_launch(run_dir, env_extra, timeout):
    # launch.sh runs `deepspeed` by name: the one installed beside this interpreter, activated or not.
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port()), **env_extra}
    with_own_build_folder(env, sys.executable)
    env.pop("SLURM_JOB_NODELIST", None)
    proc = subprocess.Popen(["bash", str(run_dir / "launch.sh")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=run_dir, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, log[-4000:]
    return log


def records(log, tag):
    return [json.loads(line.split(tag + " ", 1)[1]) for line in log.splitlines() if tag + " " in line]


def test_training_run_trains_the_users_model_saves_and_resumes(tmp_path):
    pytest.importorskip("deepspeed")
    hf = tmp_path / "model"
    config = tiny_llama(hf)
    (tmp_path / "data").mkdir()
    tokens = write_dataset(tmp_path / "data" / "corpus")
    assert tokens > 4 * 4 * SEQ  # more than the samples of four steps: no wrap-around in this run
    plan = make_plan(from_hf_config(config, "tiny-llama"), 2, SEQ, 4, zero=1, mbs=1)  # dp 2, 2 micro-batches
    run = tmp_path / "run"
    run.mkdir()
    for name, text in emit_deepspeed(plan).items():
        (run / name).write_text(text)
    launch = (run / "launch.sh").read_text()
    assert "# autoplan training run" in launch and "ds_hf_train.py" in launch and "model.json" not in launch
    env = {"MODEL_CONFIG": str(hf), "DATA_PATH": str(tmp_path / "data" / "corpus"),
           "CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SAVE_INTERVAL": "2"}
    timeout = deadline_s(60, floor_s=120)

    first = run_launch(run, {**env, "ITERS": "2"}, timeout)
    layout = records(first, "AUTOPLAN_LAYOUT")
    import transformers

    expected = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(hf))
    assert {r["local_params"] for r in layout} == {sum(p.numel() for p in expected.parameters())}
    assert records(first, "AUTOPLAN_CHECKPOINT") == [{"step": 2, "dir": env["CHECKPOINT_DIR"], "resumed": False}]
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step2"

    second = run_launch(run, {**env, "ITERS": "4"}, timeout)
    assert records(second, "AUTOPLAN_CHECKPOINT") == [
        {"step": 2, "dir": env["CHECKPOINT_DIR"], "resumed": True},
        {"step": 4, "dir": env["CHECKPOINT_DIR"], "resumed": False}]
    for log, steps in ((first, [1, 2]), (second, [3, 4])):
        parsed = parse_log(log, "ds_train")
        assert sorted((r.rank, r.iteration) for r in parsed.iterations) == [(r, s) for r in (0, 1) for s in steps]
        assert all(r.step_time_s > 0 and 0 < r.loss < 20 for r in parsed.iterations)
        assert set(parsed.peak_mem_gib_by_rank(host=True)) == {0, 1}
    assert 'AUTOPLAN_DONE {"iterations": 4, "world_size": 2}' in second


def test_resumed_steps_read_the_tokens_an_unbroken_run_reads(tmp_path):
    """Step t, micro-batch g, data-parallel rank r reads samples t*gbs + (g*dp + r)*mbs + b of seq_len + 1 tokens."""
    import importlib.util

    path = os.path.join(os.path.dirname(emit_deepspeed.__code__.co_filename), "ds_hf_train.py")
    spec = importlib.util.spec_from_file_location("ds_hf_train_under_test", path)
    ds_hf_train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ds_hf_train)

    (tmp_path / "data").mkdir()
    write_dataset(tmp_path / "data" / "c", documents=5)
    stream = ds_hf_train.read_tokens(str(tmp_path / "data" / "c"))
    samples = ds_hf_train.Samples(stream, SEQ)
    batch = samples.batch(3, 2)
    assert batch.shape == (2, SEQ + 1)
    assert batch[0].tolist() == stream[3 * SEQ:4 * SEQ + 1].tolist()
    assert batch[1].tolist() == stream[4 * SEQ:5 * SEQ + 1].tolist()
    assert samples.batch(samples.count, 1)[0].tolist() == samples.batch(0, 1)[0].tolist()  # wraps to the start
    (tmp_path / "bad.idx").write_bytes(b"NOTANIDX" + bytes(40))
    with pytest.raises(ValueError, match="not a Megatron indexed dataset"):
        ds_hf_train.read_tokens(str(tmp_path / "bad"))


def test_training_run_has_no_pipeline_stages_and_the_probe_keeps_the_stand_in():
    plan = make_plan(GPT2_SMALL, 8, 1024, 32, pp=2, zero=1, mbs=4)
    with pytest.raises(InputError, match="pp=2: the DeepSpeed training run builds the Hugging Face model as one"):
        emit_deepspeed(plan)
    probe = emit_deepspeed(plan, probe=True)
    assert "ds_train.py" in probe["launch.sh"] and "stand-in" in probe["launch.sh"] and "model.json" in probe
    assert "ds_hf_train.py" not in probe
