"""DeepSpeed launch files for a plan: `ds_config.json`, a hostfile and a `deepspeed` launcher script.

A training run launches `ds_hf_train.py`, which builds the user's Hugging Face model (its config.json, or a
checkpoint's weights) and trains it on a Megatron-style tokenized dataset with checkpoints (integrations/
ds_hf_train.py); a probe run (`probe=True`) launches `ds_train.py`, a model built from the ModelSpec on random tokens
that measures the layout. Both are copied next to the config so the folder runs on its own; `train_script=` points
the launcher at a user script instead, which then receives only `--deepspeed_config`. Config keys follow deepspeed 0.19.8 (runtime/config.py, runtime/zero/config.py,
runtime/pipe/engine.py, runtime/tensor_parallel/config.py).

Tensor parallelism is AutoTP: `"tensor_parallel": {"autotp_size": tp}`, with batch sizes counted over
dp = world / tp. DeepSpeed checks train_batch_size against the data-parallel size of the `mpu` passed to
`deepspeed.initialize`, and without one against the whole world (runtime/config.py `DeepSpeedConfig.__init__`),
so a training script must pass an mpu whose data-parallel world size is world / tp; `ds_train.py` does
(`AutoTpGroups`), and a user script must too."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from autoplan import keys as K
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.results import Plan
from autoplan.integrations.engines import check_deepspeed_keys, deepspeed_unsupported

PROBE_ITERS = 10  # iterations a probe run trains before it exits
DEFAULT_TRAIN_ITERS = 1000  # a placeholder: pass `--iters N` to launch.sh to override
DEFAULT_MASTER_PORT = 29500
BUCKET_ELEMENTS = 500_000_000  # reduce/all-gather bucket, elements (DeepSpeed's default, runtime/zero/config.py)


def deepspeed_dp(plan: Plan) -> int:
    """Data-parallel degree under DeepSpeed: world / (autotp size x pipeline stages)."""
    s, world = plan.strategy, plan.cluster.num_gpus
    if world % (s.tp * s.pp):
        raise InputError(f"world size {world} must be divisible by tp*pp = {s.tp}*{s.pp}; "
                         f"change the GPU count or the parallel sizes")
    return world // (s.tp * s.pp)


def check_deepspeed_plan(plan: Plan) -> None:
    """Raise InputError when DeepSpeed cannot run the plan, or its batch sizes do not divide."""
    reason = deepspeed_unsupported(plan.strategy, plan.model)
    if reason:
        raise InputError(reason)
    dp, mbs, gbs = deepspeed_dp(plan), plan.strategy.mbs, plan.workload.global_batch_size
    # runtime/config.py _batch_assertion: train_batch_size == micro * gas * dp world size.
    if gbs % (mbs * dp):
        raise InputError(f"global_batch_size={gbs} must be divisible by mbs*dp = {mbs}*{dp}; "
                         f"use a multiple of {mbs * dp}")


def _zero_section(plan: Plan) -> Dict[str, Any]:
    s = plan.strategy
    zero: Dict[str, Any] = {K.deepspeed_leaf("zero"): s.zero}
    if s.zero == 0:
        return zero
    zero.update({K.deepspeed_leaf("overlap_grad_reduce"): s.overlap_grad_reduce, "contiguous_gradients": True,
                 "reduce_scatter": True, "reduce_bucket_size": BUCKET_ELEMENTS})
    if s.zero < 3:
        zero["allgather_bucket_size"] = BUCKET_ELEMENTS
    else:
        # ZeRO-3 parameter prefetch/persistence knobs (DeepSpeed defaults, written so they can be tuned).
        zero.update({"stage3_prefetch_bucket_size": 50_000_000, "stage3_param_persistence_threshold": 100_000,
                     "stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 1_000_000_000,
                     "stage3_gather_16bit_weights_on_model_save": True})
    return zero


def checkpoint_section(plan: Plan) -> Dict[str, Any]:
    """DeepSpeed's checkpoint settings for the method a plan ranked by goodput was priced with; {} otherwise (and
    for blocking saves, DeepSpeed's default). async: the FastPersist writer, decoupled from training
    (runtime/model_checkpointing/constants.py "writer": {"type": "fast", "decoupled": true};
    checkpoint_engine/utils.py create_checkpoint_engine picks DecoupledCheckpointEngine). local: each rank saves
    under its local rank on node-local storage (runtime/constants.py use_node_local_storage; engine.py
    `rank = self.local_rank if self.use_node_local_storage()`); DeepSpeed keeps no replicas. The interval is the
    training script's: call engine.save_checkpoint every `checkpoint_interval_steps` steps (launch.sh header)."""
    e = plan.estimate
    if plan.objective != "goodput" or e.checkpoint_method is None:
        return {}
    if e.checkpoint_method == "async":
        return {"writer": {"type": "fast", "decoupled": True}}
    if e.checkpoint_method == "local":
        return {"use_node_local_storage": True}
    return {}


def deepspeed_config(plan: Plan, *, probe: bool = False) -> Dict[str, Any]:
    """The ds_config dict for the plan (validated against the key allow-list)."""
    check_deepspeed_plan(plan)
    s, dp = plan.strategy, deepspeed_dp(plan)
    gbs = plan.workload.global_batch_size
    config: Dict[str, Any] = {
        "train_batch_size": gbs,
        K.deepspeed_leaf("mbs"): s.mbs,
        "gradient_accumulation_steps": gbs // (s.mbs * dp),
        "steps_per_print": 10,
        "gradient_clipping": 1.0,
        "bf16": _bf16_section(s),
        K.deepspeed_section("zero"): _zero_section(plan),
        "wall_clock_breakdown": False,
    }
    if s.recompute != "none":
        # Which layers are recomputed is model code (ds_train.py --recompute*); this configures the
        # deepspeed.checkpointing machinery they use.
        config["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                              "contiguous_memory_optimization": False,
                                              "synchronize_checkpoint_boundary": False, "profile": False}
    if s.pp > 1:
        pipeline: Dict[str, Any] = {K.deepspeed_leaf("pp"): s.pp, "partition": "uniform"}
        if s.recompute == "full":
            # PipelineModule checkpoints every `interval` layers: Megatron's uniform method with that group size.
            pipeline[K.deepspeed_leaf("recompute")] = s.recompute_layers or 1
        config[K.deepspeed_section("pp")] = pipeline
    if s.grad_reduce_bf16:
        # Gradients accumulated and reduced in bf16 instead of fp32 (runtime/config.py get_data_types_params).
        config[K.deepspeed_section("grad_reduce_bf16")] = {K.deepspeed_leaf("grad_reduce_bf16"): "bf16"}
    if s.tp > 1:
        # AutoTP (runtime/tensor_parallel/config.py TPTrainingConfig); batch sizes above use dp = world / tp.
        config[K.deepspeed_section("tp")] = {K.deepspeed_leaf("tp"): s.tp}
    checkpoint = checkpoint_section(plan)
    if checkpoint and not probe:
        config["checkpoint"] = checkpoint
    check_deepspeed_keys(config)
    return config


def _bf16_section(s) -> Dict[str, Any]:
    """bf16 training; with the plan's 16-bit master weights and Adam moments as it was priced with them
    (runtime/precision_config.py bf16_master_weights_and_grads, bf16_optimizer_states)."""
    section: Dict[str, Any] = {"enabled": True}
    if s.bf16_master_weights:
        section["bf16_master_weights_and_grads"] = True
    if s.adam_bf16_states:
        section["bf16_optimizer_states"] = True
    return section


def node_slots(plan: Plan) -> List[int]:
    """Ranks on each node (ClusterSpec.node_gpu_counts)."""
    return plan.cluster.node_gpu_counts


def hostfile_text(plan: Plan) -> str:
    """DeepSpeed hostfile (`host slots=N` per line) for a multi-node plan; one node launches without one."""
    slots = node_slots(plan)
    if len(slots) == 1:
        raise InputError(f"a one-node plan ({plan.cluster.num_gpus} GPUs) launches without a hostfile")
    hosts = "".join(f"node{i} slots={n}\n" for i, n in enumerate(slots))
    return f"# replace node0..node{len(slots) - 1} with your host names (launch.sh rewrites this under Slurm)\n{hosts}"


# What a DeepSpeed training run needs of a plan: ds_hf_train.py trains the Hugging Face model as one module, so no
# pipeline stages. `plan --emit deepspeed` searches with these fixed when it cannot write the winner.
TRAINING_RUN_FIXED = {"pp": 1}


def check_training_run(plan: Plan) -> None:
    """ds_hf_train.py trains a Hugging Face model as one module: no DeepSpeed pipeline stages."""
    if plan.strategy.pp != TRAINING_RUN_FIXED["pp"]:
        raise InputError(f"pp={plan.strategy.pp}: the DeepSpeed training run builds the Hugging Face model as one "
                         f"module and has no pipeline stages; plan with --fix pp=1, emit --probe (a measuring run "
                         f"on a stand-in model) or pass --train-script with your own PipelineModule script")


def _hf_train_args(plan: Plan) -> str:
    """ds_hf_train.py's arguments: the model and data come from the environment (launch.sh checks them)."""
    s = plan.strategy
    recompute = f" --recompute {s.recompute}" if s.recompute != "none" else ""
    return (f'"${{MODEL_ARGS[@]}}" --data-path "$DATA_PATH" --seq-len {plan.workload.seq_len} '
            f'--iters "$ITERS" --checkpoint-dir "$CHECKPOINT_DIR" --save-interval "$SAVE_INTERVAL"{recompute}')


# launch.sh of a training run: the model (MODEL_CONFIG for fresh weights, PRETRAINED for a checkpoint's), the data
# and the checkpoint folder, each from the environment.
DEFAULT_SAVE_INTERVAL = 500


def training_env(plan: Plan) -> str:
    """launch.sh's environment block of a training run; SAVE_INTERVAL defaults to the interval a plan ranked by
    goodput was priced with (autoplan/costmodel/goodput.py), else DEFAULT_SAVE_INTERVAL."""
    e = plan.estimate
    save = e.checkpoint_interval_steps if plan.objective == "goodput" and e.checkpoint_interval_steps \
        else DEFAULT_SAVE_INTERVAL
    return f"""# Model: MODEL_CONFIG=<HF config.json or its folder> (fresh weights) or PRETRAINED=<HF checkpoint folder or id>.
# Data: DATA_PATH=<prefix> of a Megatron-LM indexed dataset, prefix.bin + prefix.idx (tools/preprocess_data.py).
# Checkpoints: CHECKPOINT_DIR (default ./checkpoints beside this script) every SAVE_INTERVAL steps; a rerun resumes.
: "${{DATA_PATH:?set DATA_PATH to the prefix of a tokenized .bin/.idx dataset}}"
if [[ -n "${{PRETRAINED:-}}" ]]; then MODEL_ARGS=(--pretrained "$PRETRAINED")
else MODEL_ARGS=(--model-config "${{MODEL_CONFIG:?set MODEL_CONFIG (a Hugging Face config.json) or PRETRAINED}}"); fi
CHECKPOINT_DIR="${{CHECKPOINT_DIR:-$HERE/checkpoints}}"
SAVE_INTERVAL="${{SAVE_INTERVAL:-{save}}}"
ITERS="${{ITERS:-{DEFAULT_TRAIN_ITERS}}}"
"""


def _ds_train_args(plan: Plan, probe: bool) -> str:
    s = plan.strategy
    args = ["--model-json \"$HERE/model.json\"", f"--seq-len {plan.workload.seq_len}",
            f"--iters {PROBE_ITERS if probe else DEFAULT_TRAIN_ITERS}"]
    if s.recompute != "none":
        args.append(f"--recompute {s.recompute}")
    if s.recompute == "full":
        args.append(f"--recompute-method {s.recompute_method or 'uniform'} --recompute-layers {s.recompute_layers or 1}")
    return " ".join(args)


def ds_train_approximations(m: ModelSpec) -> List[str]:
    """What ds_train.py builds differently from `m` (its docstring: a model for measuring a parallel layout): the
    attention variants and RoPE details it does not apply. Everything else in ModelSpec it builds as specified."""
    return [what for what, present in (
        ("MLA built as GQA attention", m.multi_latent_attention),
        (f"full causal attention instead of the {m.sliding_window}-token sliding window", m.sliding_window),
        ("no attention sinks", m.attention_sinks),
        (f"GLU without the clamp (swiglu_limit={m.swiglu_limit})", m.swiglu_limit),
        (f"RoPE without {m.rope_scaling} scaling", m.rope_scaling != "none"),
        ("per-head q/k norms instead of norms over the whole projection", m.qk_norm_scope == "all_heads"),
        ("no gate on the attention output", m.attention_output_gate),
        ("full causal attention instead of chunked attention", m.attention_chunk_size),
        ("dense attention without DeepSeek sparse attention's indexer", m.dsa_index_heads),
        ("softmax attention instead of the Gated DeltaNet layers", m.linear_attention_layers),
        ("no shared-expert output gate", m.shared_expert_gate),
        ("no Mamba mixer beside attention", m.parallel_mamba),
        (f"none of {', '.join(m.unexpressed)}", m.unexpressed),
        ("a softmax top-k router without the model's sigmoid scores, expert bias, weight scaling or groups",
         m.is_moe and (m.moe_router_score_function != "softmax" or m.moe_router_expert_bias
                       or m.moe_router_topk_scaling_factor != 1.0 or m.moe_router_num_groups > 0)),
    ) if present]


def _hf_recompute_differs(s) -> bool:
    """Hugging Face models checkpoint every layer: Megatron's full uniform recompute of one layer per group, and
    nothing else the Strategy can say (selective, block, groups of several layers)."""
    return s.recompute != "none" and not (s.recompute == "full" and (s.recompute_method or "uniform") == "uniform"
                                          and (s.recompute_layers or 1) == 1)


def _launch_header(plan: Plan, probe: bool, train_script: Optional[str]) -> str:
    kind = "probe run" if probe else "training run"
    autotp_note = ""
    if train_script and plan.strategy.tp > 1:
        autotp_note = (f"# AutoTP tp={plan.strategy.tp}: pass deepspeed.initialize an mpu whose data-parallel size is "
                       f"world/{plan.strategy.tp}, or DeepSpeed rejects the batch sizes\n")
    if probe and not train_script:
        approximations = ds_train_approximations(plan.model)
        autotp_note += (f"# ds_train.py: a stand-in for {plan.model.name} built from model.json, on random tokens"
                        + (f"; it approximates {'; '.join(approximations)}" if approximations else "") + "\n")
    elif not train_script and _hf_recompute_differs(plan.strategy):
        s = plan.strategy
        planned = s.recompute if s.recompute == "selective" else \
            f"full {s.recompute_method or 'uniform'} {s.recompute_layers or 1}"
        autotp_note += (f"# recompute {planned} runs as gradient checkpointing of every layer (Hugging Face "
                        f"gradient_checkpointing_enable): less memory than planned, more time\n")
    e = plan.estimate
    if plan.objective == "goodput" and e.checkpoint_interval_steps and not probe:
        autotp_note += (f"# checkpoints ({e.checkpoint_method}): engine.save_checkpoint every "
                        f"{e.checkpoint_interval_steps} steps ({e.checkpoint_interval_s:,.0f} s, priced for goodput) "
                        f"into CHECKPOINT_DIR (SAVE_INTERVAL)\n")
    return (f"#!/usr/bin/env bash\n# autoplan {kind}: {plan.model.name} on {plan.cluster.num_gpus} x "
            f"{plan.cluster.gpu.id}, seq {plan.workload.seq_len}, global batch {plan.workload.global_batch_size}\n"
            f"# strategy: {plan.strategy.label()}\n{autotp_note}")


def _one_node_launch(plan: Plan) -> str:
    """One node: no hostfile, so DeepSpeed's runner starts the ranks itself (launcher/runner.py main: without a
    resource pool it runs `deepspeed.launcher.launch` locally on 127.0.0.1, never ssh; a hostfile, even one naming
    only localhost, makes it check ssh to the first host). `--hostfile /dev/null` (not a regular file, so
    runner.py fetch_hostfile reads no hosts) keeps a cluster-wide /job/hostfile, the runner's default, out."""
    return f"""# Usage: bash launch.sh [extra training-script args]   (MASTER_PORT from the environment)
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"

exec deepspeed --hostfile /dev/null --num_gpus {plan.cluster.num_gpus} --master_port "$MASTER_PORT" \\
"""


def _multi_node_launch(plan: Plan) -> str:
    """Several nodes: the hostfile lists them (slots per node); DeepSpeed's runner reaches them over ssh (pdsh)."""
    slots = node_slots(plan)
    nodes, full, last = len(slots), slots[0], slots[-1]
    return f"""# Usage: bash launch.sh [extra training-script args]
# HOSTFILE, MASTER_ADDR and MASTER_PORT come from the environment when set.
# The hostfile's nodes must reach each other with passwordless ssh (DeepSpeed's pdsh launcher).
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
HOSTFILE="${{HOSTFILE:-$HERE/hostfile}}"
if [[ -n "${{SLURM_JOB_NODELIST:-}}" ]]; then
  HOSTFILE="$(mktemp)"
  scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n {nodes} \\
    | awk 'NR < {nodes} {{print $1" slots={full}"}} NR == {nodes} {{print $1" slots={last}"}}' > "$HOSTFILE"
fi
MASTER_ADDR="${{MASTER_ADDR:-$(grep -v '^#' "$HOSTFILE" | head -n 1 | cut -d' ' -f1)}}"
MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"

exec deepspeed --hostfile "$HOSTFILE" --num_nodes {nodes} \\
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\
"""


def launch_script(plan: Plan, *, probe: bool = False, train_script: Optional[str] = None) -> str:
    """launch.sh: `deepspeed` over one node without a hostfile, or over the hostfile's nodes."""
    if train_script:
        script, script_args, env = train_script, "", ""
    elif probe:
        script, script_args, env = "$HERE/ds_train.py", " " + _ds_train_args(plan, probe), ""
    else:
        script, script_args, env = "$HERE/ds_hf_train.py", " " + _hf_train_args(plan), training_env(plan)
    body = _one_node_launch(plan) if len(node_slots(plan)) == 1 else _multi_node_launch(plan)
    head, _, launch = body.partition("\nexec deepspeed")
    return (_launch_header(plan, probe, train_script) + head + "\n" + (env and env + "\n") + "exec deepspeed" + launch
            + f'  "{script}" --deepspeed_config "$HERE/ds_config.json"{script_args} "$@"\n')


def emit_deepspeed(plan: Plan, *, probe: bool = False, train_script: Optional[str] = None) -> Dict[str, str]:
    """{filename: text} of the DeepSpeed launch files; InputError when DeepSpeed cannot run the plan."""
    config = deepspeed_config(plan, probe=probe)
    if not probe and train_script is None:
        check_training_run(plan)
    files = {"ds_config.json": json.dumps(config, indent=2) + "\n",
             "launch.sh": launch_script(plan, probe=probe, train_script=train_script)}
    if len(node_slots(plan)) > 1:
        files["hostfile"] = hostfile_text(plan)
    if train_script is None:
        # ds_train.py: the probe's model and the log-line format ds_hf_train.py prints with.
        files["ds_train.py"] = (Path(__file__).parent / "ds_train.py").read_text()
        if probe:
            files["model.json"] = plan.model.model_dump_json(indent=2) + "\n"
        else:
            files["ds_hf_train.py"] = (Path(__file__).parent / "ds_hf_train.py").read_text()
    return files
