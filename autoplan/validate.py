"""Megatron-LM's layout, batch and precision rules, checked before a strategy is estimated.

`validate` raises `InputError` with one line for the first rule a strategy breaks: the rule, the values and the
values that would work. Rules run in a fixed order and each may rely on the ones before it (e.g. the pipeline
rules run after the world size is known to tile). Sources, cited at each rule:
  [V]  validate_args, megatron/training/arguments.py
  [TC] TransformerConfig.__post_init__, megatron/core/transformer/transformer_config.py
  [PS] initialize_model_parallel, megatron/core/parallel_state.py
  [TB] get_num_layers_to_build, megatron/core/transformer/transformer_block.py
  [MB] megatron/core/num_microbatches_calculator.py
  [SC] forward_backward_pipelining_with_interleaving, megatron/core/pipeline_parallel/schedules.py
  [TL] divide() in ColumnParallelLinear / RowParallelLinear, megatron/core/tensor_parallel/layers.py
  [TM] _split_along_first_dim, megatron/core/tensor_parallel/mappings.py
  [TE] TransformerEngine's FP8 GEMM shape check (transformer_engine/pytorch/utils.py, assert_dim_for_fp8_exec)
  [MS] megatron/core/models/gpt/experimental_attention_variant_module_specs.py (core_v0.19.0)
Preferences that are not rules (TP or EP*ETP inside the NVLink domain) belong to the search, not here."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, List, Optional, Tuple

import numpy as np

from autoplan import cuda_graphs as G
from autoplan import deepspeed_rules as DS
from autoplan import layout_rules as LR
from autoplan import pipeline_split as PS
from autoplan import switch_rules as SR
from autoplan import valid_values as vv
from autoplan.cluster import ClusterSpec
from autoplan.errors import InputError
from autoplan.keys import ENGINES
from autoplan.model import ModelSpec
from autoplan.strategy import Strategy
from autoplan.workload import Workload

# GPUs of compute capability 10 (Blackwell): the only ones with MXFP8 tensor cores (TransformerEngine's
# MXFP8BlockScaling recipe needs sm100). Matched on the id's prefix, e.g. 'gb200-nvl72'.
BLACKWELL_GPU_IDS = ("b200", "b300", "gb200", "gb300")
FP8_GEMM_MULTIPLE = 16  # [TE] the inner (K) dimension of every FP8 GEMM
FP8_TOKEN_MULTIPLE = 8  # [TE] the token (M) dimension of every FP8 GEMM


@dataclass(frozen=True)
class Case:
    """One strategy on one model, cluster and workload: the inputs every rule reads."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    strategy: Strategy
    engine: str = "megatron"  # "deepspeed" skips the rules that only Megatron-LM's runtime imposes

    @property
    def world(self) -> int:
        return self.cluster.num_gpus

    @property
    def model_parallel(self) -> int:
        s = self.strategy
        return s.tp * s.pp * s.cp

    @property
    def dp(self) -> int:
        """Data-parallel degree; exact once `_world_tiles` has passed."""
        return self.world // self.model_parallel

    @cached_property
    def env(self) -> LR.Env:
        """What the rule book reads besides the strategy (autoplan/layout_rules.py)."""
        return LR.Env(self.model, self.world, self.workload.seq_len, self.workload.global_batch_size, self.engine)

    @cached_property
    def view(self):
        """The strategy as one candidate of the rule book (layout_rules.strategy_view)."""
        return LR.strategy_view(self.strategy, self.engine, self.world)

    def broken(self, rule: LR.Rule):
        """(broken, message) of a rule-book rule for `_first`."""
        return rule.broken(self.env, self.view), lambda: rule.message(self)

    @property
    def uneven(self) -> bool:
        return self.strategy.first_stage_layers is not None or self.strategy.last_stage_layers is not None


Rule = Callable[[Case], Optional[str]]


def has_dense_layers(model: ModelSpec) -> bool:
    """Whether any decoder layer has a dense MLP (same answer as num_dense_layers > 0, without a loop)."""
    m = model
    after_dense = m.num_layers - m.first_k_dense_layers
    return not m.is_moe or m.first_k_dense_layers > 0 or (m.moe_layer_freq > 1 and after_dense > 1)


def _first(checks) -> Optional[str]:
    """The first message among (broken, message-builder) pairs; builders run only when their rule is broken."""
    return next((build() for broken, build in checks if broken), None)


# ---- parallel sizes and world size -------------------------------------------------------------------------

def _degrees_fit_world(c: Case) -> Optional[str]:
    """No parallel degree can exceed the number of GPUs."""
    for name in ("tp", "pp", "cp", "ep", "etp"):
        value = getattr(c.strategy, name)
        if value > c.world:
            return (f"{name}={value} exceeds the {c.world} GPUs of the cluster; "
                    f"valid {name}: {vv.join(vv.divisors(c.world))}")
    return None


def _world_tiles(c: Case) -> Optional[str]:
    """[V][PS] WORLD_SIZE must be divisible by TP*PP*CP; DP is the quotient (EP is not in the product)."""
    return _first((c.broken(LR.WORLD_TILES),))


def _dp_matches(c: Case) -> Optional[str]:
    """dp is derived (world / (tp*pp*cp)); a given dp must agree with it."""
    s = c.strategy
    if s.dp is None or s.dp == c.dp:
        return None
    return (f"dp={s.dp} does not match world/(tp*pp*cp)={c.world}/{c.model_parallel}={c.dp}; "
            f"drop dp or use dp={c.dp}")


# ---- attention shape and tensor parallelism ----------------------------------------------------------------

def _attention_shape(c: Case) -> Optional[str]:
    """[V] MLA and GQA are mutually exclusive; hidden % heads == 0 when kv_channels is the implied default."""
    m = c.model
    implied_kv = m.kv_channels == m.hidden_size // m.num_attention_heads
    return _first((
        (m.multi_latent_attention and m.num_query_groups != m.num_attention_heads,
         lambda: f"multi_latent_attention cannot be combined with grouped-query attention "
                 f"(num_query_groups={m.num_query_groups}, num_attention_heads={m.num_attention_heads}); "
                 f"set num_query_groups={m.num_attention_heads} for an MLA model"),
        (not m.multi_latent_attention and implied_kv and m.hidden_size % m.num_attention_heads,
         lambda: f"hidden_size={m.hidden_size} must be divisible by num_attention_heads={m.num_attention_heads} "
                 f"when kv_channels={m.kv_channels} is the implied hidden_size/num_attention_heads; "
                 f"give the model's real kv_channels (head dim)"),
    ))


def _tensor_parallel_attention(c: Case) -> Optional[str]:
    """[TC] heads divisible by TP; query groups a multiple or a divisor of TP; the heads of Gated DeltaNet and of
    a parallel Mamba mixer divisible by TP (valid_values.mixer_allows_tp)."""
    return _first(c.broken(rule) for rule in (LR.TP_HEADS, LR.TP_GROUPS, LR.TP_MIXER))


def _tensor_parallel_mlp(c: Case) -> Optional[str]:
    """[TL] the MLP widths are split across TP (dense, shared experts) and ETP (routed experts) ranks."""
    m, s = c.model, c.strategy
    widths = (
        ("ffn_hidden_size", m.ffn_hidden_size, "tp", s.tp, has_dense_layers(m)),
        ("shared_expert_ffn_hidden_size", m.shared_expert_ffn_hidden_size, "tp", s.tp,
         m.shared_expert_ffn_hidden_size > 0),
        ("moe_ffn_hidden_size", m.moe_ffn_hidden_size, "etp", s.etp, m.is_moe),
    )
    for name, width, degree_name, degree, used in widths:
        if used and width % degree:
            return (f"{degree_name}={degree} must divide {name}={width}; "
                    f"valid {degree_name}: {vv.join(d for d in vv.divisors(width) if d <= c.world)}")
    return None


# ---- mixture of experts ------------------------------------------------------------------------------------

def _experts(c: Case) -> Optional[str]:
    """[V][TC] EP needs experts, num_experts % EP == 0; ETP only shards experts; [PS] ETP*EP*PP divides world."""
    m, s = c.model, c.strategy
    if not m.is_moe:
        return _first((
            (s.ep > 1, lambda: f"ep={s.ep} needs an MoE model; {m.name} is dense (num_experts=0), use ep=1"),
            (s.etp != 1, lambda: f"etp={s.etp} shards expert layers only; {m.name} is dense, use etp=1"),
        ))
    return _first((
        (m.num_experts % s.ep,
         lambda: f"ep={s.ep} must divide num_experts={m.num_experts}; "
                 f"valid ep: {vv.join(vv.valid_ep(m, c.world, s.etp, s.pp))}"),
        c.broken(LR.EXPERT_GRID),
    ))


def _moe_runtime(c: Case) -> Optional[str]:
    """[RT] MoE with TP > 1 needs SP in Megatron (megatron/core/transformer/moe/moe_layer.py; DeepSpeed's MoE has
    no such rule); [TC] biased MoE needs ETP 1;
    [TC] overlap_moe_expert_parallel_comm needs EP > 1, VPP when PP > 1, and no full recompute; the flex
    dispatcher deduplicates tokens across expert-parallel ranks, so it needs EP > 1 (token_dispatcher.py
    MoEFlexTokenDispatcher asserts TP x EP > 1)."""
    return _first((
        c.broken(LR.MOE_NEEDS_SP), c.broken(LR.BIASED_EXPERTS_ETP),
        SR.check(c, "moe_a2a_overlap", 0), SR.check(c, "moe_a2a_overlap", 1), SR.check(c, "moe_a2a_overlap", 2),
        SR.check(c, "moe_flex_dispatcher", 0),
    ))


# ---- layers, pipeline, virtual pipeline --------------------------------------------------------------------

def _split_methods(s: Strategy) -> List[str]:
    """The pipeline-split methods a strategy sets (autoplan/pipeline_split.py)."""
    return [name for name, on in (
        ("first_stage_layers/last_stage_layers", s.first_stage_layers is not None or s.last_stage_layers is not None),
        ("account_for_embedding/account_for_loss", s.account_for_embedding or s.account_for_loss),
        ("pipeline_layout", bool(s.pipeline_layout))) if on]


def _pipeline_split(c: Case) -> Optional[str]:
    """[V][TB] layers divisible by PP, unless the split is given another way; [TC] one split method at a time, and
    each method's rules: uneven first/last stages, account_for_* (num_layers + embedding + loss divisible by pp,
    then vpp), a layout string (pipeline_parallel_layer_layout.py; what the cost model prices: equal middle ranks)."""
    m, s = c.model, c.strategy
    layers = m.num_layers
    methods = _split_methods(s)
    if len(methods) > 1:
        return (f"{methods[0]} and {methods[1]} cannot be combined (Megatron takes one pipeline split, "
                f"transformer_config.py); keep one")
    if methods and s.pp == 1:
        return f"{methods[0]} need pp>1 (got pp=1); drop them or set pp>1"
    if methods and c.engine == "deepspeed" and not c.uneven:
        return (f"{methods[0]} is a Megatron-LM pipeline split; DeepSpeed partitions layers itself "
                f"(use engine megatron, or first_stage_layers/last_stage_layers)")
    if s.pipeline_layout:
        problem = PS.layout_problem(s.pipeline_layout, s.pp, s.vpp, layers, m.mtp_num_layers)
        problem = problem or PS.layout_pricing_problem(s.pipeline_layout, s.pp, s.vpp)
        return None if problem is None else problem + _bridge_fix(c)
    if s.account_for_embedding or s.account_for_loss:
        problem = PS.account_problem(layers, s.pp, s.vpp, *PS.account_units(s))
        return None if problem is None else problem + _bridge_fix(c)
    if c.uneven:
        problem = vv.uneven_split_problem(layers, s.pp, s.vpp, s.first_stage_layers, s.last_stage_layers)
        if problem is None:
            return None
        split = vv.layer_split_fix(layers, s.pp, s.vpp)
        return f"{problem} (num_layers={layers}, pp={s.pp}); " + (f"e.g. {split}" if split else _valid_pp(c))
    if not LR.EVEN_LAYERS.broken(c.env, c.view):
        return None
    split = vv.layer_split_fix(layers, s.pp, s.vpp)
    other = _bridge_keys(c, skip_first_last=True)
    return (f"num_layers={layers} must be divisible by pp={s.pp}; {_valid_pp(c)}" + (f", or {other}" if other else "")
            + (f", or {split}" if split else ""))


def _bridge_keys(c: Case, skip_first_last: bool = False) -> str:
    """The stage split Megatron-Bridge would use at this pp and vpp, as strategy keys ('' when none)."""
    found = PS.bridge_split(c.model, c.strategy.pp, c.strategy.vpp)
    if not found or (skip_first_last and "first_stage_layers" in found[0]):
        return ""
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in found[0].items())


def _bridge_fix(c: Case) -> str:
    keys = _bridge_keys(c)
    return f"; e.g. {keys}" if keys else ""


def _valid_pp(c: Case) -> str:
    return f"valid pp: {vv.join(vv.valid_pp(c.model.num_layers, c.world, c.strategy.tp, c.strategy.cp))}"


def _virtual_pipeline(c: Case) -> Optional[str]:
    """[V][PS] VPP needs PP > 1 (p2p overlap on; PP > 2 without it); [TB] even stages: layers per rank % VPP.
    The other splits' VPP rules are in `_pipeline_split`."""
    if c.strategy.vpp == 1:
        return None
    other_split = _split_methods(c.strategy)  # whose vpp rules `_pipeline_split` checks
    return _first((c.broken(LR.VPP_NEEDS_PP),) + (() if other_split else (c.broken(LR.VPP_DIVIDES_RANK),)))


def _dsa_index_share(c: Case) -> Optional[str]:
    """[MS] with DSA top-k shared between layers, every virtual pipeline stage starts on a layer that runs its own
    indexer (pipeline_split.dsa_share_problem). Megatron only: DeepSpeed does not build DSA."""
    s = c.strategy
    if c.engine != "megatron":
        return None
    problem = PS.strategy_dsa_share_problem(c.model, s)
    if problem is None:
        return None
    pairs = PS.dsa_share_splits(c.model, s.pp, s.vpp)
    fix = (f"e.g. first_stage_layers={pairs[0][0]}, last_stage_layers={pairs[0][1]}" if pairs else
           "give a pipeline_layout whose stages start on such layers, or another pp / vpp")
    return f"{problem}; {fix}"


# ---- sequence, sequence parallel, batch --------------------------------------------------------------------

def _sequence(c: Case) -> Optional[str]:
    """[V] seq_len <= max_position_embeddings; with CP > 1, a model whose mixers have a CP path
    (ModelSpec.context_parallel_blocker) and seq_len divisible by 2*CP."""
    m, seq = c.model, c.workload.seq_len
    return _first((
        (seq > m.max_position_embeddings,
         lambda: f"seq_len={seq} exceeds max_position_embeddings={m.max_position_embeddings} of {m.name}; "
                 f"use seq_len <= {m.max_position_embeddings}"),
        c.broken(LR.CP_MIXERS), c.broken(LR.CP_SEQ),
    ))


def _sequence_parallel(c: Case) -> Optional[str]:
    """[V] SP needs TP > 1 (Megatron drops it silently; we reject so the user knows); TP comm overlap needs SP;
    [TM] SP splits each rank's seq_len/cp tokens across the TP ranks."""
    return _first((c.broken(LR.SP_NEEDS_TP), SR.check(c, "tp_comm_overlap", 0), c.broken(LR.SP_SPLITS_SEQ)))


# The "valid mbs" a batch error lists stop at 2^20 sequences per rank: past that the list is no help, and its loop
# (valid_values.divisors, min(sqrt(n), bound) steps) stays short for a typo'd batch.
MBS_LISTED = 2**20


def _batch(c: Case) -> Optional[str]:
    """[V] mbs > 0; [MB] global batch divisible by mbs*dp (num_microbatches = gbs / (mbs*dp))."""
    s, gbs = c.strategy, c.workload.global_batch_size
    if s.mbs < 1:
        return f"mbs={s.mbs} must be >= 1"
    step = s.mbs * c.dp
    if not LR.BATCH_DIVIDES.broken(c.env, c.view):
        return None
    other_mbs = [v for v in vv.divisors(gbs // c.dp, upto=MBS_LISTED)] if gbs % c.dp == 0 else []
    mbs_fix = f"; or valid mbs for dp={c.dp}: {vv.join(other_mbs)}" if other_mbs else ""
    return (f"gbs={gbs} must be divisible by mbs*dp={s.mbs}*{c.dp}={step}; "
            f"valid gbs near {gbs}: {vv.join(vv.gbs_near(gbs, step))}{mbs_fix}")


def interleaved_schedule_problem(pp: int, vpp: int, num_microbatches: int) -> Optional[str]:
    """[SC] Why Megatron's interleaved 1F1B schedule refuses `num_microbatches` per pipeline, or None. The schedule
    runs the micro-batches in groups of microbatch_group_size_per_vp_stage (default pp, model_parallel_config.py
    __post_init__) and raises when that group exceeds the micro-batch count ("should range in [PP, M]") or when the
    last group is shorter than pp ("The remainder of M ... should be 0, or larger than or equal to the
    pipeline-parallel size"): the count must be a positive multiple of pp. Older releases raised on the same
    condition ("number of microbatches is not divisible by pipeline-model-parallel-size")."""
    if vpp <= 1 or pp <= 1 or (num_microbatches >= pp and num_microbatches % pp == 0):
        return None
    return (f"vpp={vpp} (Megatron's interleaved schedule) needs the micro-batches per pipeline "
            f"gbs/(mbs*dp) to be a multiple of pp={pp}, got {num_microbatches}")


def interleaving_blocked(pp, vpp, num_microbatches) -> np.ndarray:
    """Vectorised `interleaved_schedule_problem`: True where the interleaved schedule refuses the count."""
    pp, vpp, m = (np.asarray(x) for x in (pp, vpp, num_microbatches))
    return (vpp > 1) & (pp > 1) & ((m < pp) | (m % np.maximum(pp, 1) != 0))


def _interleaved_schedule(c: Case) -> Optional[str]:
    """[SC] interleaving needs a whole number of micro-batch groups of pp per pipeline (runs after `_batch`)."""
    s, gbs = c.strategy, c.workload.global_batch_size
    micro = gbs // (s.mbs * c.dp)
    problem = interleaved_schedule_problem(s.pp, s.vpp, micro)
    if problem is None:
        return None
    group = s.pp * c.dp
    mbs_ok = [b for b in vv.divisors(gbs, upto=16) if gbs % (b * group) == 0]
    fixes = ["use vpp=1", f"a gbs that is a multiple of mbs*dp*pp={s.mbs * group}"
             f" (e.g. {vv.join(vv.gbs_near(gbs, s.mbs * group))})"]
    if mbs_ok:
        fixes.append(f"mbs {vv.join(mbs_ok)}")
    return f"{problem}; " + ", or ".join(fixes)


# ---- optimizer sharding and overlap ------------------------------------------------------------------------

def _optimizer(c: Case) -> Optional[str]:
    """zero in 0..3; ZeRO-3/FSDP cannot combine with PP ([V] torch FSDP2 rejects PP > 1; DeepSpeed
    runtime/pipe/engine.py asserts ZeRO stage < 2); [V] overlap_param_gather needs the distributed optimizer and
    overlap_grad_reduce. The overlap switches default to on and then apply only where possible, so only an
    explicitly requested overlap_param_gather is held to its rule. [V] --fp8-param-gather needs the distributed
    optimizer (or FSDP) and [TC] fp8; [TC] CPU offloading needs pp = 1 and fewer layers than the model has
    (transformer_config.py)."""
    s = c.strategy
    asked = "overlap_param_gather" in s.model_fields_set and s.overlap_param_gather
    return _first((
        (not 0 <= s.zero <= 3, lambda: f"zero={s.zero} must be 0, 1, 2 or 3"),
        c.broken(LR.ZERO3_NO_PP),
        SR.check(c, "overlap_param_gather", 0, on=asked), SR.check(c, "fp8_param", 0),
        SR.check(c, "cpu_offload_layers", 0), SR.check(c, "cpu_offload_layers", 1),
        SR.check(c, "overlap_param_gather", 1, on=asked),
        # Megatron's precision-aware optimizer is TE FusedAdam behind the distributed optimizer
        # (megatron/core/optimizer/__init__.py); Megatron-Bridge turns it off under Megatron-FSDP
        # (scripts/performance/utils/overrides.py `_set_megatron_fsdp_overrides`); DeepSpeed has no such switch.
        SR.check(c, "adam_bf16_states", 0),
        SR.check(c, "bf16_master_weights", 0),
        SR.check(c, "bf16_master_weights", 1),
        # megatron/core/transformer/moe/experts.py: the fused weighted squared ReLU is a Megatron MoE kernel.
        SR.check(c, "fused_weighted_squared_relu", 0),
        # TransformerEngine's op fuser, which DeepSpeed has none of (autoplan/keys.py `deepspeed_lacks`).
        c.broken(DS.NO_OP_FUSER),
    ))


# ---- precision ---------------------------------------------------------------------------------------------

def is_blackwell(gpu_id: str) -> bool:
    """Whether a GPU id names a Blackwell part (compute capability 10)."""
    return gpu_id.lower().startswith(BLACKWELL_GPU_IDS)


def fp8_gemm_dims(model: ModelSpec, strategy: Strategy) -> List[Tuple[str, int]]:
    """[TE] the per-rank inner GEMM dimensions that FP8 needs to be multiples of 16, with readable names."""
    m, s = model, strategy
    head_dim = m.v_head_dim if m.multi_latent_attention else m.kv_channels
    dims = [("hidden_size", m.hidden_size),
            (f"attention width heads*head_dim/tp={m.num_attention_heads}*{head_dim}/{s.tp}",
             m.num_attention_heads * head_dim // s.tp)]
    if has_dense_layers(m):
        dims.append((f"ffn_hidden_size/tp={m.ffn_hidden_size}/{s.tp}", m.ffn_hidden_size // s.tp))
    if m.shared_expert_ffn_hidden_size:
        dims.append((f"shared_expert_ffn_hidden_size/tp={m.shared_expert_ffn_hidden_size}/{s.tp}",
                     m.shared_expert_ffn_hidden_size // s.tp))
    if m.is_moe:
        dims.append((f"moe_ffn_hidden_size/etp={m.moe_ffn_hidden_size}/{s.etp}", m.moe_ffn_hidden_size // s.etp))
    return dims


def _fp8(c: Case) -> Optional[str]:
    """[RT] FP8 needs FP8 tensor cores; MXFP8 needs Blackwell; [TE] FP8 GEMM shapes (inner dims % 16,
    tokens % 8). None of this is checked by validate_args: it fails only once the job runs."""
    s, gpu = c.strategy, c.cluster.gpu
    if not s.uses_fp8:
        return None
    if not gpu.has_dtype("fp8"):
        return f"fp8={s.fp8} needs a GPU with FP8 tensor cores; {gpu.id} has none, use fp8=none"
    if s.fp8_recipe in ("mxfp8", "nvfp4") and not is_blackwell(gpu.id):
        return (f"fp8_recipe={s.fp8_recipe} needs a Blackwell GPU ({', '.join(BLACKWELL_GPU_IDS)}); "
                f"on {gpu.id} use fp8_recipe=delayed, tensorwise or blockwise")
    for name, dim in fp8_gemm_dims(c.model, s):
        if dim % FP8_GEMM_MULTIPLE:
            return (f"fp8 needs GEMM dimensions divisible by {FP8_GEMM_MULTIPLE}, but {name}={dim} is not; "
                    f"change tp/etp or use fp8=none")
    tokens = s.mbs * c.workload.seq_len // s.cp
    if tokens % FP8_TOKEN_MULTIPLE:
        return (f"fp8 needs tokens per GEMM mbs*seq_len/cp={s.mbs}*{c.workload.seq_len}/{s.cp}={tokens} divisible "
                f"by {FP8_TOKEN_MULTIPLE}; change mbs or seq_len, or use fp8=none")
    return None


# ---- activation recompute ----------------------------------------------------------------------------------

def recompute_layer_limit(model: ModelSpec, strategy: Strategy) -> int:
    """The largest recompute_layers Megatron accepts: layers per pipeline rank, per model chunk for the block
    method with vpp > 1 (the most any rank holds when the first/last stages are sized explicitly)."""
    s = strategy
    per_rank = max(PS.rank_layer_counts(s, model.num_layers))
    return per_rank // s.vpp if s.recompute_method == "block" and s.vpp > 1 else per_rank


def _recompute(c: Case) -> Optional[str]:
    """[V][TC] selective takes no method and no layer count; full needs a method and 1 <= layers <= limit."""
    s = c.strategy
    if s.recompute == "selective":
        return _first((
            (s.recompute_method is not None,
             lambda: f"recompute=selective takes no recompute_method (got {s.recompute_method}); drop it"),
            (s.recompute_layers is not None,
             lambda: f"recompute=selective takes no recompute_layers (got {s.recompute_layers}); drop it"),
        ))
    if s.recompute != "full":
        return None
    if s.recompute_method is None:
        return "recompute=full needs recompute_method=uniform or block"
    limit = recompute_layer_limit(c.model, s)
    unit = "layers per model chunk" if s.recompute_method == "block" and s.vpp > 1 else "layers per pipeline rank"
    if s.recompute_layers is None or not 1 <= s.recompute_layers <= limit:
        return f"recompute_layers={s.recompute_layers} must be between 1 and {limit} ({unit}) for recompute=full"
    return None


def effective_fp8_recipe(fp8_recipe: Optional[str], gpu_id: str) -> str:
    """The FP8 recipe a run uses: the given one, else the emitted default (MXFP8 on Blackwell, delayed before)."""
    return fp8_recipe or ("mxfp8" if is_blackwell(gpu_id) else "delayed")


def _recompute_modules(c: Case) -> Optional[str]:
    """[TC] Megatron's selective-recompute module rules (transformer_config.py `recompute_modules` checks):
    mla_up_proj needs MLA; moe_act (grouped GEMM), moe and shared_experts need an MoE model (shared experts for
    the last); moe_act/layernorm recompute do not support FP8 delayed scaling; the 1F1B all-to-all overlap
    excludes "moe" (it re-runs the dispatch)."""
    m, s = c.model, c.strategy
    mods = s.recompute_modules or ()
    if not mods:
        return None
    return _first((
        ("mla_up_proj" in mods and not m.multi_latent_attention,
         lambda: f"recompute module mla_up_proj needs multi-latent attention ({m.name} has none); drop it"),
        (any(n in mods for n in ("moe_act", "moe", "shared_experts")) and not m.is_moe,
         lambda: f"recompute modules moe_act/moe/shared_experts need an MoE model ({m.name} is dense); "
                 f"use core_attn, layernorm or mlp"),
        ("shared_experts" in mods and not m.shared_expert_ffn_hidden_size,
         lambda: f"recompute module shared_experts needs shared experts ({m.name} has none); drop it"),
        (s.uses_fp8 and effective_fp8_recipe(s.fp8_recipe, c.cluster.gpu.id) == "delayed"
         and ("moe_act" in mods or "layernorm" in mods),
         lambda: "recompute modules moe_act/layernorm do not support fp8_recipe=delayed; "
                 "use fp8_recipe=tensorwise/blockwise/mxfp8 or drop those modules"),
        (s.moe_a2a_overlap and "moe" in mods,
         lambda: "recompute module moe cannot be combined with moe_a2a_overlap=true; "
                 "drop moe (moe_act recomputes the expert activation only) or set moe_a2a_overlap=false"),
        (c.engine == "deepspeed",
         lambda: "recompute_modules is a Megatron-LM feature; DeepSpeed checkpoints whole layers "
                 "(use recompute=full, or engine megatron)"),
    ))


def _cuda_graphs(c: Case) -> Optional[str]:
    """[TC]/[V] Megatron's CUDA-graph rules (transformer_config.py `__post_init__` and arguments.py
    `validate_args` at the verified commit): moe/moe_router need an MoE model, mlp a dense layer; moe needs
    drop-and-pad MoE (autoplan prices dropless routing only); moe and moe_router exclude each other; moe_preprocess
    needs moe_router; mamba needs Mamba layers. The rules that read the rest of the strategy are written once in
    autoplan/switch_rules.py (the search applies the same ones to its candidates), after the DeepSpeed rule of the
    registry's `deepspeed_lacks` (autoplan/deepspeed_rules.py: the emitted DeepSpeed configs capture no CUDA graph of
    the training step): full recompute needs the full-iteration graph; no CPU
    offloading (transformer_config.py: refused under every impl at megatron-core 0.16.1 and under the per-layer
    impls at the verified Megatron-LM commit); the 1F1B all-to-all overlap excludes capturing the moe/mlp halves;
    "moe recompute is not supported with moe_router CUDA graph"; with hidden dropout a captured MLP / MoE half
    cannot be recomputed in its graph."""
    m, s = c.model, c.strategy
    mods = s.cuda_graph_modules or ()
    if not mods:
        return None
    has_dense = m.layer_count("-") > 0 if m.is_hybrid else m.num_dense_layers > 0
    return _first((
        c.broken(DS.NO_GRAPHS),
        (any(n in mods for n in ("moe", "moe_router")) and not m.is_moe,
         lambda: f"cuda_graph_modules moe/moe_router need an MoE model ({m.name} is dense); use attn and mlp"),
        ("mlp" in mods and not has_dense,
         lambda: f"cuda_graph_modules mlp needs dense MLP layers ({m.name} has none); use moe_router"),
        ("moe" in mods,
         lambda: "cuda_graph_modules moe captures the whole MoE block and needs drop-and-pad routing "
                 "(--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity), which autoplan does not "
                 "price; use moe_router+moe_preprocess"),
        ("moe_preprocess" in mods and "moe_router" not in mods,
         lambda: "cuda_graph_modules moe_preprocess needs moe_router; add moe_router"),
        ("mamba" in mods and not (m.is_hybrid and m.layer_count("M")),
         lambda: f"cuda_graph_modules mamba needs Mamba layers ({m.name} has none); drop it"),
    ) + tuple(SR.check(c, "cuda_graph_modules", i) for i in range(len(SR.BY_KEY["cuda_graph_modules"]))))


def module_set_problem(model: ModelSpec, cluster: ClusterSpec, workload: Workload, key: str, value,
                       engine: str = "megatron", others: Optional[dict] = None) -> Optional[str]:
    """The rule a fixed module set (`recompute_modules` or `cuda_graph_modules`) breaks before any layout is chosen,
    on its own (e.g. mla_up_proj without MLA, moe_router on a dense model) or with the other fixed switches in
    `others` (e.g. a captured MLP with the all-to-all overlap), or None."""
    from autoplan.strategy import strategy_from_mapping

    fields = {"recompute": "selective", "recompute_modules": value} if key == "recompute_modules" else \
        {**(others or {}), "cuda_graph_modules": value}
    try:
        probe = strategy_from_mapping(fields)
    except InputError as e:  # an unknown name: the field's own one-line message
        return str(e)
    rule = _recompute_modules if key == "recompute_modules" else _cuda_graphs
    return rule(Case(model, cluster, workload, probe, engine))


RULES: Tuple[Rule, ...] = (
    _degrees_fit_world, _world_tiles, _dp_matches,
    _attention_shape, _tensor_parallel_attention, _tensor_parallel_mlp,
    _experts, _moe_runtime,
    _pipeline_split, _virtual_pipeline, _dsa_index_share,
    _sequence, _sequence_parallel, _batch, _interleaved_schedule,
    _optimizer, _fp8, _recompute, _recompute_modules, _cuda_graphs,
)


def first_broken_rule(model: ModelSpec, cluster: ClusterSpec, workload: Workload, strategy: Strategy, *,
                      engine: str = "megatron") -> Optional[str]:
    """The one-line message of the first rule `strategy` breaks, or None when it breaks none."""
    if engine not in ENGINES:
        raise InputError(f"engine {engine!r} is not supported; use one of: {', '.join(ENGINES)}")
    case = Case(model, cluster, workload, strategy, engine)
    return next((msg for msg in (rule(case) for rule in RULES) if msg), None)


def validate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, strategy: Strategy, *,
             engine: str = "megatron") -> Strategy:
    """`strategy` with dp filled in (world // (tp*pp*cp)); InputError naming the first broken rule otherwise.
    The rules are Megatron-LM's; engine="deepspeed" drops the one Megatron's runtime alone imposes (MoE with
    tp > 1 needs sp). What DeepSpeed cannot express at all is `autoplan.integrations.engines`' concern."""
    message = first_broken_rule(model, cluster, workload, strategy, engine=engine)
    if message:
        raise InputError(message)
    return strategy.model_copy(update={"dp": cluster.num_gpus // (strategy.tp * strategy.pp * strategy.cp)})
