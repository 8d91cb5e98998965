"""Rollout: what a vLLM or SGLang engine holds per GPU (weights, KV cache, CUDA graphs), how many responses the KV
cache admits, how long one decode step takes, and how long a batch of responses takes to generate, the long tail
included.

Sources (the engines' own code, read at vLLM v0.11 / SGLang v0.5 era):
- KV bytes per token: vLLM `vllm/v1/kv_cache_interface.py` `AttentionSpec.page_size_bytes` =
  coef * block_size * num_kv_heads * head_size * dtype_size, coef 2 (K and V) for full attention and 1 for MLA
  (`MLAAttentionSpec`: one latent of kv_lora_rank + qk_rope_head_dim per token, num_kv_heads 1, the same on every
  TP rank); num_kv_heads per rank is max(1, total_num_kv_heads // tensor_parallel_size)
  (`vllm/config/model.py` `ModelConfig.get_num_kv_heads`); vLLM's block count is available memory // page size //
  layers. SGLang 0.5.23 (`sglang/srt/model_executor/pool_configurator.py` `_compute_cell_size`) uses the same cell
  size: get_num_kv_heads(attn_tp_size) * (head_dim + v_head_dim) * layers * dtype bytes, or
  `calculate_mla_kv_cache_dim` = kv_lora_rank + qk_rope_head_dim per layer for MLA.
- Hybrid models (Mamba-2 or Gated DeltaNet layers beside attention; vLLM 0.11): only the attention layers keep
  per-token KV; each Mamba-2 / Gated DeltaNet layer keeps one fixed state per sequence (a conv state and a temporal
  state, `state_elements`), in pages of the attention page's size, the attention block enlarged to hold one
  layer's state (`CachePages`: vLLM `HybridAttentionMambaModelConfig`, `kv_cache_utils`
  `_get_kv_cache_groups_uniform_page_size` / `get_num_blocks`, `MambaSpec`). Every decode step reads and writes
  each running sequence's state. SGLang cuts its budget into a state pool of fixed slots and a token pool for the
  attention layers, and caps the running requests by the slots (`SglangHybridPools`).
- KV capacity: vLLM `Worker.determine_available_memory` (`vllm/v1/worker/gpu_worker.py`): requested memory =
  total * gpu_memory_utilization, KV cache = requested - (weights + peak activation of the profiling run + memory
  not allocated by torch); the worker refuses to start when free memory is below the requested memory, so what
  training leaves resident must fit beside it. SGLang: the KV pool takes what is free after the weights load less a slack of
  B * (1 - mem_fraction_static) (B: the memory before the model loads; model_runner.py), i.e. total *
  mem_fraction_static - weights - context; its activations and CUDA graphs live in that slack.
- Profiling activation (vLLM `GPUModelRunner.profile_run`): one forward pass of max_num_batched_tokens tokens and a
  sampler pass over max_num_seqs rows of fp32 logits.
- CUDA graphs: captured for batch sizes up to 512 (vLLM `CompilationConfig.max_cudagraph_capture_size` default 512;
  graphs of all sizes share one memory pool, sized by the largest capture), so their memory is one decode step's
  activations at that batch.
- SGLang versions: slime 624b824a runs SGLang 0.5.15.post1 (docker/Dockerfile SGLANG_IMAGE_TAG); the hybrid pools
  (`SglangHybridPools`) and the request table (`sglang_pools_outside_budget`) are read in that wheel, the rest in
  0.5.23's, whose rules used here are the same in 0.5.15.post1 (the budget, `_profile_available_bytes`; the MLA and
  DSA cell, `calculate_mla_kv_cache_dim` with the DSA defaults of arg_groups/overrides.py: fp8_e4m3 and trtllm on
  Blackwell, bf16 with fa3 before; the state dtype, configs/mamba_utils.py).
- ENGINE_RUNTIME: what an engine holds outside its requested memory (gpu_memory_utilization, mem_fraction_static).
  Sources: vLLM 0.11.0 (the PyPI wheel's sources) and SGLang 0.5.23 (the PyPI wheel's sources); the line numbers
  are of those files. vLLM `vllm/v1/worker/gpu_worker.py` `Worker.init_device` (lines 165-183) builds the
  distributed groups and only then takes the memory snapshot whose total * gpu_memory_utilization is the requested
  memory ("Initialize the distributed environment BEFORE taking memory snapshot. This ensures NCCL buffers are
  allocated before we measure available memory"), so the engine process's CUDA context, its NCCL communicators
  and its custom all-reduce buffers lie outside the requested memory; CUDA graphs are captured after the KV cache
  is sized (`compile_or_warm_up_model`, lines 342-344), outside it as well. The engine runs in a process of its
  own in both frameworks (verl `verl/workers/rollout/vllm_rollout/vllm_rollout.py` `ServerAdapter`, line 65, at
  verl b178a3cd; slime launches SGLang servers), so its CUDA context comes on top of the trainer's.
  - NCCL communicators: `vllm/distributed/parallel_state.py` `GroupCoordinator.__init__` builds a device
    communicator for every group with world_size > 1 (line 252) for the tp, dp and ep groups (lines 1152-1206; the
    ep group spans dp x tp); `PyNcclCommunicator.__init__` runs a warm-up all-reduce at creation
    (`vllm/distributed/device_communicators/pynccl.py` lines 137-139), so its buffers exist before the snapshot.
    SGLang `sglang/srt/distributed/parallel_state.py`: the tp group (line 2691, all GPUs of the engine). Each is
    priced as one training communicator (costmodel/calibration.py nccl_gib_per_group).
  - Custom all-reduce: `vllm/distributed/device_communicators/custom_all_reduce.py` (world sizes 2, 4, 6, 8, line
    51; none across nodes, lines 84-89; max_size 8 MiB, line 57, lowered to the capability table when symmetric
    memory is on, lines 114-119; buffers meta_size + max_size, max_size and an 8 MiB rank_data table, lines
    164-177); SGLang's `custom_all_reduce.py` the same (lines 41-42, 106-118). vLLM 0.11.0 also enables its
    symmetric-memory all-reduce by default (`vllm/envs.py` VLLM_ALLREDUCE_USE_SYMM_MEM default 1, line 1411):
    `symm_mem.py` `SymmMemCommunicator.__init__` allocates one buffer of SYMM_MEM_ALL_REDUCE_MAX_SIZES[capability]
    [world size] bytes (lines 80-84; the sizes in `all_reduce_utils.py` lines 45-57) for the same world sizes.
    SGLang's tp group is made with a device communicator (parallel_state.py lines 2686-2692); its MoE ep group
    is made with use_pynccl=False (line 2913), so it is not counted.
  - MLA workspace: `vllm/v1/attention/backends/mla/common.py` `determine_chunked_prefill_workspace_size` (lines
    442-467: min(max(8 * max_model_len, 4 * max_num_seqs * block_size), 64 Ki) tokens) and the buffer of that many
    rows of head_size (kv_lora_rank + rope dim) in the model dtype (lines 500-520), made with the attention
    metadata builder when the KV cache is initialised, after the budget was computed.
  - Not held by the emitted settings, so not counted: DeepEP buffers (SGLang `--moe-a2a-backend deepep`, sized by
    DeepEP csrc/config.hpp `get_low_latency_rdma_size_hint`; neither emitter selects it), vLLM's symmetric-memory
    all-reduce (VLLM_ALLREDUCE_USE_SYMM_MEM, off by default in 0.11.0). The sampler's logits workspace
    (`_dummy_sampler_run` after capture, gpu_worker.py lines 407-416) reuses the profiling run's peak, which is
    inside the requested memory (profile_activation_bytes).
- Decode is memory-bound at small batch: a step reads every weight it uses plus the KV cache of the running
  sequences from HBM, at 0.92 of the datasheet rate (torchao's roofline planning factor, profiles/gpu_reference.md
  sec. 3, S2); at large batch the GEMMs bound it (2 FLOPs per active parameter per token, at the GPU's MAMF
  fraction). The weight GEMMs and the attention over the KV cache are different kernels that run one after the
  other on the stream, so each is bounded by its own roofline (the larger of its HBM bytes and its FLOPs at the
  attainable rates) and their times add (the per-operator roofline of Yuan et al. 2024, "LLM Inference Unveiled:
  Survey and Roofline Model Insights", arXiv:2402.16363, sec. 2: a layer's time is the sum of its operators'
  roofline times); the KV reads of a large, long-context batch do not hide under its GEMMs. A MoE layer reads only
  the experts its tokens chose: with k of E experts drawn per token, b tokens touch E * (1 - (1 - k/E)^b) experts
  on average (uniform routing).
  On a compute-poor part the GEMMs bound the step early: an H20 (148 TFLOP/s bf16 against 4.0 TB/s) passes from
  bandwidth- to compute-bound at about 0.80 * 148e12 / (0.92 * 4.0e12) = 32 tokens per GPU, so an RL rollout's
  batch of hundreds decodes compute-bound there, not at the HBM rate. verl reports as much for H20: speculative
  decoding (MTP), which trades compute for fewer steps, lowers a 7B model's rollout throughput by about 50% on
  H20 (docs/advance/mtp.md at b178a3cd, "Performance Notes for MTP in Rollout Inference").
- Every decode step also pays the engine's per-step work outside the model (scheduling, input preparation,
  sampling, output processing): STEP_OVERHEAD_S, taken from vLLM's published decode latencies (DECODE_FIGURES: its
  performance benchmark's latency tests, 32 prompt tokens, 128 output tokens, batch 8, H200): the median over the
  three models of (published latency - this model's time without the overhead) / 128 steps.
- Without CUDA graphs (vLLM enforce_eager=True) every kernel is launched from the host: ~5 us each (NVIDIA,
  "Getting Started with CUDA Graphs", 2019: launch overhead of a few microseconds per kernel, which graphs remove);
  a decoder layer in vLLM's llama.py runs 9 modules (input norm, QKV, rotary, attention, output projection, post
  norm, gate-up, activation, down) plus 2 TP all-reduces; fused_moe adds 7 (router GEMM, top-k softmax, align/sort,
  two grouped GEMMs, activation, sum).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from statistics import NormalDist
from typing import Dict, Optional, Union

import numpy as np

from autoplan.costmodel.calibration import DEFAULT as DEFAULT_CALIBRATION
from autoplan.costmodel.collectives import collective_time
from autoplan.costmodel.hardware import GIB, Hardware
from autoplan.costmodel.params import embedding_params, head_params, layer_params
from autoplan.model import ModelSpec
from autoplan.rl.spec import RLJob, RolloutLayout

BF16 = 2  # bytes per weight and per KV element (bf16 rollout, bf16 KV cache: both engines' default "auto" dtype)
HBM_EFFICIENCY = 0.92  # torchao roofline planning factor (profiles/gpu_reference.md sec. 3, S2)
CUDA_CONTEXT_GIB = 0.6  # as the training cost model's cuda_context term (costmodel/rank.py MEMORY_KEYS)
MAX_CAPTURE_BATCH = 512  # vLLM CompilationConfig.max_cudagraph_capture_size default
LAUNCH_S = 5e-6  # per kernel launched from the host (NVIDIA "Getting Started with CUDA Graphs")
KERNELS_DENSE_LAYER = 11  # vLLM llama.py decoder layer: 9 modules + 2 TP all-reduces
KERNELS_MOE_EXTRA = 7  # vLLM fused_moe: router, top-k, align, 2 grouped GEMMs, activation, sum
# vLLM performance benchmark, latency tests (buildkite.com/vllm/performance-benchmark/builds/9515): input 32 tokens,
# output 128 tokens, batch 8, H200, mean end-to-end latency in ms: (catalogue model, TP, latency).
DECODE_FIGURES = (("llama3.1-8b", 1, 833.421), ("llama3-70b", 4, 2077.53), ("mixtral-8x7b", 2, 1917.44))
# Per-step residuals of this module's decode model against DECODE_FIGURES: 2.81, 3.25, 4.73 ms; the median.
STEP_OVERHEAD_S = 3.25e-3
# Whether a colocated engine's weights wait on the host while it sleeps (and so are copied out at sleep and back at
# wake). vLLM under verl: no. verl sleeps vLLM at level 2 for vLLM >= 0.8.5 (verl/third_party/vllm/__init__.py
# lines 46-49 at b178a3cd; verl/workers/sharding_manager/megatron_vllm.py line 193, `sleep(level=2)`, at e2e4c35e,
# the commit of docs/perf/dpsk.md's DeepSeek benchmark), and level 2 discards the weights (vLLM docs, "Sleep Mode":
# level 1 offloads them to CPU memory, level 2 discards them); the sync rewrites them (refit). SGLang under slime:
# counted as kept (a CPU backup of the weights, SGLang --enable-weights-cpu-backup), which is not established for
# slime's launch; counting it never under-predicts host RAM.
WEIGHTS_ON_HOST_ASLEEP = {"vllm": False, "sglang": True}
# Engine limits (verl rollout config defaults: max_num_seqs 1024, max_num_batched_tokens 8192).
MAX_NUM_SEQS = 1024
MAX_NUM_BATCHED_TOKENS = 8192
# Requests in flight per engine: verl's vLLM takes max_num_seqs of them; slime holds at most
# --sglang-server-concurrency (default 512) per engine in flight (slime/rollout/sglang_rollout.py line 94 at
# 624b824a: asyncio.Semaphore(args.sglang_server_concurrency * get_rollout_num_engines(args)), the router spreading
# them over the engines; slime/backends/sglang_utils/arguments.py line 47).
ENGINE_CONCURRENCY = {"vllm": MAX_NUM_SEQS, "sglang": 512}
# Engine memory outside the requested fraction (ENGINE_RUNTIME in the module doc).
NCCL_GIB_PER_GROUP = DEFAULT_CALIBRATION.nccl_gib_per_group  # one NCCL communicator, as the training cost model
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)  # vLLM/SGLang CustomAllreduce._SUPPORTED_WORLD_SIZES
CUSTOM_AR_MAX_BYTES = 8192 * 1024  # vLLM CustomAllreduce max_size default; SGLang _MAX_CAR_SIZE (CUDA)
# vLLM all_reduce_utils.SYMM_MEM_ALL_REDUCE_MAX_SIZES, the larger of its capability 9.0 and 10.0 rows per world size
# (the GPU's compute capability is not part of Hardware; the larger never counts less).
SYMM_MEM_MAX_BYTES = {2: 64 * 2**20, 4: 32 * 2**20, 6: 128 * 2**20, 8: 128 * 2**20}
MLA_WORKSPACE_TOKENS = 64 * 1024  # vLLM MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size cap


# DeepSeek sparse attention's MLA latent cache, bytes per token and layer, on every tp rank:
# - vLLM 0.11 stores it as "fp8_ds_mla" by default (model_executor/models/config.py
#   DeepseekV32ForCausalLM.verify_and_update_config: cache_dtype "auto" -> "fp8_ds_mla"): 656 bytes
#   (v1/kv_cache_interface.py MLAAttentionSpec.page_size_bytes; FlashMLA's layout: 512 fp8 latent values, 4 fp32
#   scales, 64 bf16 rope values);
# - SGLang 0.5.23 takes an fp8_e4m3 cache on Blackwell (compute capability >= 10) and bf16 elsewhere for DSA models
#   (srt/arg_groups/overrides.py: kv_cache_dtype "auto" -> "fp8_e4m3" if major >= 10 else "bfloat16"), with the
#   trtllm (Blackwell) or flashmla_sparse / fa3 (Hopper) backends, whose rows are the raw kv_lora_rank +
#   qk_rope_head_dim values (mem_cache/kv_cache_configurator.py calculate_mla_kv_cache_dim): 576 x 1 or 2 bytes.
#   Blackwell is told by the GPU's FP4 tensor cores (Hardware.peak_flops_fp4 > 0: sm100 parts, none before).
# Its lightning indexer keeps its own key cache in each layer with an indexer, fp8 values and one fp32 scale per 128
# (vLLM model_executor/models/deepseek_v2.py DeepseekV32IndexerCache, uint8; SGLang mem_cache/memory_pool.py
# DSATokenToKVPool quant_block_size 128, model_executor/pool_configurator.py `_compute_dsa_indexer_cell_size`, elided
# in the layers that reuse another's top-k). vLLM holds both as MLAAttentionSpecs of one group of uniform type
# (kv_cache_utils `_get_kv_cache_groups_uniform_type`): a token takes both in every layer. vLLM 0.11 has no GLM-5
# class: GLM-5 / 5.2 are priced with DeepSeek-V3.2's layout (the same MLA + DSA blocks), the indexer keys in the
# layers that hold an indexer, as SGLang keeps them.
DSA_LATENT_BYTES_VLLM = 656
DSA_INDEX_QUANT_BLOCK = 128


def dsa_latent_bytes(model: ModelSpec, engine: str, blackwell: bool) -> int:
    """Bytes of DSA's MLA latent cache per token and layer on `engine` (see above)."""
    if engine == "vllm":
        return DSA_LATENT_BYTES_VLLM
    return (model.kv_lora_rank + model.qk_pos_emb_head_dim) * (1 if blackwell else BF16)


def is_blackwell(hw: Hardware) -> bool:
    """Compute capability >= 10, told by FP4 tensor cores: every FP4 part of the catalogue (profiles/gpus) is an
    NVIDIA Blackwell (sm100), and none before it has them; a datasheet GPU with FP4 is taken as one."""
    return hw.peak_flops_fp4 > 0


def dsa_index_bytes_per_token_layer(model: ModelSpec) -> int:
    """Bytes of the lightning indexer's key cache per token and indexer layer (vLLM DeepseekV32IndexerCache)."""
    d = model.dsa_index_head_dim
    return d + d // DSA_INDEX_QUANT_BLOCK * 4


# ---- the cache: attention KV pages and recurrent-state pages -----------------------------------------------------

# vLLM (model_executor/models/config.py HybridAttentionMambaModelConfig.verify_and_update_config) makes the
# attention block a multiple of 16 tokens ("some attention backends (e.g. FA) only support setting block size to
# multiple of 16").
VLLM_BLOCK_MULTIPLE = 16


def attention_layers(model: ModelSpec) -> int:
    """Layers with softmax attention's per-token KV cache: a hybrid pattern's '*', the layers that are not Gated
    DeltaNet, else every layer (a parallel_mamba layer has attention beside its Mamba mixer)."""
    if model.is_hybrid:
        return model.layer_count("*")
    return model.num_layers - model.linear_attention_layers


def state_layers(model: ModelSpec) -> int:
    """Layers with a fixed recurrent state per sequence: a hybrid pattern's Mamba layers, every layer of a
    parallel_mamba model, the Gated DeltaNet layers."""
    if model.is_hybrid:
        return model.layer_count("M")
    if model.parallel_mamba:
        return model.num_layers
    return model.linear_attention_layers


def kv_bytes_per_token_layer(model: ModelSpec, tp: int) -> float:
    """KV-cache bytes one token takes in one attention layer on one GPU of a tp-way attention group (module doc)."""
    if model.multi_latent_attention:
        return (model.kv_lora_rank + model.qk_pos_emb_head_dim) * BF16
    return 2 * max(1, model.num_query_groups // tp) * model.kv_channels * BF16


def kv_bytes_per_token(model: ModelSpec, tp: int, engine: str = "vllm", blackwell: bool = False) -> float:
    """KV-cache bytes one token takes on one GPU of a tp-way attention group, all attention layers; under DSA the
    engine's latent in every layer and the indexer's keys in each layer with an indexer of its own."""
    if model.dsa_index_heads:
        return model.num_layers * dsa_latent_bytes(model, engine, blackwell) + \
            model.num_dsa_indexer_layers * dsa_index_bytes_per_token_layer(model)
    return attention_layers(model) * kv_bytes_per_token_layer(model, tp)


def mamba_groups(model: ModelSpec, tp: int) -> int:
    """Mamba-2's B/C groups on one GPU's shard, widened to shard with the heads when tp does not divide them (vLLM
    mamba_utils.py `extra_groups_for_head_shards`: + tp - G)."""
    return model.mamba_num_groups + (0 if model.mamba_num_groups % tp == 0 else tp - model.mamba_num_groups)


def state_elements(model: ModelSpec, tp: int) -> tuple:
    """Elements of one layer's recurrent state of one sequence on one GPU of a tp-way group: (conv state, temporal
    state), as vLLM 0.11 shapes them (model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator).
    Gated DeltaNet (`gated_delta_net_state_shape`, qwen3_next.py): conv (kernel - 1) x (2 key dim + value dim) / tp,
    temporal value heads / tp x key head dim x value head dim. Mamba-2 (`mamba2_state_shape`, nemotron_h.py):
    conv (kernel - 1) x (d_inner + 2 G' N) / tp with G' the groups widened to shard with the heads
    (`mamba_groups`), temporal heads / tp x head dim x N."""
    if model.linear_attention_layers:
        conv_dim = 2 * model.gdn_num_key_heads * model.gdn_key_head_dim + \
            model.gdn_num_value_heads * model.gdn_value_head_dim
        conv = (model.gdn_conv_kernel - 1) * conv_dim // tp
        return conv, model.gdn_num_value_heads // tp * model.gdn_key_head_dim * model.gdn_value_head_dim
    if not state_layers(model):
        return 0, 0
    conv_dim = model.mamba_d_inner + 2 * mamba_groups(model, tp) * model.mamba_state_dim
    conv = (model.mamba_conv_kernel - 1) * (conv_dim // tp)
    return conv, model.mamba_num_heads // tp * model.mamba_head_dim * model.mamba_state_dim


# SGLang's temporal (SSM) state dtypes by name (configs/mamba_utils.py mamba2_state_dtype: dtype_map; 0.5.15.post1
# and 0.5.23 alike).
SSM_STATE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def ssm_state_bytes(model: ModelSpec, engine: str = "vllm") -> int:
    """Bytes of one temporal-state element: vLLM 0.11 keeps it in the model dtype (mamba_ssm_cache_dtype default
    'auto', the model's bf16; mamba_utils.py `_mamba_state_dtype`, `gated_delta_net_state_dtype`), SGLang in the
    config's mamba_ssm_dtype (or --mamba-ssm-dtype, which the slime emitter writes when it is set), else float32 (configs/mamba_utils.py mamba2_state_dtype, "Default 'float32'")."""
    if engine == "vllm":
        return BF16
    return SSM_STATE_BYTES[model.mamba_ssm_dtype or "float32"]


def state_bytes_per_layer(model: ModelSpec, tp: int, engine: str = "vllm") -> int:
    """Bytes of one layer's recurrent state of one sequence on one GPU (vLLM MambaSpec.page_size_bytes unpadded;
    SGLang BaseLinearStateParams.mamba_cache_per_req per layer): the conv state in bf16 (both engines: vLLM's model
    dtype, SGLang's SGLANG_MAMBA_CONV_DTYPE default bfloat16), the temporal state at `ssm_state_bytes`."""
    conv, temporal = state_elements(model, tp)
    return conv * BF16 + temporal * ssm_state_bytes(model, engine)


def state_tp_ok(model: ModelSpec, tp: int) -> bool:
    """Whether vLLM can split the recurrent mixers tp ways: its `divide` asserts on the value heads (and key heads)
    of Gated DeltaNet, on Mamba-2's heads and widened conv channels; Mamba-2's groups must split tp ways or be one
    (model_executor/layers/mamba/mamba_mixer2.py: "If tensor parallel world size does not divide num_groups, then
    num_groups must equal 1"). SGLang asserts the same on its attention-tp size (srt/layers/attention/mamba/mamba.py
    MambaMixer2)."""
    if model.linear_attention_layers:
        return model.gdn_num_value_heads % tp == 0 and model.gdn_num_key_heads % tp == 0
    if not state_layers(model):
        return True
    groups = mamba_groups(model, tp)
    return (model.mamba_num_heads % tp == 0 and groups > 0
            and (model.mamba_num_groups % tp == 0 or model.mamba_num_groups == 1)
            and (model.mamba_d_inner + 2 * groups * model.mamba_state_dim) % tp == 0)


@dataclass(frozen=True)
class CachePages:
    """How one attention group's cache memory is cut into blocks, and how many blocks a sequence takes.

    vLLM 0.11's KV cache manager (v1/core/kv_cache_utils.py): every layer's cache is in pages of one size; layers
    of one kind are split into KV-cache groups of `group_layers` layers, the fewest layers of any kind
    (`_get_kv_cache_groups_uniform_page_size`: group_size = min over kinds, each kind ceil(layers / group_size)
    groups, padded), and the memory holds available // page // group_layers blocks (`get_num_blocks`), drawn by every
    group from one pool. A sequence takes one block per `block_tokens` tokens in each attention group and one block
    in each state group (MambaSpec.max_memory_usage_bytes: "We allocate 1 block for each request now"). A hybrid's
    attention block is enlarged so that its page holds one layer's state (16 x ceil(state page / (16 x attention
    bytes per token)) tokens, HybridAttentionMambaModelConfig), the state page padded up to it.
    A model without state layers is held token by token here (one group, `block_tokens` 1): vLLM's 16-token pages
    round a sequence up by under 16 tokens, not modelled; SGLang's pages are one token."""

    block_tokens: int
    page_bytes: float  # one block of one layer
    group_layers: int
    attention_groups: int
    state_groups: int

    def blocks(self, cache_bytes: float) -> int:
        return max(int(cache_bytes // self.page_bytes // self.group_layers), 0) if cache_bytes > 0 else 0

    def blocks_per_sequence(self, tokens: int) -> int:
        return self.attention_groups * -(-tokens // self.block_tokens) + self.state_groups

    def sequences(self, cache_bytes: float, tokens: int) -> int:
        """Sequences of `tokens` tokens each that the cache holds at once."""
        return self.blocks(cache_bytes) // self.blocks_per_sequence(tokens)

    def tokens(self, cache_bytes: float) -> float:
        """The cache's size in tokens as vLLM logs it ("GPU KV cache size"): blocks // groups x block tokens;
        a model without attention layers has no token bound (inf)."""
        if not self.attention_groups:
            return math.inf
        return float(self.blocks(cache_bytes) // (self.attention_groups + self.state_groups) * self.block_tokens)


# SGLang on a hybrid, as slime runs it: SGLang 0.5.15.post1, the image slime 624b824a builds on (docker/Dockerfile
# SGLANG_IMAGE_TAG=v0.5.15.post1-cu129; docker/README.md), read in that wheel's sources
# (sglang/srt/model_executor/model_runner_kv_cache_mixin.py, server_args.py, arg_groups/overrides.py), with the
# defaults of a launch that sets none of --max-mamba-cache-size, --mamba-full-memory-ratio,
# --mamba-scheduler-strategy, --max-running-requests: the state pool's share of the budget r / (1 + r) with
# r = mamba_full_memory_ratio 0.9 (server_args.py); state slots per running request 3 + 2
# (`_calculate_mamba_ratio`: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO 3 + MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP 2
# for the extra_buffer strategy under the overlap scheduler, which overrides.py `_mamba_radix_cache_resolution`
# picks for Qwen3-Next / Qwen3.5, Nemotron-H and Falcon-H1 with the radix cache and the overlap scheduler on, the
# defaults; 1 with --disable-radix-cache); token pages of 64 for Qwen3-Next / Qwen3.5 on Blackwell
# (`_qwen3_5_hybrid_overrides`: trtllm_mha, page_size 64), of 1 otherwise (Nemotron-H flashinfer, Falcon-H1
# triton on Blackwell; fa3 on Hopper; `_page_size_default`).
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9
SGLANG_STATE_SLOTS_PER_REQUEST = 5
SGLANG_TRTLLM_PAGE_TOKENS = 64
# SGLang's own cap on running requests before the state slots (`_resolve_max_num_reqs`): tokens / context x 512,
# clamped to [2048, 4096], and at most half the token pool.
SGLANG_RUNNING_PER_CONTEXT = 512
SGLANG_RUNNING_CLAMP = (2048, 4096)


@dataclass(frozen=True)
class SglangHybridPools:
    """How SGLang cuts one attention group's budget (mem_fraction_static's share left after the weights) for a
    hybrid (0.5.15.post1, see above): first a pool of state slots, each one request's conv + temporal state in every
    state layer (`handle_max_mamba_cache`, ratio branch: K = int(budget x r / (1 + r) // slot), K x slot charged to
    the budget; MambaPool allocates K + 1, its padding slot outside the budget, `engine_runtime_bytes`), then the
    rest to the attention layers' KV, token by token in pages (PoolConfigurator.calculate_pool_sizes: rest // cell //
    page x page, the cell over the full-attention layers only). The running requests are at most
    min(SGLang's estimate, tokens // 2, K // slots per request) (`_resolve_max_num_reqs`)."""

    slot_bytes: float  # one request's recurrent state, every state layer, one GPU
    token_bytes: float  # one token's KV, every attention layer, one GPU
    page_tokens: int
    context: int  # SGLang's context_len: the model's max_position_embeddings
    slots_per_request: int = SGLANG_STATE_SLOTS_PER_REQUEST

    def slots(self, cache_bytes: float) -> int:
        budget = cache_bytes * SGLANG_MAMBA_FULL_MEMORY_RATIO / (1.0 + SGLANG_MAMBA_FULL_MEMORY_RATIO)
        return max(int(budget // self.slot_bytes), 0)

    def tokens(self, cache_bytes: float) -> float:
        """The token pool's size (SGLang's max_total_num_tokens); no token bound without attention layers."""
        rest = cache_bytes - self.slots(cache_bytes) * self.slot_bytes
        if not self.token_bytes:
            return math.inf
        return float(max(int(rest // self.token_bytes), 0) // self.page_tokens * self.page_tokens)

    def running(self, cache_bytes: float) -> int:
        """SGLang's max_running_requests; 0 when the engine would refuse to start (no slot, no token)."""
        return min(sglang_max_running(self.tokens(cache_bytes), self.context),
                   self.slots(cache_bytes) // self.slots_per_request)

    def sequences(self, cache_bytes: float, tokens: int) -> int:
        """Requests of `tokens` tokens each that run at once: the token pool's share, at most `running`."""
        return int(min(self.tokens(cache_bytes) // tokens, self.running(cache_bytes)))


def sglang_max_running(tokens: float, context: int) -> int:
    """SGLang's max_running_requests of a token pool without state slots (`_resolve_max_num_reqs`, no
    --max-running-requests): min(clamp(int(tokens / context x 512), 2048, 4096), tokens // 2)."""
    if not math.isfinite(tokens):
        return SGLANG_RUNNING_CLAMP[1]
    low, high = SGLANG_RUNNING_CLAMP
    return int(min(max(min(int(tokens / context * SGLANG_RUNNING_PER_CONTEXT), high), low), tokens // 2))


@lru_cache(maxsize=4096)  # pure, of frozen inputs; the search asks again for every combination
def cache_pages(model: ModelSpec, tp: int, engine: str = "vllm", blackwell: bool = False,
                radix_cache: bool = True) -> Union[CachePages, SglangHybridPools]:
    n_attn, n_state = attention_layers(model), state_layers(model)
    per_token = kv_bytes_per_token_layer(model, tp)
    if not n_state:  # one group of uniform type: a token's bytes over every layer
        return CachePages(1, kv_bytes_per_token(model, tp, engine, blackwell), 1, 1, 0)
    if engine == "sglang":
        page = SGLANG_TRTLLM_PAGE_TOKENS if blackwell and model.linear_attention_layers else 1
        return SglangHybridPools(n_state * state_bytes_per_layer(model, tp, engine), n_attn * per_token, page,
                                 model.max_position_embeddings, SGLANG_STATE_SLOTS_PER_REQUEST if radix_cache else 1)
    state = state_bytes_per_layer(model, tp)
    if not n_attn:
        return CachePages(1, state, n_state, 0, 1)
    block = VLLM_BLOCK_MULTIPLE * -(-state // int(VLLM_BLOCK_MULTIPLE * per_token))
    group = min(n_attn, n_state)
    return CachePages(block, block * per_token, group, -(-n_attn // group), -(-n_state // group))


@dataclass(frozen=True)
class EngineWeights:
    """Bytes of weights on one GPU of an engine: read every step (dense) and routed experts (read when chosen)."""

    dense: float
    experts: float

    @property
    def total(self) -> float:
        return self.dense + self.experts


@lru_cache(maxsize=4096)  # pure, of frozen inputs; the search asks again for every combination
def engine_weights(model: ModelSpec, layout: RolloutLayout) -> EngineWeights:
    """Attention, dense MLP, shared experts, embedding and head split tp ways; routed experts split over
    max(ep, tp) GPUs (without expert parallelism the engines split each expert tp ways); norms and router whole."""
    tp, ep = layout.tp, layout.ep
    n_moe = model.num_moe_layers
    dense_l, moe_l = layer_params(model, False), layer_params(model, True) if model.is_moe else None
    sharded = (model.num_layers - n_moe) * (dense_l.attention + dense_l.dense_mlp)
    whole = (model.num_layers - n_moe) * (dense_l.norms + dense_l.indexer)
    experts = 0.0
    if moe_l is not None:
        sharded += n_moe * (moe_l.attention + moe_l.shared_experts)
        whole += n_moe * (moe_l.norms + moe_l.router + moe_l.indexer)
        experts = n_moe * moe_l.experts / max(ep, tp)
    sharded += embedding_params(model) + head_params(model)
    return EngineWeights(dense=(sharded / tp + whole) * BF16, experts=experts * BF16)


@lru_cache(maxsize=4096)  # pure, of frozen inputs; the search asks again for every combination
def active_params_per_token(model: ModelSpec) -> float:
    n_moe = model.num_moe_layers
    dense_l, moe_l = layer_params(model, False), layer_params(model, True) if model.is_moe else None
    active = (model.num_layers - n_moe) * dense_l.active + (n_moe * moe_l.active if moe_l else 0)
    return active + head_params(model)  # the embedding is a lookup, the head a GEMM


def profile_activation_bytes(model: ModelSpec, layout: RolloutLayout) -> float:
    """vLLM's profiling peak: max_num_batched_tokens through the widest MLP (gate and up, tp-sharded) and the
    residual stream, plus fp32 logits of max_num_seqs rows (see module doc)."""
    width = max(model.ffn_hidden_size, model.moe_ffn_hidden_size * max(model.moe_router_topk, 1))
    tokens = MAX_NUM_BATCHED_TOKENS
    mlp = tokens * (2 * width / layout.tp + 4 * model.hidden_size) * BF16
    logits = MAX_NUM_SEQS * model.vocab_size * 4
    return mlp + logits


def cuda_graph_bytes(model: ModelSpec, layout: RolloutLayout) -> float:
    """One decode step's activations at the largest captured batch (see module doc); 0 without graphs."""
    if not layout.cuda_graphs:
        return 0.0
    width = max(model.ffn_hidden_size, model.moe_ffn_hidden_size * max(model.moe_router_topk, 1))
    batch = MAX_CAPTURE_BATCH
    return batch * (2 * width / layout.tp + 4 * model.hidden_size) * BF16 + batch * model.vocab_size * 4


@lru_cache(maxsize=4096)  # pure, of frozen inputs; the search asks again for every combination
def kv_cache_bytes(model: ModelSpec, layout: RolloutLayout, hw: Hardware) -> float:
    """KV-cache bytes per GPU (see module doc; negative = the weights do not fit in the requested memory). Under
    DSA vLLM's model also holds an int32 [max_num_batched_tokens, index_topk] buffer of top-k indices from its
    construction (model_executor/models/deepseek_v2.py DeepseekV2Model `topk_indices_buffer`)."""
    requested = layout.gpu_memory_utilization * hw.capacity_bytes
    weights = engine_weights(model, layout).total
    context = CUDA_CONTEXT_GIB * GIB
    if layout.engine == "sglang":
        return requested - weights - context
    topk_buffer = MAX_NUM_BATCHED_TOKENS * model.dsa_index_topk * 4 if model.dsa_index_heads else 0
    return requested - weights - context - profile_activation_bytes(model, layout) - topk_buffer


@lru_cache(maxsize=4096)  # pure, of frozen inputs; the search asks again for every combination
def kv_tokens_per_group(model: ModelSpec, layout: RolloutLayout, hw: Hardware) -> float:
    """Tokens the KV cache of one attention group (tp GPUs) holds (`CachePages.tokens`)."""
    return _group_pages(model, layout, hw).tokens(kv_cache_bytes(model, layout, hw))


def sequences_per_group(model: ModelSpec, layout: RolloutLayout, hw: Hardware, tokens: int) -> int:
    """Sequences of `tokens` tokens each that one attention group's cache holds at once (`CachePages`)."""
    return _group_pages(model, layout, hw).sequences(kv_cache_bytes(model, layout, hw), tokens)


def cache_shortfall(model: ModelSpec, layout: RolloutLayout, hw: Hardware, tokens: int) -> Optional[str]:
    """Why one attention group's cache cannot run a single request of `tokens` tokens, or None when it can."""
    if sequences_per_group(model, layout, hw, tokens) >= 1:
        return None
    pools, budget = _group_pages(model, layout, hw), kv_cache_bytes(model, layout, hw)
    if isinstance(pools, SglangHybridPools) and pools.running(budget) < 1 <= pools.tokens(budget) // tokens:
        return (f"SGLang's state pool of one attention group holds {pools.slots(budget)} slots of "
                f"{pools.slot_bytes / GIB:.2f} GiB, fewer than the {pools.slots_per_request} one running request "
                f"takes")
    return (f"the KV cache of one attention group holds {kv_tokens_per_group(model, layout, hw):,.0f} tokens, not "
            f"one prompt + the longest response ({tokens:,})")


def _group_pages(model: ModelSpec, layout: RolloutLayout, hw: Hardware) -> Union[CachePages, SglangHybridPools]:
    return cache_pages(model, layout.tp, layout.engine, is_blackwell(hw), layout.radix_cache)


def engine_nccl_groups(layout: RolloutLayout) -> int:
    """NCCL communicators one engine GPU holds (see ENGINE_RUNTIME in the module doc): vLLM builds a device
    communicator for each of its tp, dp and ep groups that has more than one rank (its ep group spans dp x tp
    whether or not experts are split); SGLang for its tp group (all tp x dp GPUs of the engine)."""
    size = layout.gpus_per_engine
    if layout.engine == "sglang":
        return int(size > 1)
    return int(layout.tp > 1) + int(layout.dp > 1) + int(size > 1)


def custom_all_reduce_bytes(layout: RolloutLayout, hw: Hardware) -> float:
    """The engines' own all-reduce (IPC buffers over NVLink) on a tp group of 2, 4, 6 or 8 GPUs inside one node:
    a metadata + max_size buffer, a max_size staging buffer and a max_size table of registered pointers, max_size
    at most 8 MiB (both engines), and vLLM's symmetric-memory buffer beside it (see ENGINE_RUNTIME). A group across
    nodes or of another size has none."""
    group = layout.gpus_per_engine if layout.engine == "sglang" else layout.tp
    if group not in CUSTOM_AR_WORLD_SIZES or group > hw.domain_size:
        return 0.0
    symm = SYMM_MEM_MAX_BYTES[group] if layout.engine == "vllm" else 0.0
    return 3.0 * CUSTOM_AR_MAX_BYTES + symm


def mla_workspace_bytes(model: ModelSpec, layout: RolloutLayout) -> float:
    """vLLM's MLA chunked-prefill workspace: at most 64 Ki tokens of one latent + rope row each, in the model's
    dtype, allocated with the attention backend after the KV cache was sized (see ENGINE_RUNTIME); the cap is taken
    (it is reached whenever max_model_len >= 8 Ki tokens, as in RL)."""
    if layout.engine != "vllm" or not model.multi_latent_attention:
        return 0.0
    return MLA_WORKSPACE_TOKENS * (model.kv_lora_rank + model.qk_pos_emb_head_dim) * BF16


def sglang_pools_outside_budget(model: ModelSpec, layout: RolloutLayout, hw: Hardware) -> float:
    """What SGLang (0.5.15.post1) allocates for its pools beyond mem_fraction_static's budget, per GPU: the request
    table, (max running requests + 1) rows of context + 4 int32 token indices (mem_cache/memory_pool.py
    ReqToTokenPool: `_alloc_size = size + 1`, `torch.zeros((self._alloc_size, max_context_len), dtype=torch.int32)`;
    model_runner_kv_cache_mixin.py: max_context_len = context_len + extra_max_context_len 4), which the budget does
    not charge; and on a hybrid MambaPool's padding slot (`size + 1` slots, K charged). 0 on vLLM."""
    if layout.engine != "sglang":
        return 0.0
    pools, budget = _group_pages(model, layout, hw), kv_cache_bytes(model, layout, hw)
    context = model.max_position_embeddings
    if isinstance(pools, SglangHybridPools):
        running, padding = pools.running(budget), pools.slot_bytes
    else:
        running, padding = sglang_max_running(pools.tokens(budget), context), 0.0
    return (max(running, 0) + 1) * (context + 4) * 4.0 + padding


def engine_runtime_bytes(model: ModelSpec, layout: RolloutLayout, hw: Hardware) -> Dict[str, float]:
    """The engine's memory outside gpu_memory_utilization / mem_fraction_static, per GPU, by kind (see
    ENGINE_RUNTIME in the module doc)."""
    return {
        "engine_cuda_context": CUDA_CONTEXT_GIB * GIB,
        "engine_nccl": engine_nccl_groups(layout) * NCCL_GIB_PER_GROUP * GIB,
        "custom_all_reduce": custom_all_reduce_bytes(layout, hw),
        "mla_workspace": mla_workspace_bytes(model, layout),
        "cuda_graphs": cuda_graph_bytes(model, layout),
        "sglang_pools": sglang_pools_outside_budget(model, layout, hw),
    }


def rollout_gpu_bytes(model: ModelSpec, layout: RolloutLayout, hw: Hardware) -> float:
    """What the engine takes on a GPU while it generates: the requested memory (weights + KV + profiling
    activations) plus what it holds outside it (`engine_runtime_bytes`). SGLang's CUDA graphs and activations come
    from the remaining (1 - mem_fraction_static) of the memory it found free, so they are added for both; taking
    the fraction of the whole GPU rather than of the memory found free never counts less."""
    return layout.gpu_memory_utilization * hw.capacity_bytes + sum(engine_runtime_bytes(model, layout, hw).values())


# ---- decode step time --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepModel:
    """Decode step time of an engine at a batch of n running sequences (one attention group holds n / dp) and a
    total context of S tokens over them: max(weight bytes, GEMM FLOPs) + max(KV bytes, attention FLOPs) +
    communication + launches. Arrays are indexed by n."""

    mem_fixed: np.ndarray  # bytes of weights read per GPU, by n
    kv_read_per_token: float  # bytes read per GPU per token of context in the group
    flops_fixed: np.ndarray  # FLOPs per GPU, by n
    attn_flops_per_token: float  # FLOPs per GPU per token of context in the group
    comm: np.ndarray  # seconds, by n
    state_bytes: np.ndarray  # bytes of recurrent state read and written per GPU, by n (0 without state layers)
    sparse_attention: np.ndarray  # seconds of DSA's top-k attention, by n (0 without DSA)
    launch: float  # seconds
    overhead: float  # seconds: the engine's per-step work outside the model
    hbm: float
    flops: float
    dp: int

    @cached_property
    def fixed(self) -> np.ndarray:
        """Seconds of a step at each n apart from attention: max(weight bytes, GEMM FLOPs) + the recurrent
        mixers' state traffic + communication + launches + the engine's overhead."""
        return np.maximum(self.mem_fixed / self.hbm, self.flops_fixed / self.flops) + self.state_bytes / self.hbm + \
            self.sparse_attention + self.comm + self.launch + self.overhead

    @cached_property
    def per_context_token(self) -> float:
        """Seconds of attention per token of context over the engine: both its bytes and its FLOPs grow linearly
        with the context, so max(KV bytes, attention FLOPs) is the context times the larger rate."""
        return max(self.kv_read_per_token / self.hbm, self.attn_flops_per_token / self.flops) / self.dp

    def times(self, n, total_context):
        """Seconds of one decode step with n sequences in the engine and `total_context` tokens over them (scalars
        or arrays)."""
        return self.fixed[n] + self.per_context_token * total_context

    def time(self, n: int, total_context: float) -> float:
        return float(self.times(n, total_context))


def step_model(model: ModelSpec, layout: RolloutLayout, hw: Hardware, max_batch: int,
               overhead: float = STEP_OVERHEAD_S) -> StepModel:
    n = np.arange(max_batch + 1, dtype=float)
    gpus = layout.gpus_per_engine
    w = engine_weights(model, layout)
    if model.is_moe:
        touched = 1.0 - (1.0 - model.moe_router_topk / model.num_experts) ** n
        mem_fixed = w.dense + w.experts * touched
    else:
        mem_fixed = np.full_like(n, w.dense)
    flops_fixed = 2.0 * active_params_per_token(model) * n / gpus
    hbm, flops = hw.hbm_bytes_per_s * HBM_EFFICIENCY, hw.peak_flops_bf16 * hw.gemm_eff_bf16
    if model.multi_latent_attention:  # absorbed MLA decode: every head attends over the latent (+ rope) per token
        d = model.kv_lora_rank + model.qk_pos_emb_head_dim
    else:
        d = model.kv_channels
    tokens_group = n / layout.dp
    if model.dsa_index_heads:
        # DSA decode: the indexer scores every cached token (its key bytes and 2 x heads x dim FLOPs per token and
        # indexer layer, the index heads whole on every rank), and the attention reads and attends the top-k
        # tokens only: priced per running sequence at index_topk tokens (an upper bound once a context is shorter)
        # as the larger of its latent bytes and absorbed-MLA FLOPs, not per token of context.
        idx_layers = model.num_dsa_indexer_layers
        kv_read = idx_layers * dsa_index_bytes_per_token_layer(model)
        attn = 2.0 * idx_layers * model.dsa_index_heads * model.dsa_index_head_dim
        topk, latent = model.dsa_index_topk, dsa_latent_bytes(model, layout.engine, is_blackwell(hw))
        per_seq = max(topk * model.num_layers * latent / hbm,
                      4.0 * topk * model.num_layers * model.num_attention_heads * d / layout.tp / flops)
        sparse = per_seq * tokens_group
    else:
        kv_read = kv_bytes_per_token(model, layout.tp)
        attn = 4.0 * attention_layers(model) * model.num_attention_heads * d / layout.tp
        sparse = np.zeros_like(n)
    # A recurrent mixer's decode step reads each sequence's state and writes it back (vLLM
    # selective_state_update for Mamba-2, fused_recurrent_gated_delta_rule for Gated DeltaNet: a few FLOPs per
    # state element, so bound by its bytes).
    state = 2.0 * state_layers(model) * state_bytes_per_layer(model, layout.tp, layout.engine) * tokens_group
    act_bytes = tokens_group * model.hidden_size * BF16
    # one all-reduce after each tp-split block: attention and MLP of a decoder layer (2), one per layer of a
    # hybrid pattern, whose every layer is a single mixer or MLP block (vLLM nemotron_h.py: one row-parallel output
    # projection per layer)
    reductions = model.num_layers if model.is_hybrid else 2 * model.num_layers
    comm = reductions * collective_time("all_reduce", act_bytes, layout.tp, layout.tp > hw.domain_size, hw)
    if model.is_moe and layout.ep > 1:
        per_gpu = n / gpus * model.moe_router_topk * model.hidden_size * BF16
        comm = comm + 2 * model.num_moe_layers * collective_time("all_to_all", per_gpu, layout.ep,
                                                                  layout.ep > hw.domain_size, hw)
    launch = 0.0
    if not layout.cuda_graphs:
        launch = LAUNCH_S * (model.num_layers * KERNELS_DENSE_LAYER + model.num_moe_layers * KERNELS_MOE_EXTRA)
    return StepModel(mem_fixed=np.asarray(mem_fixed), kv_read_per_token=kv_read,
                     flops_fixed=flops_fixed, attn_flops_per_token=attn, comm=np.asarray(comm),
                     state_bytes=np.asarray(state), sparse_attention=np.asarray(sparse), launch=launch,
                     overhead=overhead, hbm=hbm, flops=flops, dp=layout.dp)


def prefill_seconds(model: ModelSpec, layout: RolloutLayout, hw: Hardware, tokens: float) -> float:
    """Compute-bound prefill of `tokens` prompt tokens on one attention group (tp GPUs)."""
    return 2.0 * active_params_per_token(model) * tokens / (layout.tp * hw.peak_flops_bf16 * hw.gemm_eff_bf16)


# ---- response lengths and the rollout timeline ---------------------------------------------------------------------

def length_scale(mean: float, longest: float) -> float:
    """Scale theta of the response-length distribution: a length is min(X, longest), X exponential with mean theta
    (responses are right-skewed and generation stops at the cap: verl data.max_response_length, slime
    --rollout-max-response-len), and E[min(X, c)] = integral over [0, c] of exp(-x / theta) dx =
    theta * (1 - exp(-c / theta)) must be `mean` (a modelling assumption: the user gives a mean and a maximum).
    The left side rises with theta; solved by bisection."""
    lo, hi = 1e-3 * mean, 1e3 * longest
    for _ in range(100):
        theta = math.sqrt(lo * hi)
        m = theta * (1.0 - math.exp(-longest / theta))
        lo, hi = (theta, hi) if m < mean else (lo, theta)
    return theta


def expected_longest(mean: float, longest: float, draws: int) -> float:
    """Expected longest of `draws` independent response lengths of the distribution of `length_scale` (mean `mean`,
    capped at `longest`). The maximum M of k i.i.d. draws has CDF F(x)^k (David & Nagaraja, "Order Statistics",
    3rd ed. 2003, eq. 2.1.1) and a non-negative variable has E = integral of P(> x) dx, so with F(x) = 1 -
    exp(-x / theta) below the cap and u = F(x): E[min(M, c)] = integral_0^c (1 - F(x)^k) dx = theta * integral_0^u_c
    (1 - u^k) / (1 - u) du = theta * sum_{j=1..k} u_c^j / j, u_c = 1 - exp(-c / theta). Without a cap it is
    theta * H_k, the exponential's expected maximum (Renyi's representation, ibid. sec. 2.5). mean >= longest:
    every response has the cap."""
    if longest <= mean or draws <= 1:
        return float(min(mean, longest))
    theta = length_scale(mean, longest)
    u = -math.expm1(-longest / theta)
    j = np.arange(1, draws + 1, dtype=float)
    return float(min(theta * np.sum(np.exp(j * math.log(u)) / j) if u < 1.0 else theta * np.sum(1.0 / j),
                     longest))


def expected_longest_correlated(mean: float, longest: float, prompts: int, samples: int, rho: float,
                                nodes: int = 48, grid: int = 4096) -> float:
    """Expected longest of `prompts` x `samples` response lengths whose `samples` of one prompt are correlated: each
    length has the distribution of `length_scale` (mean `mean`, capped at `longest`), joined by a Gaussian copula
    with correlation `rho` between two samples of one prompt and 0 between prompts (a length is F^-1(Phi(Z)), Z =
    sqrt(rho) A_prompt + sqrt(1 - rho) B_sample, A and B independent standard normals; Nelsen, "An Introduction to
    Copulas", 2nd ed. 2006, sec. 2.3 / 3.1). The marginal, and so the mean, is that of the independent case for
    every rho; rho is not an input of the planner (no published figure fixes it): the benchmark prints its effect.
    Given A the samples are independent, so P(max <= x) = (E_A[Phi((z(x) - sqrt(rho) A) / sqrt(1 - rho))^samples])
    ^prompts with z(x) = Phi^-1(F(x)) (E_A by Gauss-Hermite quadrature of `nodes` points) and E[min(max, c)] =
    integral_0^c (1 - P(max <= x)) dx (trapezoids on `grid` points). rho 0 is `expected_longest` over prompts x
    samples draws, rho 1 over `prompts` draws."""
    if rho <= 0.0:
        return expected_longest(mean, longest, prompts * samples)
    if rho >= 1.0:
        return expected_longest(mean, longest, prompts)
    if longest <= mean:
        return float(min(mean, longest))
    theta = length_scale(mean, longest)
    x = np.linspace(0.0, longest, grid)
    u = np.clip(-np.expm1(-x / theta), 1e-300, 1.0 - 1e-16)
    std = NormalDist()
    z = np.array([std.inv_cdf(float(v)) for v in u])
    a, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    arg = (z[:, None] - math.sqrt(rho) * a[None, :]) / math.sqrt(1.0 - rho)
    phi = 0.5 * _erfc(-arg / math.sqrt(2.0))
    cdf = np.exp(prompts * np.log(np.maximum((phi ** samples) @ w, 1e-300)))
    tail = 1.0 - cdf
    return float(np.sum((tail[1:] + tail[:-1]) * np.diff(x)) / 2.0)


_erfc = np.vectorize(math.erfc, otypes=[float])


def response_lengths(mean: int, longest: int, count: int) -> np.ndarray:
    """`_response_lengths` (a fresh array: callers may change it)."""
    return _response_lengths(mean, longest, count).copy()


@lru_cache(maxsize=1024)  # pure; the search asks for the same share for every layout of an engine size
def _response_lengths(mean: int, longest: int, count: int) -> np.ndarray:
    """One engine's `count` response lengths, sorted: the expected order statistics of `count` independent draws of
    the distribution of `length_scale`. The longest is `expected_longest` (exact, the cap included); the i-th of
    the others is the exponential's expected i-th order statistic theta' * (H_count - H_(count-i)) (Renyi's
    representation: the i-th smallest of n exponentials is a sum of independent exponentials of means
    theta / n, ..., theta / (n - i + 1); David & Nagaraja sec. 2.5) held at the longest's (an order statistic
    never exceeds the maximum, and the cap holds all of them below it), with theta' chosen so that
    the set's mean is `mean` (n draws' lengths sum to n x mean on average, their maximum included). mean >=
    longest: all equal."""
    if longest <= mean or count == 1:
        return np.full(count, float(longest if longest <= mean else mean))
    top = expected_longest(mean, longest, count)
    harmonic = np.concatenate(([0.0], np.cumsum(1.0 / np.arange(1, count + 1))))
    unit = harmonic[count] - harmonic[count - np.arange(1, count)]  # i = 1 .. count - 1, rising
    target = mean * count - top
    if target >= top * (count - 1):
        return np.full(count, float(top))
    lo, hi = 0.0, 1e3 * longest / max(float(unit[0]), 1e-12)
    for _ in range(100):  # the capped sum rises with theta'
        theta = 0.5 * (lo + hi)
        lo, hi = (theta, hi) if np.minimum(theta * unit, top).sum() < target else (lo, theta)
    rest = np.maximum(np.round(np.minimum(theta * unit, top)), 1.0)
    return np.append(rest, float(round(top)))


def _arrival_order(count: int) -> np.ndarray:
    """A fixed interleaving of the sorted quantiles (a stride coprime to count), so that long and short responses
    arrive mixed, as a shuffled batch does."""
    stride = max(1, int(count * 0.618))
    while math.gcd(stride, count) != 1:
        stride += 1
    return (np.arange(count) * stride) % count


@dataclass(frozen=True)
class RolloutTime:
    seconds: float  # the slowest engine, the long tail included: what a phase that waits for every engine takes
    mean_seconds: float  # the engines' mean (a per-rank average: verl's generate_sequences timing)
    throughput_seconds: float  # the same tokens at the admitted batch, no drain (streamed / partial rollout)
    batch: int  # concurrent sequences per engine the KV cache and max_num_seqs admit
    kv_tokens: float  # per engine
    drain_seconds: float  # the slowest engine's time after its last response was admitted


def simulate(model: ModelSpec, layout: RolloutLayout, hw: Hardware, job: RLJob, rho: float = 0.0) -> RolloutTime:
    """Continuous batching on one engine: responses are admitted while slots last (the sequences of prompt + mean
    response the cache of each attention group holds, `CachePages`, over the engine's dp groups; at most
    max_num_seqs), each running response emits one token per step, a finished one
    frees its slot for the next (with its prefill); an engine ends when its last response ends.

    Each engine gets its share of the batch, independent draws of the length distribution (`response_lengths`).
    An engine's time rises with its longest response (the drain), so the engines' mean is an engine whose longest
    is the expected longest of its share, and the slowest engine the one that drew the whole batch's longest: the
    maximum of the engines' times is the time of the engine holding the maximum of all draws (the times are
    increasing in the longest draw, the other draws alike), priced at its expected value
    (`expected_longest` over job.sequences draws). A phase that waits for every engine (the trainer's
    generation) takes the slowest; a per-rank average the mean.

    `rho` (not used by the planner, which keeps 0): the correlation of the lengths of one prompt's samples when an
    engine gets whole prompts (verl's synchronous rollout: the n copies of a prompt are adjacent in the batch and a
    rank's contiguous chunk goes to its engine); both expected longests then come from
    `expected_longest_correlated`, the engine's other lengths unchanged."""
    per_engine = math.ceil(job.sequences / layout.engines)
    kv_tokens = kv_tokens_per_group(model, layout, hw) * layout.dp
    admitted = sequences_per_group(model, layout, hw, job.prompt_len + job.response_len) * layout.dp
    slots = int(min(ENGINE_CONCURRENCY[layout.engine], admitted, per_engine))
    if slots < 1:
        return RolloutTime(math.inf, math.inf, math.inf, 0, kv_tokens, 0.0)
    # the timeline depends on the memory setting only through the slots: layouts that differ in it alone share it
    same = layout.model_copy(update={"gpu_memory_utilization": 0.5})
    mean, slowest, throughput, drain = _timeline(model, same, hw, job, slots, float(rho))
    return RolloutTime(seconds=slowest, mean_seconds=mean, throughput_seconds=throughput, batch=slots,
                       kv_tokens=kv_tokens, drain_seconds=drain)


@lru_cache(maxsize=1024)
def _timeline(model: ModelSpec, layout: RolloutLayout, hw: Hardware, job: RLJob, slots: int, rho: float = 0.0):
    """(mean engine seconds, slowest engine seconds, throughput seconds, slowest engine's drain seconds) of one
    engine's continuous batching with `slots` slots: the engine whose longest response is the expected longest of
    its own share (the engines' mean), and the same engine with the expected longest of the whole batch."""
    per_engine = math.ceil(job.sequences / layout.engines)
    sm = step_model(model, layout, hw, slots)
    order = _arrival_order(per_engine)
    lengths = response_lengths(job.response_len, job.max_response_len, per_engine)
    if rho > 0.0:  # whole prompts per engine, their samples' lengths correlated (`simulate`)
        per_prompts = max(1, per_engine // job.samples)
        own_top = round(expected_longest_correlated(job.response_len, job.max_response_len, per_prompts,
                                                    job.samples, rho))
        lengths = np.minimum(lengths, own_top)  # no order statistic above the maximum
        lengths[-1] = own_top
        top = expected_longest_correlated(job.response_len, job.max_response_len, job.prompts, job.samples, rho)
    else:
        top = expected_longest(job.response_len, job.max_response_len, job.sequences)
    own = lengths[order]
    lengths[-1] = max(lengths[-1], round(top))
    batch = lengths[order]
    prefill_each = prefill_seconds(model, layout, hw, job.prompt_len) / layout.dp
    throughput = _throughput_seconds(sm, job, own, slots, prefill_each)
    if slots >= per_engine:
        mean, _ = _all_admitted(sm, job.prompt_len, own, prefill_each)
        slow, last_admit = _all_admitted(sm, job.prompt_len, batch, prefill_each)
    else:
        top_at = int(np.flatnonzero(order == per_engine - 1)[0])  # where the longest arrives
        (slow, last_admit), (mean, _) = _admitted_in_turn(sm, job.prompt_len, batch, slots, prefill_each, top_at,
                                                          float(own[top_at]))
    return mean, slow, throughput, slow - last_admit


def _admitted_in_turn(sm: StepModel, prompt_len: int, lengths: np.ndarray, slots: int, prefill_each: float,
                      top: int = -1, shorter: float = 0.0):
    """[(seconds, time of the last admission)]: the event loop of continuous batching, a response admitted (with
    its prefill) when a slot frees, in arrival order; with `top` >= 0, also for the same lengths but lengths[top] =
    `shorter` (not longer than it). The two runs are the same event for event until the shorter response would
    end, so the second continues from the first's state at that step."""
    state = {"t": 0.0, "step": 0.0, "queue": 0, "running": 0, "heap": [], "start_sum": 0.0, "last_admit": 0.0}
    forked = _event_loop(sm, prompt_len, lengths, slots, prefill_each, state, top, shorter)
    out = [(state["t"], state["last_admit"])]
    if forked is not None:
        _event_loop(sm, prompt_len, lengths, slots, prefill_each, forked, -1, 0.0)
        out.append((forked["t"], forked["last_admit"]))
    return out


def _event_loop(sm: StepModel, prompt_len: int, lengths: np.ndarray, slots: int, prefill_each: float, st: dict,
                top: int, shorter: float):
    """Run `st` to the end; return, when `top` >= 0, a copy of the state at the step where lengths[top] would
    have ended at `shorter` tokens, with that end in its heap (None otherwise)."""
    count = len(lengths)
    heap = st["heap"]  # (step at which a response ends, step at which it started)
    t, step, queue, running = st["t"], st["step"], st["queue"], st["running"]
    start_sum, last_admit = st["start_sum"], st["last_admit"]
    forked, fork_at = None, math.inf
    admitted = 0
    fixed, per_token = sm.fixed.tolist(), sm.per_context_token  # StepModel.times, inlined for the loop's speed
    while heap or queue < count:
        while queue < count and running < slots:
            if queue == top:
                fork_at = step + shorter
            heapq.heappush(heap, (step + lengths[queue], step))
            start_sum += step
            queue += 1
            running += 1
            admitted += 1
        if admitted:
            t += prefill_each * admitted
            last_admit, admitted = t, 0
        if heap[0][0] >= fork_at:  # the shorter run's top ends next (or with others): fork it here
            start = fork_at - shorter
            fork_heap = list(heap)
            fork_heap[fork_heap.index((start + lengths[top], start))] = (fork_at, start)
            heapq.heapify(fork_heap)
            forked, fork_at = {"t": t, "step": step, "queue": queue, "running": running, "heap": fork_heap,
                               "start_sum": start_sum, "last_admit": last_admit}, math.inf
        end = heap[0][0]
        steps = end - step
        if steps > 0:  # context of the running set at the middle of the interval: prompts + tokens so far
            ctx = running * (prompt_len + step + steps / 2.0) - start_sum
            t += steps * (fixed[running] + per_token * ctx)
            step = end
        while heap and heap[0][0] <= step:
            _, started = heapq.heappop(heap)
            start_sum -= started
            running -= 1
    st.update(t=t, step=step, queue=queue, running=running, start_sum=start_sum, last_admit=last_admit)
    return forked


def _all_admitted(sm: StepModel, prompt_len: int, lengths: np.ndarray, prefill_each: float):
    """`_admitted_in_turn` when the slots hold every response (all admitted at step 0), in closed form: between
    consecutive distinct ends the running set is those not yet ended, at the interval's middle context."""
    ends, count = np.unique(lengths, return_counts=True)
    running = len(lengths) - np.cumsum(count) + count  # responses still running up to each end
    prev = np.concatenate(([0.0], ends[:-1]))
    steps = ends - prev
    ctx = running * (prompt_len + prev + steps / 2.0)
    admit = prefill_each * len(lengths)
    return admit + float(np.sum(steps * sm.times(running.astype(int), ctx))), admit


def _throughput_seconds(sm: StepModel, job: RLJob, lengths: np.ndarray, slots: int, prefill_each: float) -> float:
    """The same tokens emitted at the full admitted batch throughout (no tail): what a streamed rollout with partial
    rollouts (verl fully-async, slime --partial-rollout) pays per step in steady state."""
    steps = float(lengths.sum()) / slots
    ctx = slots * (job.prompt_len + job.response_len / 2.0)
    return steps * sm.time(slots, ctx) + prefill_each * len(lengths)
