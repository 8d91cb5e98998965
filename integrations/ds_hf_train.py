"""Train a Hugging Face causal language model with DeepSpeed on a tokenized dataset (the DeepSpeed training run).

Self-contained next to `ds_train.py` (whose log lines, AutoTP groups and teardown it uses) so that
`autoplan emit --format deepspeed` can copy both next to the config; needs torch, deepspeed, numpy and transformers.

Usage:
    deepspeed --num_gpus 8 ds_hf_train.py --deepspeed_config ds_config.json --model-config CONFIG \\
        --data-path PREFIX --seq-len 4096 --iters 1000 --checkpoint-dir ckpt --save-interval 500
The model: `--model-config` (a Hugging Face `config.json` or a folder holding one) builds it with fresh weights
(`AutoModelForCausalLM.from_config`); `--pretrained DIR` (a checkpoint folder or hub id) loads its weights instead
(`from_pretrained`). Under ZeRO-3 the weights are partitioned while they are built (`deepspeed.zero.Init`,
transformers' `HfDeepSpeedConfig`), so no rank holds the whole model.

The data: a Megatron-LM indexed dataset, `PREFIX.bin` + `PREFIX.idx`, as Megatron-LM's tools/preprocess_data.py
writes it (megatron/core/datasets/indexed_dataset.py): the .idx starts with b"MMIDIDX\\x00\\x00", version 1 (<Q), the
token dtype code (<B: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16), the sequence count and the document
count (<Q each), then the int32 sequence lengths; the .bin holds every sequence's tokens back to back. The tokens
are read with a numpy memmap as one stream (documents end with the tokenizer's end-of-document token, as
preprocess_data.py --append-eod writes them), cut into samples of seq_len + 1 tokens: sample k is tokens
[k*seq_len, k*seq_len + seq_len + 1) (inputs and next-token labels), in order, back to the first sample after the
last whole one. Step t trains on samples t*global_batch .. (t+1)*global_batch - 1, micro-batch g of data-parallel
rank r on samples t*global_batch + (g*dp + r)*mbs + b, so a run resumed at step t reads what an unbroken run would.

Checkpoints: every --save-interval steps and after the last, `engine.save_checkpoint(DIR, tag="step<N>")` with the
step in its client state; at the start, when DIR holds DeepSpeed's `latest` file, `engine.load_checkpoint(DIR)`
restores the weights, the optimizer and the step, and training continues from the next step.

Output: the log lines of ds_train.py (AUTOPLAN_LAYOUT before the first step, one AUTOPLAN_ITER per rank per step,
AUTOPLAN_DONE at the end; autoplan.integrations.logparse reads them), with `iteration` the global step number, and
AUTOPLAN_CHECKPOINT {"step": N, "dir": DIR, "resumed": bool} from rank 0 after each save or load.

What it does not do: pipeline stages (a Hugging Face model is one module; the emitter refuses pp > 1) and
Megatron's selective recompute (recompute on is whole-layer gradient checkpointing, which keeps less memory than
planned and costs more time). The learning rate is constant (--lr)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__":
    # Run as a script from autoplan's integrations/ folder, whose deepspeed.py would shadow the deepspeed package.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

CHECKPOINT_PREFIX = "AUTOPLAN_CHECKPOINT "
INDEX_HEADER = b"MMIDIDX\x00\x00"
# megatron/core/datasets/indexed_dataset.py DType codes of integer token ids.
TOKEN_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def _ds_train():
    """ds_train.py beside this file: the log-line format, AutoTpGroups and the teardown are defined there once."""
    spec = importlib.util.spec_from_file_location("autoplan_ds_train", os.path.join(_HERE, "ds_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------- data
def read_tokens(prefix: str) -> np.ndarray:
    """Every token of PREFIX.bin as one memory-mapped array, its dtype and count from PREFIX.idx."""
    with open(prefix + ".idx", "rb") as f:
        header = f.read(9)
        if header != INDEX_HEADER:
            raise ValueError(f"{prefix}.idx is not a Megatron indexed dataset (header {header!r}, expected "
                             f"{INDEX_HEADER!r}); write it with Megatron-LM's tools/preprocess_data.py")
        version, code = struct.unpack("<Q", f.read(8))[0], struct.unpack("<B", f.read(1))[0]
        sequences, _documents = struct.unpack("<QQ", f.read(16))
        lengths = np.frombuffer(f.read(4 * sequences), dtype=np.int32)
    if version != 1 or code not in TOKEN_DTYPES:
        raise ValueError(f"{prefix}.idx: version {version}, dtype code {code}; expected version 1 and an integer "
                         f"dtype code {sorted(TOKEN_DTYPES)}")
    count = int(lengths.sum(dtype=np.int64))
    return np.memmap(prefix + ".bin", dtype=TOKEN_DTYPES[code], mode="r", shape=(count,))


class Samples:
    """Samples of seq_len + 1 consecutive tokens over the whole stream (see the module docstring)."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.count = (len(tokens) - 1) // seq_len
        if self.count < 1:
            raise ValueError(f"the dataset holds {len(tokens)} tokens, fewer than one sample of seq_len + 1 = "
                             f"{seq_len + 1}")

    def batch(self, first: int, size: int) -> torch.Tensor:
        rows = []
        for k in range(first, first + size):
            start = (k % self.count) * self.seq_len
            rows.append(np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))


# ----------------------------------------------------------------------------------------------- model
def build_model(args: argparse.Namespace, config: Dict[str, Any]):
    """The Hugging Face model: fresh weights from --model-config, or --pretrained's weights."""
    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    zero3 = int(config.get("zero_optimization", {}).get("stage", 0)) == 3
    dtype = torch.bfloat16 if config.get("bf16", {}).get("enabled") else torch.float32
    if args.pretrained:
        keep = None
        if zero3:  # from_pretrained partitions the weights as it loads them while this object lives
            from transformers.integrations import HfDeepSpeedConfig

            keep = HfDeepSpeedConfig(config)
        model = AutoModelForCausalLM.from_pretrained(args.pretrained, dtype=dtype)
        del keep
        return model
    hf_config = AutoConfig.from_pretrained(args.model_config)
    if zero3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            return AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return AutoModelForCausalLM.from_config(hf_config, dtype=dtype)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


# ----------------------------------------------------------------------------------------------- run
def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deepspeed_config", "--deepspeed-config", required=True, help="ds_config.json")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-config", help="Hugging Face config.json (or its folder): fresh weights")
    model.add_argument("--pretrained", help="Hugging Face checkpoint folder or hub id: its weights")
    p.add_argument("--data-path", required=True, help="PREFIX of PREFIX.bin / PREFIX.idx")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sample")
    p.add_argument("--iters", type=int, required=True, help="the step to train up to")
    p.add_argument("--checkpoint-dir", required=True, help="where checkpoints are saved and resumed from")
    p.add_argument("--save-interval", type=int, default=500, help="steps between checkpoints")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return p.parse_args(argv)


def _save(engine, directory: str, step: int, rank: int, emit_line) -> None:
    engine.save_checkpoint(directory, tag=f"step{step}", client_state={"step": step})
    if rank == 0:
        emit_line(CHECKPOINT_PREFIX + json.dumps({"step": step, "dir": directory, "resumed": False}))


def _resume(engine, directory: str, rank: int, emit_line) -> int:
    """The step the checkpoint in `directory` ended at (0 without one), its state loaded into the engine."""
    if not os.path.isfile(os.path.join(directory, "latest")):
        return 0
    path, client = engine.load_checkpoint(directory)
    if path is None:
        raise RuntimeError(f"{directory}/latest names a checkpoint DeepSpeed could not load")
    step = int(client["step"])
    if rank == 0:
        emit_line(CHECKPOINT_PREFIX + json.dumps({"step": step, "dir": directory, "resumed": True}))
    return step


def main(argv: Optional[List[str]] = None) -> int:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    ds = _ds_train()
    args = parse_args(argv)
    config = json.loads(open(args.deepspeed_config).read())
    if int(config.get("pipeline", {}).get("stages", 1)) > 1:
        raise ValueError("ds_hf_train.py trains a Hugging Face model as one module; pipeline.stages > 1 needs "
                         "ds_train.py (--probe) or a script of your own")
    torch.manual_seed(args.seed)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
    device = get_accelerator().current_device_name()
    samples = Samples(read_tokens(args.data_path), args.seq_len)

    model = build_model(args, config)
    if args.recompute != "none":  # whole-layer checkpointing (the module docstring says why)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tp = int(config.get("tensor_parallel", {}).get("autotp_size", 1) or 1)
    mpu = ds.AutoTpGroups(tp) if tp > 1 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    ds.emit_line(ds.LAYOUT_PREFIX + json.dumps({"rank": rank, "tensor_parallel": tp,
                                                "data_parallel": engine.dp_world_size,
                                                "local_params": ds._local_params(model)}))
    mbs, gas, gbs = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(), \
        engine.train_batch_size()
    dp, dp_rank = (mpu.dp, mpu.dp_rank) if mpu is not None else (world, rank)
    start = _resume(engine, args.checkpoint_dir, rank, ds.emit_line)
    engine.train()
    for step in range(start + 1, args.iters + 1):
        get_accelerator().synchronize()
        began = time.perf_counter()
        loss = None
        for g in range(gas):
            tokens = samples.batch((step - 1) * gbs + (g * dp + dp_rank) * mbs, mbs).to(device)
            loss = lm_loss(engine(input_ids=tokens[:, :-1]).logits, tokens[:, 1:])
            engine.backward(loss)
            engine.step()
        get_accelerator().synchronize()
        elapsed = time.perf_counter() - began
        value = float(loss.detach())
        ds.emit_line(ds.ITER_PREFIX + json.dumps({
            "rank": rank, "world_size": world, "iteration": step, "elapsed_ms": round(elapsed * 1e3, 3),
            "tokens_per_s": round(gbs * args.seq_len / elapsed, 3),
            "loss": round(value, 5) if math.isfinite(value) else None, **ds._memory()}))
        if step % args.save_interval == 0 or step == args.iters:
            _save(engine, args.checkpoint_dir, step, rank, ds.emit_line)
    ds._shutdown(engine, rank, args.iters, world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
