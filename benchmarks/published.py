"""Published training runs (`data/published_runs.csv`) turned into cost-model inputs.

Each usable row becomes a `PublishedRun`: the run's own model (ModelSpec built from the row's dimensions, with
the fields the table does not carry completed from the catalogue entry of the same public config), the cluster
(`autoplan.clusterio.load_cluster`), the strategy the run used and its workload, plus the measured
tokens/s/GPU.

Strategy assumptions (the tables give tp/pp/vpp/cp/ep/mbs/gbs only; the rest lives in each release's recipes):
- sp = (tp > 1): NeMo / Megatron-Bridge performance recipes set `sequence_parallel=True` whenever TP > 1
  (Megatron-Bridge `scripts/performance` configs; NeMo 2.0 `nemo/collections/llm/recipes/*` perf recipes).
- zero = 1 (Megatron distributed optimizer): the recipes set `use_distributed_optimizer=True`; the table's
  "FSDP=0" column confirms DDP + distributed optimizer. Rows whose FSDP column is `fsdp(shard_group=N)` use
  Megatron-FSDP, i.e. parameters, gradients and optimizer sharded: modelled as zero = 3.
- overlap_grad_reduce and overlap_param_gather on (recipe defaults with the distributed optimizer).
- tp_comm_overlap = (tp > 1): perf recipes enable TransformerEngine userbuffers TP overlap for TP > 1
  (`tp_comm_overlap=True` in the NeMo/Bridge perf configs).
- moe_a2a_overlap only for DeepSeek-V3: its perf recipe enables the 1F1B all-to-all overlap
  (`overlap_moe_expert_parallel_comm`); the other MoE recipes do not.
- moe_flex_dispatcher for the Megatron-Bridge DeepSeek-V3 rows with ep > 1 (HybridEP / DeepEP in every tag,
  `benchmarks/recipes.py`); the NeMo rows and the other MoE families run the alltoall dispatcher.
- etp = 1 when blank (the MoE recipes use expert tensor parallel size 1 unless the table prints it).
- vpp blank or 1 = no interleaving; mbs blank = 1 (NeMo long-sequence page does not state it).
- fp8: the precision column; the recipe comes from the notes (MXFP8 1x32 on Blackwell, per-tensor current
  scaling "FP8-CS" and TE delayed scaling on H100). A blank precision (the 25.09 release) means FP8 per the
  data README: MXFP8 on Blackwell, blockwise for DeepSeek-V3 on H100, tensorwise otherwise.
- Everything else a Megatron-Bridge row ran with comes from `recipe_facts` below, read from that release's
  performance configs (see RELEASE_TAG): recompute, CPU activation offload, the MoE all-to-all overlap, FP8
  primary weights and the bf16 gradient reduction. The NeMo 24.03/24.07 rows keep the old assumptions (recompute:
  the least that fits; fp32 gradient reduction).
- Recompute policy (`--recompute`): "recipe" (default) = the recipe's recompute, escalated to the next heavier
  kind only when autoplan predicts it does not fit (`PublishedRun.escalated` names those rows); "least" = the
  least recompute that fits (none, selective, full); "none" = no recompute.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from autoplan import recompute as R
from autoplan.cluster import ClusterSpec
from autoplan.clusterio import load_cluster, load_gpu
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.flops import model_flops_per_token
from autoplan.model import ModelSpec
from autoplan.modelio import load_model
from autoplan.pipeline_split import bridge_split
from autoplan.results import Estimate
from autoplan.strategy import SPLIT_KEYS, Strategy
from autoplan.workload import Workload
from benchmarks.recipes import RELEASE_TAG, RecipeFacts, recipe_facts, release_of

DATA = Path(__file__).resolve().parent.parent / "data" / "published_runs.csv"
MODELS = Path(__file__).resolve().parent / "models"

GPU_IDS = {"H100-SXM-80GB": "h100", "B200": "b200", "B300": "b300", "GB200": "gb200", "GB300": "gb300"}
BLACKWELL = {"b200", "b300", "gb200", "gb300"}

# The catalogue entry holding the same public config as the run's model; it completes the fields the table does
# not carry (MLA dims, shared experts, first_k_dense, sliding window, biases, norms, kv_channels).
CATALOGUE = {
    "DeepSeekV3": "deepseek-v3", "GPT OSS 120B": "gpt-oss-120b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "LLAMA3.1_405B": "llama3.1-405b", "LLAMA3_70B": "llama3-70b", "LLAMA3-70B": "llama3-70b",
    "LLAMA3_8B": "llama3-8b", "LLAMA3-8B": "llama3-8b", "LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b",
    "GPT3-5B": "gpt3-5b", "GPT3-20B": "gpt3-20b", "GPT3-175B": "gpt3-175b",
    "Nemotron-8B": "nemotron3-8b", "Nemotron-22B": "nemotron3-22b", "Nemotron-340B": "nemotron-4-340b",
    # Mamba / attention hybrids: model files kept with the benchmark (benchmarks/models, sources inside).
    "Nemotron_3_Nano": str(MODELS / "nemotron-3-nano.yaml"), "Nemotron_3_Super": str(MODELS / "nemotron-3-super.yaml"),
    "Nemotron_3_5_Lightning": str(MODELS / "nemotron-3.5-lightning.yaml"),
}
# CSV column -> ModelSpec field.
DIM_COLUMNS = {
    "num_layers": "num_layers", "hidden": "hidden_size", "ffn_hidden": "ffn_hidden_size",
    "heads": "num_attention_heads", "kv_heads": "num_query_groups", "vocab": "vocab_size",
    "num_experts": "num_experts", "topk": "moe_router_topk", "moe_ffn_hidden": "moe_ffn_hidden_size",
}
# NeMo 24.07 H100 FP8 runs reduce gradients in bf16 with the distributed fused Adam: NVIDIA/NeMo-Framework-Launcher
# examples/training/gpt/h100/20b_fp8_1node.sh and llama/h100/llama2_13b_fp8.sh pass
# `+training.model.optim.grad_sync_dtype=bf16`.
NEMO_BF16_GRADS = "nemo2407_"
GIB = 2**30


@dataclass(frozen=True)
class PublishedRun:
    """One usable published measurement and the cost-model inputs that reproduce it."""

    id: str
    model: ModelSpec
    cluster: ClusterSpec
    strategy: Strategy  # recompute already chosen
    workload: Workload
    measured_tokens_per_gpu: float
    metric: str  # the CSV metric the figure came from (tflops rows converted with the model-FLOPs formula)
    model_name: str  # as the CSV spells it
    gpu: str  # profile id
    precision: str  # bf16 | fp8
    arch: str  # dense | moe
    dims_from_catalogue: Tuple[str, ...] = field(default_factory=tuple)  # fields not in the row
    facts: Optional[RecipeFacts] = None  # Megatron-Bridge recipe settings (None for the NeMo rows)
    escalated: bool = False  # the recipe's recompute was predicted not to fit; a heavier one is used

    @property
    def setup(self) -> Tuple:
        """Rows of one configuration measured in several releases share this key (used by the hold-out split)."""
        s = self.strategy
        return (self.model_name, self.gpu, self.cluster.num_gpus, self.precision, s.tp, s.pp, s.vpp, s.cp, s.ep,
                s.mbs, self.workload.global_batch_size, self.workload.seq_len)

    @property
    def subset(self) -> str:
        return f"{self.arch}/{self.gpu}/{self.precision}"


def read_rows(path: Path = DATA) -> List[Dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def stem(row_id: str) -> str:
    for suffix in ("_tok", "_tflops"):
        if row_id.endswith(suffix):
            return row_id[: -len(suffix)]
    return row_id


# Rows the source itself flags as a known software regression (Megatron-Bridge 26.06.01 GPT-OSS footnote): left
# out by `load_runs`; `headline_runs` prices and counts them, but no constant or naive bar is fitted on them.
FOOTNOTE = "26.06.01 GPT-OSS rows carry the page's known-regression footnote"


def exclusion_reason(row: Dict[str, str]) -> Optional[str]:
    """Why a row is not used, or None. Order matters only for the reason printed."""
    notes, model = row["notes"], row["model"]
    if model.startswith("DeepSeekV4"):
        return "DeepSeek-V4 architecture not public in the row (dims blank)"
    if "task=SFT" in notes or "task=LoRA" in notes:
        return "fine-tuning task (SFT/LoRA): packed/short sequences and frozen weights, not pre-training"
    if row["id"].startswith("mb_26.06.01_") and model.startswith("GPT OSS"):
        return FOOTNOTE
    if model not in CATALOGUE:
        return f"no public config for {model!r} to complete the missing dims"
    if row["gpu"] not in GPU_IDS:
        return f"GPU {row['gpu']!r} has no profile"
    return None


# A run this much slower per GPU than the same job on a GPU it dominates is a software regression, not hardware.
REGRESSION_MARGIN = 0.10


def _gpu_figures(gpu_id: str) -> Tuple[float, ...]:
    g = load_gpu(gpu_id)
    network = g.nic_gbit_per_s * g.nics_per_node / g.gpus_per_node
    return (g.peak_tflops.get("bf16", 0.0), g.peak_tflops.get("fp8", 0.0), g.hbm_gib, g.hbm_bandwidth_tbps,
            g.nvlink_bandwidth_gbytes_per_s, g.nvlink_domain_size, network)


def dominates(gpu: str, other: str) -> bool:
    """Every figure of `gpu`'s profile (peaks, HBM size and bandwidth, NVLink, domain, network per GPU) is at
    least `other`'s, and they differ (B300 over B200, GB300 over GB200, H200 over H100)."""
    return gpu != other and all(a >= b for a, b in zip(_gpu_figures(gpu), _gpu_figures(other)))


def slower_than_a_weaker_gpu(rows: List[Dict[str, str]]) -> Dict[str, str]:
    """{run stem: reason} for tokens rows measured more than REGRESSION_MARGIN below the same job (model, GPU
    count, precision, batch, sequence, same recipe tag) on a GPU that the row's GPU dominates: no cost model of
    the hardware can explain a stronger GPU running slower; the software or its config regressed. The rule needs
    no prediction."""
    def job(r):
        release = release_of(r["id"])
        tag = RELEASE_TAG.get(release, release) if release else r["source"]
        return (tag, r["model"], r["num_gpus"], r["precision"], r["gbs"], r["seq_len"])

    usable = [r for r in rows if r["measured_metric_name"] == "tokens_per_sec_per_gpu" and r["gpu"] in GPU_IDS
              and exclusion_reason(r) is None]
    out = {}
    for r in usable:
        for o in usable:
            if job(o) == job(r) and dominates(GPU_IDS[r["gpu"]], GPU_IDS[o["gpu"]]) and \
                    float(r["measured_value"]) < (1 - REGRESSION_MARGIN) * float(o["measured_value"]):
                out[stem(r["id"])] = (f"measured below the same job on a weaker GPU ({r['gpu']} "
                                      f"{float(r['measured_value']):.0f} < {o['gpu']} "
                                      f"{float(o['measured_value']):.0f} tokens/s/GPU): a software regression")
    return out


def _int(cell: str, default: Optional[int] = None) -> Optional[int]:
    cell = cell.strip()
    return int(float(cell)) if cell else default


# The source's DeepSeek-V3 tables mark runs "(w/o MTP)" and "(w/ MTP)"; the catalogue model carries the public
# config's one MTP depth (costmodel/layers/mtp.py prices it), which the "(w/o MTP)" runs leave out.
NO_MTP = "(w/o MTP)"


def build_model(row: Dict[str, str]) -> Tuple[ModelSpec, Tuple[str, ...]]:
    """The run's model: the row's dims over the catalogue entry of the same public config."""
    base = load_model(CATALOGUE[row["model"]])
    updates, missing = {}, []
    for column, name in DIM_COLUMNS.items():
        value = _int(row[column])
        if value is None:
            if getattr(base, name):
                missing.append(name)
            continue
        updates[name] = value
    data = {**base.model_dump(), **updates, "name": row["model"]}
    if NO_MTP in row.get("notes", ""):
        data["mtp_num_layers"] = 0  # the run states it trains without the catalogue model's MTP depth
    return ModelSpec.model_validate(data), tuple(missing)


def fp8_setting(row: Dict[str, str], gpu: str) -> Tuple[str, Optional[str]]:
    """(fp8, fp8_recipe) from the precision column and the notes."""
    precision, notes = row["precision"], row["notes"]
    if precision == "bf16":
        return "none", None
    if precision == "nvfp4":  # Megatron-Bridge bf16_with_nvfp4_mixed: --fp4-format e2m1 --fp4-recipe nvfp4
        return "hybrid", "nvfp4"
    if "MXFP8" in notes:
        return "hybrid", "mxfp8"
    if "FP8-CS" in notes:
        return "hybrid", "tensorwise"
    if "delayed scaling" in notes:
        return "hybrid", "delayed"
    if gpu in BLACKWELL:
        return "hybrid", "mxfp8"
    return "hybrid", "blockwise" if row["model"].startswith("DeepSeek") else "tensorwise"


def base_strategy(row: Dict[str, str], model: ModelSpec, gpu: str,
                  facts: Optional[RecipeFacts] = None) -> Strategy:
    layout = dict(facts.layout) if facts else {}  # the release's config where the table prints another
    tp, pp, cp = _int(row["tp"], 1), layout.get("pp", _int(row["pp"], 1)), _int(row["cp"], 1)
    fp8, recipe = fp8_setting(row, gpu)
    fsdp = row["zero_or_distopt"].startswith("fsdp")
    a2a = facts.moe_a2a_overlap if facts else row["model"].startswith("DeepSeekV3")
    account = bool(facts and facts.account_for_split and pp > 1 and not facts.pipeline_layout)
    strategy = Strategy(
        tp=tp, pp=pp, vpp=layout.get("vpp", _int(row["vpp"], 1) or 1), cp=cp,
        ep=_int(row["ep"], 1) if model.is_moe else 1, etp=_int(row["etp"], 1) if model.is_moe else 1,
        mbs=layout.get("mbs", _int(row["mbs"], 1)), sp=tp > 1, zero=3 if fsdp else 1, fp8=fp8, fp8_recipe=recipe,
        tp_comm_overlap=tp > 1, moe_a2a_overlap=a2a and model.is_moe,
        grad_reduce_bf16=bool(facts.grad_reduce_bf16) if facts else row["id"].startswith(NEMO_BF16_GRADS),
        fp8_param=bool(facts and facts.fp8_param and fp8 != "none" and recipe != "nvfp4"),  # bf16 weights kept
        cpu_offload_layers=facts.cpu_offload_layers if facts and pp == 1 else 0,
        moe_flex_dispatcher=bool(facts and facts.moe_flex_dispatcher and model.is_moe and _int(row["ep"], 1) > 1),
        te_cross_entropy=bool(facts and facts.te_cross_entropy),
        expandable_segments=bool(facts and facts.expandable_segments),
        adam_bf16_states=bool(facts and facts.adam_bf16_states and not fsdp),  # Bridge drops it under FSDP
        pipeline_layout=facts.pipeline_layout if facts and pp > 1 else None,
        account_for_embedding=account, account_for_loss=account,
        fused_weighted_squared_relu=bool(facts and facts.fused_weighted_squared_relu and model.is_moe
                                         and not model.gated_mlp),
        cuda_graph_modules=(facts.cuda_graph_modules or None) if facts else None,
        te_op_fuser=bool(facts and facts.te_op_fuser),
    )
    return with_unstated_split(strategy, model)


def with_unstated_split(s: Strategy, model: ModelSpec) -> Strategy:
    """`s` with the stage split autoplan's own planner gives (pipeline_split.bridge_split, as `estimate` does for a
    user's pp) where the row and its recipe state none and the layers do not divide the pipeline stages: Megatron
    cannot run such a split evenly, so the run used some uneven split that no config this project can read states
    (the DeepSeek-V3 25.11 rows without MTP: 61 layers over pp 8 x vpp 4 and pp 2 x vpp 4)."""
    if any(getattr(s, key) for key in SPLIT_KEYS):
        return s
    split = bridge_split(model, s.pp, s.vpp)  # None for pp 1 and for layers that divide the stages
    return s.model_copy(update=split[0]) if split else s


def with_recompute(s: Strategy, recompute: str, layers: Optional[int] = None, modules: str = "") -> Strategy:
    """`s` with `recompute`; full with `layers` uses the block method; selective with `modules` ('/'-separated
    Megatron module names) recomputes exactly those."""
    fields = {**s.model_dump(exclude={"recompute_method", "recompute_layers", "recompute_modules"}),
              "recompute": recompute}
    if recompute == "full" and layers:
        fields.update(recompute_method="block", recompute_layers=layers)
    if recompute == "selective" and modules:
        fields.update(recompute_modules=tuple(modules.split("/")))
    return Strategy(**fields)


def least_recompute(model: ModelSpec, cluster: ClusterSpec, s: Strategy, wl: Workload,
                    cal: Calibration = DEFAULT) -> Tuple[Strategy, Estimate]:
    """The first setting that fits among the search's own recompute options, in its order: none,
    selective with each module set of `autoplan.recompute.ladder`, full block n (ascending), full uniform."""
    ladder = [("none", None, "")] + [("selective", None, "/".join(mods))
                                     for mods in R.ladder(model.is_moe, model.multi_latent_attention)]
    for name, layers, modules in ladder + full_recompute_steps(model, s):
        candidate = with_recompute(s, name, layers, modules)
        est = estimate(model, cluster, candidate, wl, cal=cal)
        if est.fits:
            return candidate, est
    return candidate, est


def escalation(model: ModelSpec, s: Strategy, start: str, layers: Optional[int], modules: str):
    """(recompute, layers, modules) settings from the recipe's (or none) to full uniform, in increasing recompute:
    the start, selective with the start's modules plus the norms, plus the whole MLP / MoE blocks, full
    recompute of the first n layers of each chunk (n = 1, 2, 4, ...), every layer."""
    out = [(start, layers, modules)]
    base = [m for m in modules.split("/") if m] or (["core_attn"] if start != "full" else [])
    if start != "full":
        block = "moe" if model.is_moe else "mlp"
        for extra in (["layernorm"], ["layernorm", block] + (["mlp"] if model.is_moe else [])):
            mods = "/".join(dict.fromkeys(base + extra))
            if ("selective", None, mods) not in out:
                out.append(("selective", None, mods))
    return out + full_recompute_steps(model, s)


def full_recompute_steps(model: ModelSpec, s: Strategy):
    """Full recompute of the first n layers of each chunk (n = 1, 2, 4, ... below the chunk size), then of every
    layer, as (recompute, layers, modules) settings."""
    chunk = max(model.num_layers // (s.pp * s.vpp), 1)
    steps, n = [], 1
    while n < chunk:
        steps.append(("full", n, ""))
        n *= 2
    return steps + [("full", None, "")]


def choose_recompute(model: ModelSpec, cluster: ClusterSpec, s: Strategy, wl: Workload, facts, policy: str,
                     cal: Calibration = DEFAULT) -> Tuple[Strategy, bool]:
    """(strategy with recompute, escalated). Policy "recipe" starts from the recipe's
    recompute (NeMo rows: from none) and moves along `escalation` only while the run is predicted not to fit;
    "least" starts from none; "none" never recomputes; "written" runs the recipe's recompute as it is, fitting or
    not (benchmarks/recipes_fit.py)."""
    if policy == "none":
        return with_recompute(s, "none"), False
    written = (facts.recompute, facts.recompute_layers, facts.recompute_modules) if facts else ("none", None, "")
    if policy == "written":
        return with_recompute(s, *written), False
    recipe = policy == "recipe" and facts is not None
    start = written if recipe else ("none", None, "")
    for k, (name, layers, modules) in enumerate(escalation(model, s, *start)):
        candidate = with_recompute(s, name, layers, modules)
        if estimate(model, cluster, candidate, wl, cal=cal).fits:
            break
    return candidate, recipe and k > 0


def measured_tokens_per_gpu(row: Dict[str, str], model: ModelSpec) -> float:
    """tokens/s/GPU as published, or converted from model TFLOP/s/GPU with Megatron's model-FLOPs formula."""
    value = float(row["measured_value"])
    if row["measured_metric_name"] == "tokens_per_sec_per_gpu":
        return value
    return value * 1e12 / model_flops_per_token(model, _int(row["seq_len"]))


POLICIES = ("recipe", "least", "none", "written")


def load_runs(path: Path = DATA, cal: Calibration = DEFAULT, policy: str = "recipe",
              keep_regressions: bool = False) -> Tuple[List[PublishedRun], List[Tuple[str, str]]]:
    """(usable runs in file order, [(row id, reason)] for the rows left out). A tflops row is used only when its
    run has no tokens row. `keep_regressions` keeps the rows `slower_than_a_weaker_gpu` names."""
    rows = read_rows(path)
    stems_with_tokens = {stem(r["id"]) for r in rows if r["measured_metric_name"] == "tokens_per_sec_per_gpu"}
    regressions = {} if keep_regressions else slower_than_a_weaker_gpu(rows)
    runs, excluded = [], []
    for row in rows:
        if row["measured_metric_name"] != "tokens_per_sec_per_gpu" and stem(row["id"]) in stems_with_tokens:
            continue  # the same run's tokens row is used instead
        reason = exclusion_reason(row) or regressions.get(stem(row["id"]))
        if reason:
            excluded.append((row["id"], reason))
            continue
        runs.append(build_run(row, cal, policy))
    return runs, excluded


def headline_runs(policy: str = "recipe") -> Tuple[List[PublishedRun], List[Tuple[str, str]], set]:
    """(runs, excluded (id, reason), ids not to fit on). Every row `load_runs` uses, the rows its regression rule
    drops and the footnote rows."""
    runs, excluded = load_runs(policy=policy, keep_regressions=True)
    rows = {r["id"]: r for r in read_rows()}
    footnote = {i for i, why in excluded if why == FOOTNOTE}
    runs += [build_run(rows[i], policy=policy) for i in sorted(footnote)]
    excluded = [(i, why) for i, why in excluded if i not in footnote]
    return runs, excluded, footnote


def build_run(row: Dict[str, str], cal: Calibration = DEFAULT, policy: str = "recipe") -> PublishedRun:
    gpu = GPU_IDS[row["gpu"]]
    model, missing = build_model(row)
    cluster = load_cluster(gpu, _int(row["num_gpus"]))
    wl = Workload(seq_len=_int(row["seq_len"]), global_batch_size=_int(row["gbs"]))
    if policy not in POLICIES:
        raise ValueError(f"recompute policy {policy!r} must be one of {', '.join(POLICIES)}")
    facts = recipe_facts(row, gpu, fp8=row["precision"] != "bf16")
    if facts is not None and facts.no_dropout:
        model = model.model_copy(update={"hidden_dropout": 0.0})  # the recipe's model provider sets p = 0
    if facts is not None and facts.bf16_last_layers:
        model = model.model_copy(update={"bf16_last_layers": facts.bf16_last_layers})
    if facts is not None and (facts.bf16_modules or facts.mxfp8_modules):
        model = model.model_copy(update={"bf16_modules": facts.bf16_modules, "mxfp8_modules": facts.mxfp8_modules})
    base = base_strategy(row, model, gpu, facts)
    strategy, escalated = choose_recompute(model, cluster, base, wl, facts, policy, cal)
    return PublishedRun(
        id=row["id"], model=model, cluster=cluster, strategy=strategy, workload=wl,
        measured_tokens_per_gpu=measured_tokens_per_gpu(row, model), metric=row["measured_metric_name"],
        model_name=row["model"], gpu=gpu, precision="bf16" if row["precision"] == "bf16" else "fp8",
        arch=row["arch"], dims_from_catalogue=missing, facts=facts, escalated=escalated,
    )
