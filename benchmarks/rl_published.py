"""`autoplan rl` against published RL post-training runs (verl, slime): every published step and phase time, host
RAM figure and layout, with the prediction and its error; then the planner's own choice against the published
layout on each run, and the time `autoplan rl` takes for Qwen3-30B-A3B GRPO on 32 H100.

Run: python -m benchmarks.rl_published  (prints the table; committed output: benchmarks/results/rl_published_*.txt)

Sources (verl @ b178a3cd, 2026-01-29; slime @ 624b824a):
- V3: verl docs/perf/dpsk.md "Benchmark" (added at e2e4c35e, 2025-08-14): DeepSeek 671b on 96 GPUs (H20 96GB, per
  the same page), mean response length 1960, rollout 1050 s, GPU memory 66 GB, CPU memory 1500 GB, step 1700 s;
  layout from the page's table for 96 GPUs (TP 8, PP 12, EP 8, OFFLOAD_FRACTION 1, LAST_LAYER 6) and
  examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh (96 prompts x 8, max prompt 2048, max response
  1204*8 = 9632, mini batch 32 prompts, KL loss on, param/grad/optimizer offload, CPU Adam, full recompute (lines
  154-155), use_dynamic_bsz with ppo_max_token_len_per_gpu = 2048 + 9632 (lines 58-59), Megatron's flex token
  dispatcher with DeepEP (moe_enable_deepep True, moe_token_dispatcher_type flex, lines 152-153; since 2026-12-07e,
  before which the row was priced with the all-to-all dispatcher), vLLM TP 32, gpu_memory_utilization 0.6,
  enforce_eager True).
  V3's "GPU memory 66 GB", what is known of it (checked 2026-12-07e): the page does not say what it measures; the
  row came in at e2e4c35e as "0.9" and became 66 at e31a8831 ("fix a typo"). Its neighbours, CPU memory 1500 and
  mfu 0.19, are the figures verl's Megatron update_actor reports together (verl/workers/megatron_workers.py lines
  636-639 at e2e4c35e: perf/mfu/actor; perf/max_memory_allocated_gb and perf/max_memory_reserved_gb, torch's
  allocator peaks; perf/cpu_memory_used_gb, psutil's used host memory; each divided by 1024**3), which would make
  the unit GiB and the figure a torch-allocator peak rather than a device total; that is not stated, so the row
  keeps the page's GB. The run's software differs from what the rollout model prices (verl b178a3cd, vLLM 0.11,
  the engine in a process of its own): at e2e4c35e verl's default rollout mode "sync" (trainer/config/rollout/
  rollout.yaml line 8) runs vLLM inside the training worker (megatron_workers.py line 408, vLLMRollout), with
  vLLM <= 0.9.1 (setup.py line 52; the page's image: vLLM 0.8.5), whose worker sizes the KV cache as
  total x gpu_memory_utilization less torch's peak since the profile began (the training tensors then resident
  included) and less all device memory torch does not hold (every CUDA context and NCCL buffer on the GPU; vLLM
  0.8.5 vllm/v1/worker/gpu_worker.py lines 177-210; its MLA workspace is made with the model runner, before the
  profile: gpu_model_runner.py line 141, mla/common.py lines 362-380). There, what exists when the engine starts
  lies inside the 0.6 share (one CUDA context, not two), and only what training allocates afterwards and keeps
  through the rollout comes on top (the DeepEP buffer, made at the first MoE forward: Megatron-core 0.13
  transformer/moe/fused_a2a.py `get_buffer`, lines 32-65, a module global; NCCL communicators torch creates at a
  group's first collective; TransformerEngine's and cuBLAS's workspaces). The model's rollout figure (share +
  a second CUDA context + the engine's NCCL + the trainer's context and NCCL + DeepEP) is not below that sum's
  priced parts; the 1.9 GiB to the page's 66 GB (6.4 GiB if the figure is verl's GiB metric) is not accounted
  for by any term found in the engines' code or the recipe, and the test that holds the rule stays an expected
  failure (tests/unit/test_rl.py).
- OSO: verl docs/advance/one_step_off.md "Experimental Results" (first published with the recipe at 503ea75f,
  2025-07-17): Qwen2.5-Math-7B DAPO on 2 nodes x 8 H20, 12 training + 4 rollout GPUs; step / gen / wait_prev_gen /
  generate_sequences / old_log_prob / update_actor per row; max response FSDP2 20,480, Megatron 8,192 (the page's
  figures; the recipe scripts, at 503ea75f and at b178a3cd, set 8,192 for both: the page's are kept); layouts from
  verl/experimental/one_step_off_policy/shell/dapo_7b_math_{fsdp2,megatron}_{colocate,4_12}.sh (512 prompts, n 12
  (16 for the Megatron colocate script), mini batch 32 prompts, vLLM TP 2 at 0.8, colocated runs offload
  params/grads/optimizer; FSDP2: Ulysses SP 4, gradient checkpointing (colocate line 87; verl's default,
  model/hf_model.yaml line 34), use_dynamic_bsz with actor_ppo_max_token_len = (2048 + 8192) x 2 per GPU (lines
  49-50 / 55-56), fsdp_size 2; Megatron: TP 2 PP 2, ppo_micro_batch_size_per_gpu 2 without dynamic batch size
  (lines 58/63 "TODO: support dynamic_bsz for megatron", 88/94), no recompute (megatron_actor.yaml line 84 at
  503ea75f: override_transformer_config {}, so Megatron-core's default recompute_granularity None)).
- FA: verl/experimental/fully_async_policy/README.md "Asynchronous Training on 7B Model": Qwen2.5-Math-7B DAPO on
  H20, max response 28K, n 16, 512 prompts per step, mini batch 32; colocate sync on 32/64/128 GPUs vs
  fully_async_policy 16:16, 32:32, 64:64 (require_batches 4, trigger_parameter_sync_step 4, staleness 0.5, partial
  rollout); vLLM TP 4 at 0.8, FSDP2 Ulysses 4, fsdp_size 8, use_dynamic_bsz with actor_ppo_max_token_len = (2048 +
  28672) x 2 (verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_16_16.sh lines 54-61; the 32_32 and
  64_64 scripts alike). No colocate-sync script is published: it is priced with the same settings.
- FA, the page's further tables (since 2026-12-07d; `_fa_more` lists each table's lines and settings): the
  128-GPU mode, staleness and require_batches ablations on the 64:64 settings, Qwen3-30B-A3B colocate 128 vs
  fully-async 96:32 (shell/grpo_30b_a3b_base_math_megatron_96_32.sh), the use_trainer_do_validate runs (colocate
  16 vs 8:8) and the checkpoint-engine sync times; every "total time" column is a row of its own table (N x the
  predicted step; the published totals hold validation, which is not priced). Figures that repeat another row's
  (the mode table's colocate and partial-rollout rows, the staleness table's 0.5 row) are not repeated; the ratios
  in brackets beside the total times are quotients of two total-time rows and not rows themselves. The fully-async
  runs are priced with the rollouter's staleness bound and the trainer's local updates (autoplan/rl/stream.py).
- R1: slime docs/en/examples/deepseek-r1.md: 128 H100, colocated, TP 8 PP 4 CP 4 EP 32, last stage 13 layers, CPU
  Adam, SGLang 64 GPUs per engine with EP 64 and DP-attention 8 at mem fraction 0.7, 128 prompts x 8, max
  response 32,768, 4 optimizer steps per rollout; "Each node (8xH100) will occupy 1.4~1.5TB of host memory".
- GLM: slime docs/en/examples/glm4.5-355B-A32B.md (the last revision before the GLM-4.7 rename, e8e4b648^):
  64 H100, colocated, TP 8 PP 4 CP 2 EP 16, CPU Adam, SGLang 32 GPUs per engine, DP-attention 4, mem fraction
  0.7, 128 prompts x 8, max response 32,768, 4 optimizer steps per rollout; no host-RAM figure is published: the
  check is that it fits in a DGX H100's 2 TB.

What the published columns time (verl's hybrid worker, verl/workers/fsdp_workers.py `generate_sequences` at
2bb42bae, a commit that edited docs/advance/one_step_off.md (added with the recipe at 503ea75f), lines 972-983; the Megatron worker
alike): on a colocated run the trainer's "gen" timer wraps the whole call, which switches to rollout mode (actor
weights back on the GPU, weights synced into the engine, KV cache resumed), generates, and switches back, while
"generate_sequences" times the generation alone, averaged over the ranks (`reduce_timing`, an all-reduce with
ReduceOp.AVG, verl/utils/profiler/performance.py lines 198-224 at 2bb42bae; fsdp_workers.py line 750 at 503ea75f),
whereas "gen" waits for the slowest rank. So a colocated run's "gen" is compared with the predicted slowest
engine's generation + refit + switch (gen_s) and its "generate_sequences" with the engines' mean generation
(gen_seq_s; since 2026-12-07b the model draws each engine's share of the response lengths and prices the slowest
engine and the mean apart, autoplan/rl/rollout.py `simulate`; before, every engine got the same share of the tail and
the row was named rollout_s). On a split pool (one-step-off) generation is all the engine does and
"generate_sequences" is gen_seq_s as well (the recipe's rollout worker calls the same generate_sequences,
recipe/one_step_off_policy/fsdp_workers.py line 217 at 503ea75f); V3's "rollout time" is compared with the slowest
engine (rollout_s, the phase its step waits for); "wait_prev_gen" is the trainer's wait for the previous
step's generation (the page: step = wait_prev_gen + old_log_prob + update_actor), compared with wait_s = the
predicted rollout less the trainer's phases, or 0. A fully-async "step" is one parameter version (require_batches 4
x mini batch 32 prompts x trigger_parameter_sync_step 4 = 512 prompts): the trainer times each of its 4 local
updates (verl/experimental/fully_async_policy/fully_async_trainer.py lines 320-323: "step" around "gen", the wait
for require_batches x mini batch samples from the queue, and the update) and sums them over the version
(detach_utils.py MetricsAggregator: "timing_s/" metrics aggregate as time_sum, lines 256-257 and 294-295); its
"gen" is compared with wait_s as well.

What waits for the slowest (since 2026-12-07b; order statistics of the assumed length distribution, no constant
fitted): the slowest rollout engine is the one holding the batch's expected longest response, the engines' mean
one the expected longest of its own share (autoplan/rl/rollout.py `simulate`); every optimizer step waits for the
data-parallel group with the most tokens in its share of the mini-batch (autoplan/rl/train.py `rank_imbalance`,
verl dp_actor.py at b25bb7d4 lines 388 and 503-504). The output's "slowest" section prints both per run, and how
the colocated FA phases scale from 32 to 128 GPUs.

Assumed inputs (not published; fixed here before any comparison and used for every row of a run):
- mean prompt length 256 tokens for the DAPO-Math-17k prompts of every run;
- mean response length 2048 tokens for the Qwen2.5-Math-7B runs (OSO, FA) and 4096 for R1 and GLM (their pages
  give no mean; the FA page says the response length changes with staleness and require_batches, i.e. differs
  between its runs); V3's 1960 is published;
- FSDP2 training priced as Megatron with the sequence split 4 ways (cp 4, the Ulysses SP degree) and parameters,
  gradients and optimizer sharded over all its GPUs (zero 3), as benchmarks/published.py models Megatron-FSDP (the
  recipes' fsdp_size 2 / 8, hybrid sharding, is not modelled);
- H20 nodes hold 2 TB of host RAM (as a DGX H100); H100 nodes 2 TB (DGX H100 datasheet);
- the lengths of one prompt's samples are independent (the planner's rollout model); the effect of a correlation
  between them, where verl gives an engine whole prompts, is printed beside the slowest-engine section at rho 0,
  0.5 and 0.9 (`_correlation`), not used in any row.
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from autoplan.clusterio import load_cluster
from autoplan.costmodel.hardware import hardware_of
from autoplan.rl import rollout as R
from autoplan.modelio import load_model
from autoplan.rl.search import Fixed, search
from autoplan.rl.spec import Placement, RLJob

PROMPT_LEN = 256
QWEN_MATH_RESPONSE = 2048
LONG_RESPONSE = 4096
HOST_GIB = 2048.0


@dataclass
class Run:
    name: str
    model: str
    sets: Tuple[str, ...]
    gpu: str
    gpus: int
    job: RLJob
    fixed: Fixed
    published: Dict[str, float]  # quantity -> published value (s, GiB, or a ratio)
    totals: Dict[int, float] = field(default_factory=dict)  # steps -> published wall time of that many steps, s
    unpriced: Dict[str, float] = field(default_factory=dict)  # published figures the model has no term for


def _job(prompts, samples, resp, longest, mini, ref=True, mode="on-policy", packed=None, staleness=None,
         require=None) -> RLJob:
    return RLJob(algo="grpo", prompts=prompts, samples=samples, prompt_len=PROMPT_LEN, response_len=resp,
                 max_response_len=longest, mode=mode, use_ref=ref, mini_batches=mini, micro_batch_tokens=packed,
                 host_mem_gib=HOST_GIB, staleness=staleness, require_batches=require)


def _fixed(train, offload, rollout, placement, engine="vllm") -> Fixed:
    return Fixed(train=train, offload=offload, rollout=rollout, placement=placement, engine=engine)


def _col(n):
    return Placement(kind="colocated", gpus=n, train_gpus=n)


def _split(n, t):
    return Placement(kind="split", gpus=n, train_gpus=t)


FSDP = {"tp": 1, "pp": 1, "cp": 4, "zero": 3, "ep": 1}
# verl's Megatron recipes for the 7B runs: no recompute (override_transformer_config {} in the actor config,
# megatron_actor.yaml line 84 at 503ea75f, so Megatron-core's TransformerConfig default recompute_granularity None),
# ppo_micro_batch_size_per_gpu 2 and no dynamic batch size (dapo_7b_math_megatron_{colocate,4_12}.sh lines 58/63,
# "TODO: support dynamic_bsz for megatron", and 88/94)
MEG7B = {"tp": 2, "pp": 2, "ep": 1, "recompute": "none", "mbs": 2}
# verl's FSDP2 recipes pack by length: use_dynamic_bsz with actor_ppo_max_token_len = (max prompt + max response) x 2
# per GPU (dapo_7b_math_fsdp2_{colocate,4_12}.sh lines 49-50 / 55-56: (2048 + 8192) x 2; fully_async_policy
# dapo_7b_math_fsdp2_16_16.sh lines 54-55: (2048 + 28672) x 2); V3: (2048 + 9632) x 1 (run_deepseek671b_math_
# megatron_96gb.sh lines 58-59)
OSO_TOKENS = (2048 + 8192) * 2
FA_TOKENS = (2048 + 28672) * 2
V3_TOKENS = 2048 + 9632
MATH = ("qwen2.5-math-7b", ("max_position_embeddings=32768",))


def runs() -> List[Run]:
    gib = 1e9 / 2**30  # published GB -> GiB
    out = [Run("V3 verl GRPO 96xH20", "deepseek-v3", ("mtp_num_layers=0",), "h20", 96,
               _job(96, 8, 1960, 9632, 3, packed=V3_TOKENS),
               _fixed({"tp": 8, "pp": 12, "ep": 8, "moe_flex_dispatcher": True}, "all",
                      {"tp": 32, "dp": 1, "ep": 1, "engines": 3, "gpu_memory_utilization": 0.6,
                       "cuda_graphs": False}, _col(96)),
               {"step_s": 1700, "rollout_s": 1050, "rollout_share": 1050 / 1700, "gpu_mem_gib": 66 * gib,
                "host_gib_per_node": 1500 * gib, "mfu": 0.19})]
    for label, longest, train, n_col, packed in (("FSDP2", 20480, FSDP, 12, OSO_TOKENS),
                                                 ("Megatron", 8192, MEG7B, 16, None)):
        pub = {"FSDP2": ((749, 321, 247, 88, 286), (520, 45, 458, 108, 337)),
               "Megatron": ((699, 207, 162, 119, 344), (566, 59, 501, 120, 347))}[label]
        # the page's "total time" column (one_step_off.md lines 63-66): the number of steps it covers is not
        # published, so it cannot be priced
        total = {"FSDP2": ("19h 18m", "15h 34m"), "Megatron": ("18h 21m", "13h 6m")}[label]
        out.append(Run(f"OSO colocate {label} 16xH20", *MATH, "h20", 16,
                       _job(512, n_col, QWEN_MATH_RESPONSE, longest, 16, ref=False, packed=packed),
                       _fixed(train, "swap", {"tp": 2, "dp": 1, "ep": 1, "engines": 8,
                                              "gpu_memory_utilization": 0.8}, _col(16)),
                       dict(zip(("step_s", "gen_s", "gen_seq_s", "old_log_prob_s", "train_s"), pub[0])),
                       unpriced={"total_time_h": _dur(total[0]) / 3600}))
        out.append(Run(f"OSO one-step-off {label} 12+4xH20", *MATH, "h20", 16,
                       _job(512, 12, QWEN_MATH_RESPONSE, longest, 16, ref=False, mode="one-step-off",
                            packed=packed),
                       _fixed(train, "none", {"tp": 2, "dp": 1, "ep": 1, "engines": 2,
                                              "gpu_memory_utilization": 0.8}, _split(16, 12)),
                       dict(zip(("step_s", "wait_s", "gen_seq_s", "old_log_prob_s", "train_s"), pub[1])),
                       unpriced={"total_time_h": _dur(total[1]) / 3600}))
    fa = {32: ((790.10, 357.41, 107.71, 269.80), (294.77, 21.26, 313.81)),
          64: ((365.28, 150.72, 70.26, 133.41), (189.26, 28.46, 156.98)),
          128: ((356.30, 177.85, 53.92, 113.81), (150.63, 33.14, 113.16))}
    for n, (sync, asy) in fa.items():
        out.append(Run(f"FA colocate sync {n}xH20", *MATH, "h20", n, _job(512, 16, QWEN_MATH_RESPONSE, 28672, 16,
                                                                          ref=False, packed=FA_TOKENS),
                       _fixed(FSDP, "swap", {"tp": 4, "dp": 1, "ep": 1, "engines": n // 4,
                                             "gpu_memory_utilization": 0.8}, _col(n)),
                       dict(zip(("step_s", "gen_s", "old_log_prob_s", "train_s"), sync)),
                       totals=_totals(FA_TOTALS[f"colocate {n}"])))
        out.append(Run(f"FA fully-async {n // 2}:{n // 2}xH20", *MATH, "h20", n,
                       _fa_async(0.5, 4), _fa_split(n),
                       {"step_s": asy[0], "wait_s": asy[1], "train_s": asy[2], "speedup_vs_sync": sync[0] / asy[0]},
                       totals=_totals(FA_TOTALS[f"async {n}"])))
    out.extend(_fa_more())
    out.append(Run("R1 slime 128xH100", "deepseek-v3", ("mtp_num_layers=0",), "h100", 128,
                   _job(128, 8, LONG_RESPONSE, 32768, 4),
                   _fixed({"tp": 8, "pp": 4, "cp": 4, "ep": 32, "last_stage_layers": 13}, "all",
                          {"tp": 8, "dp": 8, "ep": 64, "engines": 2, "gpu_memory_utilization": 0.7}, _col(128),
                          engine="sglang"),
                   {"host_gib_per_node": 1.5e12 / 2**30, "fits": 1.0}))
    out.append(Run("GLM-4.5 slime 64xH100", "glm-4.5", (), "h100", 64, _job(128, 8, LONG_RESPONSE, 32768, 4),
                   _fixed({"tp": 8, "pp": 4, "cp": 2, "ep": 16}, "all",
                          {"tp": 8, "dp": 4, "ep": 32, "engines": 2, "gpu_memory_utilization": 0.7}, _col(64),
                          engine="sglang"),
                   {"fits": 1.0, "host_fits_2TB": 1.0}))
    return out


# The FA README's "total time" columns (wall time of the first 100 / 200 / 300 / 400 steps; the runs validate every
# test_freq = 20 steps, which the model does not price), by table row.
FA_TOTALS = {
    "colocate 32": "13h 44m | 1d 3h 43m | 2d 9h 22m | 3d 17h 5m",
    "async 32": "7h 58m | 16h 21m | 1d 0h 53m | 1d 9h 26m",
    "colocate 64": "10h 22m | 20h 45m | 1d 7h 6m | 1d 17h 32m",
    "async 64": "4h 57m | 10h 14m | 16h 58m | 21h 40m",
    "colocate 128": "8h 36m | 17h 56m | 1d 5h 6m | 1d 16h 48m",
    "async 128": "3h 13m | 6h 46m | 10h 53m | 17h 22m",
    "stale 0": "4h 25m | 9h 41m | 15h 2m | 1d 1h 53m",
    "stale 0.1": "3h 53m | 8h 37m | 14h 25m | 19h 59m",
    "stale 0.3": "3h 18m | 6h 49m | 11h 40m | 17h 20m",
    "require 1": "3h 31m | 8h 29m | 17h 36m",
    "require 2": "3h 35m | 7h 38m | 13h 57m",
    "require 4": "3h 13m | 6h 46m | 10h 53m",
    "30B colocate": "13h 36m | 1d 3h 48m | 1d 19h 4m | 2d 11h 39m",
    "30B async": "6h 45m | 14h 48m | 1d 0h 9m | 1d 10h 41m",
}


def _dur(text: str) -> float:
    """'1d 3h 43m' -> seconds."""
    unit = {"d": 86400.0, "h": 3600.0, "m": 60.0}
    return sum(float(part[:-1]) * unit[part[-1]] for part in text.split())


def _totals(row: str, every: int = 100) -> Dict[int, float]:
    return {every * (i + 1): _dur(cell) for i, cell in enumerate(row.split("|"))}


def _fa_async(staleness: float, require: int, longest: int = 28672, packed: int = FA_TOKENS) -> RLJob:
    """The FA recipe's fully-async job: 512 prompts per parameter version (trigger_parameter_sync_step x
    require_batches x ppo_mini_batch_size 32), n 16, the trainer takes the engine's log-probs."""
    return _job(512, 16, QWEN_MATH_RESPONSE, longest, 16, ref=False, mode="async", packed=packed,
                staleness=staleness, require=require)


def _fa_split(n: int, train=None, tp: int = 4) -> Fixed:
    """dapo_7b_math_fsdp2_{16_16,32_32,64_64}.sh: half the GPUs train (FSDP2, Ulysses 4), half generate (vLLM TP 4
    at 0.8), no offload (actor_offload=False)."""
    return _fixed(train or FSDP, "none", {"tp": tp, "dp": 1, "ep": 1, "engines": n // 2 // tp,
                                          "gpu_memory_utilization": 0.8}, _split(n, n // 2))


def _fa_more() -> List[Run]:
    """The FA README's further tables (verl/experimental/fully_async_policy/README.md at b178a3cd):
    - "128-card 7B Asynchronous Mode Experiment" (lines 387-398): colocate sync and "async stream pipeline with
      partial rollout" repeat the first table's 128-GPU rows (the same figures: one run each, already rows); the
      "stale samples" row has no figures; "stream off policy pipeline" (trigger 4, require_batches 4, staleness 0)
      is the staleness table's 0 row (the same figures, lines 396 and 413): one run;
    - "128-card Stale Ablation" (lines 402-416, partial rollout, on the 64:64 run's settings): staleness 0, 0.1,
      0.3 (0.5 is the first table's 64:64 row);
    - "128-card 7B require_batches Ablation" (lines 420-430): require_batches 1, 2, 4 (staleness 0.5, partial
      rollout, the 64:64 settings; its require_batches 4 row shares the 64:64 row's total times but not its step
      figures, so it is a row of its own). Not published: trigger_parameter_sync_step; assumed 512 / (32 x
      require_batches) = 16 / 8 / 4, a 512-prompt parameter version as in every other table of the page (the 30B
      section's "trigger_parameter_sync_step: 512/128 = 4", line 463);
    - "30B Model Mode Experiment" (lines 434-470): Qwen3-30B-A3B-Base GRPO on H20, max response 8K, n 16, mini
      batch 128, colocate sync on 128 GPUs vs fully-async 96 rollout : 32 train (staleness 0.5, trigger 4,
      partial rollout); settings from shell/grpo_30b_a3b_base_math_megatron_96_32.sh (lines 32-33, 47-60, 64,
      104-111, 151-153, 176): Megatron TP 2 PP 1 CP 2 EP 8, param/grad/optimizer offload, KL loss (a reference
      pass), use_dynamic_bsz with (2048 + 8192) tokens per GPU, require_batches 1, vLLM TP 4 at 0.7, enforce_eager
      True; recompute none (verl/trainer/config/engine/megatron.yaml line 58: recompute_granularity null); no
      colocate script: the colocated run is priced with the same settings, offloaded as the FA colocate runs;
    - "use_trainer_do_validate Experiment" (lines 486-511): 7B, max response 10K, n 16, mini 32, staleness 0.5,
      require_batches 4, trigger 4, partial rollout, colocate sync 16 GPUs vs fully-async 8:8; vLLM TP 1, Ulysses 1
      from shell/dapo_7b_math_fsdp2_8_8.sh (lines 59-60; the script's max response 8K and staleness 0.1 differ
      from the page's, the page's are kept); its colocate row publishes old_log_prob 0 and a 53 s gen, figures of a
      streamed run rather than of a colocated one: priced as labelled. Validation time is not priced.
    The mean response length is not published for any of them: 2048, the assumption of every DAPO-Math-17k run
    here (the page says it changes with staleness and require_batches)."""
    out = [Run("FA stream off-policy s0 64:64xH20", *MATH, "h20", 128, _fa_async(0.0, 4), _fa_split(128),
               {"step_s": 231.34, "wait_s": 128.47, "train_s": 98.77}, totals=_totals(FA_TOTALS["stale 0"]))]
    for st, pub in ((0.1, (171.30, 58.17, 109.12)), (0.3, (146.11, 38.88, 103.22))):
        out.append(Run(f"FA staleness {st} 64:64xH20", *MATH, "h20", 128, _fa_async(st, 4), _fa_split(128),
                       dict(zip(("step_s", "wait_s", "train_s"), pub)), totals=_totals(FA_TOTALS[f"stale {st}"])))
    for rb, pub in ((1, (203.47, 30.88, 181.08)), (2, (158.72, 26.32, 128.08)), (4, (124.64, 25.62, 95.06))):
        out.append(Run(f"FA require_batches {rb} 64:64xH20", *MATH, "h20", 128, _fa_async(0.5, rb), _fa_split(128),
                       dict(zip(("step_s", "wait_s", "train_s"), pub)), totals=_totals(FA_TOTALS[f"require {rb}"])))
    moe = {"tp": 2, "pp": 1, "cp": 2, "ep": 8, "recompute": "none"}
    roll30 = {"tp": 4, "dp": 1, "ep": 1, "gpu_memory_utilization": 0.7, "cuda_graphs": False}
    tokens30 = 2048 + 8192
    out.append(Run("FA 30B colocate sync 128xH20", "qwen3-30b-a3b", (), "h20", 128,
                   _job(512, 16, QWEN_MATH_RESPONSE, 8192, 4, packed=tokens30),
                   _fixed(moe, "swap", {**roll30, "engines": 32}, _col(128)),
                   {"step_s": 497.89, "gen_s": 348.05, "old_log_prob_s": 28.73, "ref_s": 20.86, "train_s": 86.27},
                   totals=_totals(FA_TOTALS["30B colocate"])))
    out.append(Run("FA 30B fully-async 96:32xH20", "qwen3-30b-a3b", (), "h20", 128,
                   _job(512, 16, QWEN_MATH_RESPONSE, 8192, 4, mode="async", packed=tokens30, staleness=0.5,
                        require=1),
                   _fixed(moe, "all", {**roll30, "engines": 24}, _split(128, 32)),
                   {"step_s": 282.75, "wait_s": 22.06, "ref_s": 50.05, "train_s": 206.63,
                    "speedup_vs_sync": 497.89 / 282.75},
                   totals=_totals(FA_TOTALS["30B async"])))
    sp1 = {"tp": 1, "pp": 1, "cp": 1, "zero": 3, "ep": 1}
    tokens10k = (2048 + 10240) * 2
    out.append(Run("FA validate colocate sync 16xH20", *MATH, "h20", 16,
                   _job(512, 16, QWEN_MATH_RESPONSE, 10240, 16, ref=False, packed=tokens10k),
                   _fixed(sp1, "swap", {"tp": 1, "dp": 1, "ep": 1, "engines": 16, "gpu_memory_utilization": 0.8},
                          _col(16)),
                   {"step_s": 484.623, "gen_s": 52.939, "old_log_prob_s": 0.0, "train_s": 430.263},
                   totals={50: _dur("7h 9m")}, unpriced={"validate_s": 205.080}))
    out.append(Run("FA validate fully-async 8:8xH20", *MATH, "h20", 16,
                   _fa_async(0.5, 4, longest=10240, packed=tokens10k), _fa_split(16, sp1, tp=1),
                   {"step_s": 489.953, "wait_s": 52.622, "train_s": 435.874},
                   totals={50: _dur("7h 2m")}, unpriced={"validate_s": 95.699}))
    # "checkpoint-engine Ablation Experiment" (lines 474-483): one parameter sync, H20, Megatron training, trainer
    # ranks = rollout ranks, without and with checkpoint-engine. The model prices the sync without it (autoplan/rl/
    # refit.py, broadcast from the training ranks); checkpoint-engine is not modelled, so those rows print the same
    # prediction. Not published: the layouts (the 30B row takes the 30B script's, the others the planner's fastest
    # on the split pool) and the job (no bearing on the sync; the DAPO job of the runs above).
    for label, name, ranks, pub, train, roll in (
            ("7B 4:4", "qwen2.5-math-7b", 4, (0.12, 0.02), {}, {}),
            ("30B 16:16", "qwen3-30b-a3b", 16, (15.76, 4.38), moe, {**roll30, "engines": 4}),
            ("235B 64:64", "qwen3-235b-a22b", 64, (58.57, 23.70), {}, {})):
        sets = MATH[1] if name == MATH[0] else ()
        job = _job(512, 16, QWEN_MATH_RESPONSE, 8192, 4, mode="async", packed=2048 + 8192, staleness=0.5,
                   require=1)
        fixed = Fixed(train=train, rollout=roll, placement=_split(2 * ranks, ranks), engine="vllm")
        out.append(Run(f"FA sync {label} ckpt-engine off", name, sets, "h20", 2 * ranks, job, fixed,
                       {"sync_s": pub[0]}))
        out.append(Run(f"FA sync {label} ckpt-engine on", name, sets, "h20", 2 * ranks, job, fixed,
                       {"sync_s": pub[1]}))
    # verl docs/perf/dpsk.md (at b178a3cd) "Qwen3-30B-A3B MOE", lines 66-75: the actor update's MFU on 8 / 16 / 32
    # H20 with examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh (lines 18-19, 26-30, 43-58, 154-167):
    # colocated DAPO, 512 prompts x 16, max response 8K, mini batch 128, no KL loss, use_dynamic_bsz with (2048 +
    # 8192) tokens per GPU, param/grad/optimizer offload (OFFLOAD_FRACTION 1), Megatron TP 1 PP 1 EP 8, vLLM TP 4
    # at 0.7, enforce_eager True; no step or phase time is published
    for n, mfu in ((8, 0.40), (16, 0.37), (32, 0.31)):
        out.append(Run(f"Qwen3-30B MFU {n}xH20", "qwen3-30b-a3b", (), "h20", n,
                       _job(512, 16, QWEN_MATH_RESPONSE, 8192, 4, ref=False, packed=2048 + 8192),
                       _fixed({"tp": 1, "pp": 1, "ep": 8, "recompute": "none"}, "all",
                              {**roll30, "engines": n // 4}, _col(n)), {"mfu": mfu}))
    return out


def predicted(plan, run: Run) -> Dict[str, float]:
    e = plan.to_dict(run.job)["estimate"]
    ph = e["phase_times_s"]
    out = {"step_s": e["step_time_s"], "rollout_s": ph["rollout"], "gen_seq_s": e["rollout_engine_mean_s"],
           "gen_s": ph["rollout"] + ph["refit"] + ph["switch"], "wait_s": plan.details["trainer_wait_s"],
           "ref_s": ph["ref"], "sync_s": ph["refit"],
           "old_log_prob_s": ph["old_log_prob"],
           "train_s": ph["train"], "rollout_share": ph["rollout"] / e["step_time_s"],
           "gpu_mem_gib": e["peak_mem_gib"], "host_gib_per_node": e["host_mem_gib"], "fits": float(e["fits"]),
           "host_fits_2TB": float(e["host_mem_gib"] <= HOST_GIB)}
    if "mfu" in run.published:
        out["mfu"] = _mfu(run, ph["train"])
    return out


def _mfu(run: Run, train_s: float) -> float:
    """The actor update's MFU as verl reports it (verl/workers/megatron_workers.py line 636 at e2e4c35e: the
    update's model FLOPs over its time, the GPU's bf16 peak and the world size; H20 148 TFLOP/s in
    verl/utils/flops_counter.py line 36 at b178a3cd, the profile's figure), with the cost model's FLOPs per token
    (costmodel/flops.model_flops_per_token: fwd + bwd, causal attention; verl's counter also counts the embedding
    as a GEMM, a difference of under 1% here) at the job's mean sequence length."""
    from autoplan.costmodel.flops import model_flops_per_token

    m, hw = load_model(run.model, run.sets), hardware_of(load_cluster(run.gpu, run.gpus))
    job = run.job
    work = model_flops_per_token(m, job.mean_seq_len) * job.sequences * job.mean_seq_len
    return work / (train_s * run.fixed.placement.train_gpus * hw.peak_flops_bf16)


def naive_bar():
    """The naive bar of benchmarks/naive.py (one effective TFLOP/s per GPU x precision x architecture, else a
    fraction of peak), fitted on every published training row of benchmarks/published.py; no RL row is used."""
    from benchmarks.naive import NaiveBar
    from benchmarks.published import load_runs

    return NaiveBar.fit(load_runs()[0])


def naive(bar, run: Run, m, c) -> Dict[str, float]:
    """What the naive bar says of a run: every phase is its model FLOPs (Megatron's formula,
    costmodel/flops.model_flops_per_token; a forward pass one third of it) over the phase's GPUs at the bar's
    effective bf16 TFLOP/s for the GPU and architecture, generation priced like a forward pass; the phases
    combine as the search combines them. It has no memory, host-RAM or fit figures."""
    from types import SimpleNamespace

    from autoplan.costmodel.flops import model_flops_per_token

    like = SimpleNamespace(gpu=run.gpu, arch="moe" if m.is_moe else "dense", precision="bf16", strategy=None,
                           cluster=c)
    rate = bar.tflops(like) * 1e12
    pl, job = run.fixed.placement, run.job
    work = model_flops_per_token(m, job.mean_seq_len) * job.sequences * job.mean_seq_len
    train = work / (pl.train_gpus * rate)
    forward = train / 3.0
    rollout = work / 3.0 / (pl.rollout_gpus * rate)
    ref = forward if job.use_ref else 0.0
    old_lp = 0.0 if job.mode == "async" else forward
    trainer = ref + old_lp + train
    step = rollout + trainer if job.mode == "on-policy" else max(rollout, trainer)
    return {"step_s": step, "rollout_s": rollout, "gen_s": rollout, "gen_seq_s": rollout, "old_log_prob_s": old_lp,
            "train_s": train, "ref_s": ref, "mfu": rate / hardware_of(c).peak_flops_bf16,
            "rollout_share": rollout / step, "wait_s": max(0.0, rollout - trainer)}


def main() -> int:
    rows, choice_rows, total_rows, unpriced_rows = [], [], [], []
    sync_steps: Dict[Tuple[str, int], float] = {}
    naive_sync: Dict[Tuple[str, int], float] = {}
    bar = naive_bar()
    for run in runs():
        m = load_model(run.model, run.sets)
        c = load_cluster(run.gpu, run.gpus)
        (plan,), _ = search(m, c, run.job, run.fixed, top_k=1)
        got = predicted(plan, run)
        bare = naive(bar, run, m, c)
        pair = (run.model, run.gpus)  # a fully-async run's speedup is over the colocated run of its model and GPUs
        if run.name.startswith("FA") and "colocate sync" in run.name:
            sync_steps[pair] = got["step_s"]
            naive_sync[pair] = bare["step_s"]
        if "speedup_vs_sync" in run.published:
            got["speedup_vs_sync"] = sync_steps[pair] / got["step_s"]
            bare["speedup_vs_sync"] = naive_sync[pair] / bare["step_s"]
        for key, pub in run.published.items():
            rows.append((run.name, key, pub, got[key], bare.get(key)))
        for steps, pub in run.totals.items():
            total_rows.append((run.name, f"total_{steps}_steps_h", pub / 3600, steps * got["step_s"] / 3600,
                               steps * bare["step_s"] / 3600))
        for key, pub in run.unpriced.items():
            unpriced_rows.append((run.name, key, pub))
        free = Fixed(engine=run.fixed.engine)
        best, _ = search(m, c, run.job, free, top_k=1)
        b = best[0]
        choice_rows.append((run.name, plan.step_time_s, plan.fits, b.step_time_s, b.fits,
                            f"{b.placement.kind}:{b.placement.train_gpus} tp{b.strategy.tp} pp{b.strategy.pp} "
                            f"cp{b.strategy.cp} ep{b.strategy.ep} {b.offload} | {b.rollout.engine} "
                            f"tp{b.rollout.tp} dp{b.rollout.dp} ep{b.rollout.ep} x{b.rollout.engines} "
                            f"{b.rollout.gpu_memory_utilization}"))
    print(f"autoplan rl vs published RL runs ({datetime.date.today()}); error = predicted / published - 1")
    print("naive: the naive bar (benchmarks/naive.py, fitted on the published training rows; see `naive`)")
    print(f"{'run':36} {'quantity':18} {'published':>10} {'predicted':>10} {'error':>8} {'naive':>10} {'error':>8}")
    within, naive_within, naive_rows = _print_rows(rows)
    print(f"rows within 20%: {within} of {len(rows)}; naive bar: {naive_within} of the {naive_rows} rows it prices "
          f"(a published 0 has no relative error: n/a, not within)")
    print()
    print("published figures not priced (printed, not counted above): the validation time of the "
          "use_trainer_do_validate runs (validation is not part of the RL step model) and the one-step-off page's "
          "total times (the number of steps they cover is not published)")
    for name, key, pub in unpriced_rows:
        print(f"{name:36} {key:18} {pub:10.2f} {'-':>10} {'n/a':>8} {'-':>10} {'-':>8}")
    print()
    print("total wall time of the first N steps (the FA README's 'total time' columns), predicted N x step time; the "
          "published totals include validation every test_freq steps, which is not priced (hours)")
    t_within, t_naive, t_rows = _print_rows(total_rows)
    print(f"total-time rows within 20%: {t_within} of {len(total_rows)}; naive bar: {t_naive} of {t_rows}")
    print()
    print("planner's choice vs the published layout (predicted step time, s)")
    print(f"{'run':36} {'published layout':>16} {'fits':>5} {'planner':>9} {'fits':>5}  planner's layout")
    for name, pub_s, pub_fit, best_s, best_fit, label in choice_rows:
        print(f"{name:36} {pub_s:16.1f} {str(pub_fit):>5} {best_s:9.1f} {str(best_fit):>5}  {label}")
    print()
    _decode()
    print()
    _sensitivity()
    print()
    _mean_bound()
    print()
    _implied_mean()
    print()
    _slowest()
    print()
    _timing()
    return 0


def _print_rows(rows) -> Tuple[int, int, int]:
    """Print (run, quantity, published, predicted, naive) rows; return (within 20%, naive within, naive rows)."""
    within, naive_within, naive_rows = 0, 0, 0
    for name, key, pub, got, bare in rows:
        err = got / pub - 1.0 if pub else None
        within += err is not None and abs(err) <= 0.20
        cells = "         -        -"
        if bare is not None:
            naive_rows += 1
            bare_err = bare / pub - 1.0 if pub else None
            naive_within += bare_err is not None and abs(bare_err) <= 0.20
            cells = f"{bare:10.2f} " + (f"{bare_err:+8.1%}" if bare_err is not None else f"{'n/a':>8}")
        err_cell = f"{err:+8.1%}" if err is not None else f"{'n/a':>8}"
        print(f"{name:36} {key:18} {pub:10.2f} {got:10.2f} {err_cell} {cells}")
    return within, naive_within, naive_rows


def _decode() -> None:
    """vLLM's published decode latencies (autoplan.rl.rollout.DECODE_FIGURES; the per-step overhead is their median
    residual, so these rows are the fit's own data)."""
    from autoplan.rl.spec import RolloutLayout

    print("decode: vLLM performance benchmark latency tests (32 in, 128 out, batch 8, H200), ms")
    hw = hardware_of(load_cluster("h200", 8))
    for name, tp, ms in R.DECODE_FIGURES:
        m, lay = load_model(name, ()), RolloutLayout(tp=tp, engines=1)
        sm = R.step_model(m, lay, hw, 8)
        got = (sum(sm.time(8, 8 * (32 + i)) for i in range(128)) + R.prefill_seconds(m, lay, hw, 8 * 32)) * 1e3
        print(f"  {name:14} tp{tp}  published {ms:8.1f}  predicted {got:8.1f}  {got / ms - 1:+7.1%}")


def _sensitivity() -> None:
    """The Qwen2.5-Math-7B runs publish no mean response length; their predicted step and phase times at other
    assumed means show how much of each error that assumption can explain (the table above keeps 2048)."""
    print("sensitivity of the Qwen2.5-Math-7B rows to the assumed mean response length (predicted step / rollout / "
          "train, s)")
    means = (512, 1024, 2048)
    print(f"{'run':36} " + " ".join(f"{f'mean {r}':>22}" for r in means))
    for run in runs():
        if run.model != MATH[0] or "sync_s" in run.published:  # the sync-time rows have no phases to compare
            continue
        m, c = load_model(run.model, run.sets), load_cluster(run.gpu, run.gpus)
        cells = []
        for mean in means:
            job = run.job.model_copy(update={"response_len": mean})
            (plan,), _ = search(m, c, job, run.fixed, top_k=1)
            cells.append(f"{plan.step_time_s:7.0f}/{plan.phases['rollout']:6.0f}/{plan.phases['train']:6.0f}")
        print(f"{run.name:36} " + " ".join(f"{x:>22}" for x in cells))


def _mean_bound() -> None:
    """The largest mean response length each published update_actor time allows: the update's model FLOPs
    (6 x parameters per token, Narayanan et al. 2021; attention and recompute left out, so it is a lower bound on
    the work) at 100% of the GPU's dense bf16 peak on the training GPUs. An assumed mean above it cannot reproduce
    the published time with any efficiency."""
    from autoplan.costmodel.params import count_parameters

    print("largest mean response length each published update_actor time allows (6 x params x tokens at 100% of "
          "bf16 peak on the training GPUs)")
    for run in runs():
        if "train_s" not in run.published:
            continue
        m, hw = load_model(run.model, run.sets), hardware_of(load_cluster(run.gpu, run.gpus))
        gpus = run.fixed.placement.train_gpus
        tokens = run.published["train_s"] * gpus * hw.peak_flops_bf16 / (6.0 * float(count_parameters(m)[0]))
        bound = tokens / run.job.sequences - run.job.prompt_len
        print(f"  {run.name:36} update_actor {run.published['train_s']:7.1f} s on {gpus:3d} GPUs: mean response "
              f"<= {bound:6.0f} tokens (assumed {run.job.response_len})")


IMPLIED_PHASES = ("gen_seq_s", "gen_s", "old_log_prob_s", "train_s")


def _implied_mean() -> None:
    """A diagnostic, not an input: for each Qwen2.5-Math-7B run, the mean response length at which the prediction
    of a published phase time equals it (bisection over the mean; each phase's prediction grows with the mean).
    One unpublished input shared by every phase of a run would give one mean for all of them; means that differ
    between phases of one run locate the error in the pricing of a phase rather than in the assumed mean. The
    table above keeps the assumed mean."""
    print("implied mean response length: the mean at which each predicted phase time equals the published one "
          "(a diagnostic; '>' / '<': not reached within [16, max response])")
    print(f"{'run':36} " + " ".join(f"{k:>15}" for k in IMPLIED_PHASES))
    for run in runs():
        if run.model != MATH[0] or "sync_s" in run.published:  # the sync-time rows have no phases to compare
            continue
        m, c = load_model(run.model, run.sets), load_cluster(run.gpu, run.gpus)

        def phase(mean: int, key: str) -> float:
            job = run.job.model_copy(update={"response_len": mean})
            (plan,), _ = search(m, c, job, run.fixed, top_k=1)
            return predicted(plan, run)[key]

        cells = []
        for key in IMPLIED_PHASES:
            if key not in run.published:
                cells.append(f"{'-':>15}")
                continue
            # means on a multiple of 8 tokens: the sequence is split 2 x cp ways (the cost model's context-
            # parallel rule, which the Ulysses degree stands in for here)
            target, lo, hi = run.published[key], 16, run.job.max_response_len
            if phase(lo, key) > target:
                cells.append(f"{'<' + str(lo):>15}")
                continue
            if phase(hi, key) < target:
                cells.append(f"{'>' + str(hi):>15}")
                continue
            while hi - lo > 8:
                mid = (lo + hi) // 16 * 8
                lo, hi = (mid, hi) if phase(mid, key) < target else (lo, mid)
            cells.append(f"{(lo + hi) // 2:15d}")
        print(f"{run.name:36} " + " ".join(cells))


def _slowest() -> None:
    """What waits for the slowest engine or rank (autoplan/rl/rollout.py `simulate`, autoplan/rl/train.py
    `rank_imbalance`; order statistics of the assumed length distribution): per Qwen2.5-Math-7B run, the predicted
    slowest engine's generation less the engines' mean beside the published gen - generate_sequences (which also
    holds the switch), and the data-parallel groups, sequences per group per mini-batch and the expected fullest
    group's tokens over the mean that each optimizer step waits for; then how the colocated FA phases scale from
    32 to 64 to 128 GPUs, published and predicted."""
    import math

    from autoplan.rl.train import rank_imbalance

    print("the slowest engine and the slowest data-parallel group (order statistics of the assumed lengths)")
    print(f"{'run':36} {'engines':>7} {'per eng':>7} {'slow-mean s':>11} {'pub gen-gen_seq':>15} "
          f"{'dp':>4} {'seq/dp/mb':>9} {'fullest/mean':>12}")
    phases: Dict[str, Dict[int, Tuple[float, float]]] = {"train_s": {}, "old_log_prob_s": {}}
    for run in runs():
        if run.model != MATH[0] or "sync_s" in run.published:  # the sync-time rows have no phases to compare
            continue
        m, c = load_model(run.model, run.sets), load_cluster(run.gpu, run.gpus)
        (plan,), _ = search(m, c, run.job, run.fixed, top_k=1)
        got = predicted(plan, run)
        job, s, lay = run.job, plan.strategy, plan.rollout
        gap = plan.details["rollout_slowest_engine_s"] - plan.details["rollout_engine_mean_s"]
        pub = run.published
        pub_gap = f"{pub['gen_s'] - pub['gen_seq_s']:15.1f}" if "gen_s" in pub and "gen_seq_s" in pub else \
            f"{'-':>15}"
        dp = run.fixed.placement.train_gpus // (s.tp * s.pp * s.cp)
        k = math.ceil(job.sequences / job.mini_batches / dp)
        factor = rank_imbalance(job.response_len, job.max_response_len, job.prompt_len, k, dp)
        print(f"{run.name:36} {lay.engines:7d} {math.ceil(job.sequences / lay.engines):7d} {gap:11.1f} {pub_gap} "
              f"{dp:4d} {k:9d} {factor:12.3f}")
        if run.name.startswith("FA colocate"):
            for key in phases:
                phases[key][run.gpus] = (pub[key], got[key])
    _correlation()
    for key, by in phases.items():
        pub_r = " / ".join(f"{by[a][0] / by[b][0]:.2f}" for a, b in ((32, 64), (64, 128)))
        got_r = " / ".join(f"{by[a][1] / by[b][1]:.2f}" for a, b in ((32, 64), (64, 128)))
        print(f"  FA colocate {key}: 32->64 / 64->128 GPUs speedup published {pub_r}, predicted {got_r} "
              f"(linear 2.00 / 2.00)")


RHOS = (0.0, 0.5, 0.9)


def _correlation() -> None:
    """The slowest engine's lead over the engines' mean when the lengths of one prompt's samples are correlated
    (autoplan/rl/rollout.py `expected_longest_correlated`, a Gaussian copula of correlation rho within a prompt, 0
    between prompts; `simulate(..., rho)`). Where each engine gets whole prompts: verl's synchronous rollout (the
    OSO runs, rollout.mode sync, the default at 503ea75f: recipe/one_step_off_policy/ray_trainer.py line 339 repeats
    the batch n times interleaved, so a prompt's samples are adjacent; the worker group splits it into contiguous
    per-rank chunks, verl/single_controller/base/decorator.py lines 76-87, DataProto.chunk; the engine's tensor-
    parallel ranks gather their chunks, verl/workers/sharding_manager/fsdp_vllm.py lines 253-261; 32 / 128 whole
    prompts per rank here). Not where the agent loop generates (every FA run, rollout.mode async): each sample is
    its own request (uuid4 request_id, verl/experimental/agent_loop/single_turn_agent_loop.py line 41 at b25bb7d4)
    and goes to the server with the fewest requests so far (AsyncLLMServerManager._choose_server, agent_loop.py
    lines 74-83: a counter that is never decreased, so a worker's requests go round the servers in turn), which
    spreads a prompt's samples over the engines. No published figure of the within-prompt correlation was found,
    so the model keeps rho 0 and this prints the gap at 0, 0.5 and 0.9."""
    print("  the slowest engine's lead over the engines' mean (s) with the lengths of one prompt's samples correlated "
          f"(rho {' / '.join(str(r) for r in RHOS)}; not a model input: no published figure fixes rho)")
    for run in runs():
        if not run.name.startswith("OSO"):
            continue
        m, c = load_model(run.model, run.sets), load_cluster(run.gpu, run.gpus)
        (plan,), _ = search(m, c, run.job, run.fixed, top_k=1)
        hw = hardware_of(c)
        gaps = []
        for rho in RHOS:
            sim = R.simulate(m, plan.rollout, hw, run.job, rho=rho)
            gaps.append(f"{sim.seconds - sim.mean_seconds:6.1f}")
        pub = run.published
        pub_gap = f"{pub['gen_s'] - pub['gen_seq_s']:.1f}" if "gen_s" in pub and "gen_seq_s" in pub else "-"
        print(f"  {run.name:36} slowest - mean {' / '.join(gaps)}   published gen - generate_sequences {pub_gap}")
    print("  FA runs: the agent loop spreads each prompt's samples over the engines (see the docstring); rho does "
          "not apply")


def _timing() -> None:
    """Wall time of the command (a fresh interpreter, as a user runs it) for Qwen3-30B-A3B GRPO on 32 H100."""
    cmd = ["autoplan", "rl", "--model", "qwen3-30b-a3b", "--cluster", "h100", "--gpus", "32", "--algo", "grpo",
           "--prompts", "256", "--samples", "8", "--prompt-len", "1024", "--response-len", "4096",
           "--max-response-len", "16384", "--json"]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    best = json.loads(p.stdout)["plans"][0]["estimate"] if p.returncode == 0 else {}
    phases = ", ".join(f"{k} {v:.1f}" for k, v in best.get("phase_times_s", {}).items())
    print(f"timing: {' '.join(cmd[1:])}")
    print(f"  exit {p.returncode}, wall {wall:.2f} s (limit 10 s), best step {best.get('step_time_s', 0):.1f} s; "
          f"phases (s): {phases}")


if __name__ == "__main__":
    sys.exit(main())
