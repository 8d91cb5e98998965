"""How Megatron-LM splits decoder layers over pipeline ranks, and the split Megatron-Bridge picks for a model.

Megatron has four ways to place the layers (one at a time, TransformerConfig.__post_init__):
  even       num_layers / pp per rank, / vpp per model chunk (transformer_block.py `get_num_layers_to_build`);
  decoder    --decoder-first/last-pipeline-num-layers: the end ranks get the given counts, the rest split evenly
             (Strategy.first_stage_layers / last_stage_layers);
  account    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the embedding and
             the loss each count as one layer, (num_layers + e + l) split evenly over pp ranks and vpp chunks, and the
             first (last) virtual stage builds one decoder layer fewer;
  layout     --pipeline-model-parallel-layout: one list of layers per virtual stage, written like "Et|(tt|)*30L"
             (E embedding, t decoder layer, m MTP layer, L loss, | between virtual stages; stage k sits on rank
             k % pp, chunk k // pp: pipeline_parallel_layer_layout.py).
The cost model prices a split by the layers of each rank: `rank_layer_counts`. Sources, cited at each rule:
  [TC] TransformerConfig.__post_init__, megatron/core/transformer/transformer_config.py
  [TB] get_num_layers_to_build, megatron/core/transformer/transformer_block.py
  [PL] PipelineParallelLayerLayout, megatron/core/transformer/pipeline_parallel_layer_layout.py
  [V]  validate_args, megatron/training/arguments.py
  [MB] Megatron-Bridge recipes (NVIDIA-NeMo/Megatron-Bridge, src/megatron/bridge/recipes, perf_recipes)."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

from autoplan.layout_string import LAYOUT_SYMBOLS, layout_vpp, parse_layout  # the grammar and vpp = stages / pp
from autoplan.model import ModelSpec
from autoplan.strategy import Strategy
from autoplan.valid_values import stage_layer_counts


# ---- layout strings ------------------------------------------------------------------------------------------

def layout_rank_stages(text: str, pp: int) -> List[List[str]]:
    """[PL] the virtual stages of each rank: rank r holds stages r, r + pp, r + 2 pp, ..."""
    stages = parse_layout(text)
    return [stages[r::pp] for r in range(pp)]


def layout_rank_counts(text: str, pp: int) -> List[int]:
    """Decoder layers ('t') each pipeline rank holds under a layout string, its virtual stages summed."""
    return [sum(stage.count("t") for stage in rank) for rank in layout_rank_stages(text, pp)]


def layout_problem(text: str, pp: int, vpp: int, num_layers: int, mtp_layers: int) -> Optional[str]:
    """[V][PL] Why Megatron refuses a layout string, or None: the stages a multiple of pp (vpp = stages / pp, equal to
    a vpp given beside it), E first and L last, each exactly once, as many t as decoder layers and m as MTP depths,
    MTP after every decoder layer, in one virtual stage that is the last chunk of its rank (not rank 0)."""
    try:
        stages = parse_layout(text)
    except ValueError as e:
        return f"pipeline_layout={text!r}: {e}"
    flat = "".join(stages)
    implied = layout_vpp(text, pp)
    if implied is None:
        return f"pipeline_layout has {len(stages)} virtual stages, which pp={pp} does not divide"
    if vpp != implied:
        return (f"pipeline_layout has {len(stages)} virtual stages = pp*{implied}, but vpp={vpp}; "
                f"use vpp={implied} or drop vpp")
    checks = (
        (not flat.startswith("E") or flat.count("E") != 1, "must start with the embedding E, once"),
        (not flat.endswith("L") or flat.count("L") != 1, "must end with the loss L, once"),
        (flat.count("t") != num_layers, f"holds {flat.count('t')} decoder layers t, the model has {num_layers}"),
        (flat.count("m") != mtp_layers, f"holds {flat.count('m')} MTP layers m, the model has {mtp_layers}"),
        ("m" in flat and "t" in flat[flat.index("m"):], "must place the MTP layers m after every decoder layer"),
    )
    for broken, why in checks:
        if broken:
            return f"pipeline_layout={text!r} {why}"
    if mtp_layers:
        holders = [k for k, s in enumerate(stages) if "m" in s]
        k = holders[0]
        if len(holders) > 1 or k // pp != vpp - 1 or (k % pp == 0 and pp > 1):
            return (f"pipeline_layout={text!r} must hold all MTP layers in one virtual stage, the last chunk of a "
                    f"rank other than rank 0")
    return None


def layout_string(stages: List[str]) -> str:
    """A compact layout string for virtual stages, runs of equal stages written (x|)*n as Megatron reads them."""
    def one(stage: str) -> str:
        return re.sub(r"t{2,}", lambda g: f"t*{len(g.group(0))}", stage)

    out, k = [], 0
    while k < len(stages):
        run = 1
        while k + run < len(stages) and stages[k + run] == stages[k]:
            run += 1
        out.append(f"({one(stages[k])}|)*{run}" if run > 2 else "|".join([one(stages[k])] * run) + "|")
        k += run
    return "".join(out).rstrip("|")


def balanced_layout(num_layers: int, pp: int, vpp: int, emb_units: int, loss_units: int, mtp_layers: int = 0
                    ) -> Optional[str]:
    """[MB] Megatron-Bridge's DeepSeek layouts: every virtual stage holds k decoder layers, except that the first
    gives `emb_units` of them to the embedding and the last `loss_units` to the MTP layers and the loss
    (recipes/deepseek/h100/deepseek_v3.py `_get_deepseek_v3_pipeline_layout`: pp16 'Et*4|(t*4|)*14tmL', pp8 vp4
    'Et|(tt|)*30mL'). None when those counts do not add up to `num_layers`."""
    stages = pp * vpp
    if stages < 2 or (num_layers + emb_units + loss_units) % stages:
        return None
    k = (num_layers + emb_units + loss_units) // stages
    first, last = k - emb_units, k - loss_units
    if first < 0 or last < 0:
        return None
    body = ["E" + "t" * first] + ["t" * k] * (stages - 2) + ["t" * last + "m" * mtp_layers + "L"]
    return layout_string(body)


# ---- layers per rank -------------------------------------------------------------------------------------------

def account_units(strategy: Strategy) -> Tuple[int, int]:
    """(embedding, loss) layers the account flags add to the split."""
    return int(strategy.account_for_embedding), int(strategy.account_for_loss)


def account_problem(num_layers: int, pp: int, vpp: int, emb: int, loss: int) -> Optional[str]:
    """[TC][TB] with the account flags, num_layers + embedding + loss must split over pp ranks and then vpp chunks,
    and the first/last virtual stage must keep at least zero decoder layers."""
    total = num_layers + emb + loss
    what = "num_layers" + (" + embedding" if emb else "") + (" + loss" if loss else "")
    if total % pp:
        return f"{what} = {total} must be divisible by pp={pp} (account_for_* in pipeline split)"
    if (total // pp) % vpp:
        return f"{what} = {total} per pipeline rank ({total // pp}) must be divisible by vpp={vpp}"
    return None


def rank_layer_counts(strategy: Strategy, num_layers: int) -> List[int]:
    """Decoder layers on each pipeline rank as Megatron builds them (assumes the split is legal): its virtual
    stages' (`chunk_layer_counts`) summed."""
    s, pp = strategy, strategy.pp
    chunks = chunk_layer_counts(num_layers, pp, s.vpp, s.first_stage_layers, s.last_stage_layers,
                                *account_units(s), s.pipeline_layout)
    return [sum(chunks[r::pp]) for r in range(pp)]


def chunk_layer_counts(num_layers: int, pp: int, vpp: int, first: Optional[int] = None,
                       last: Optional[int] = None, emb: int = 0, loss: int = 0,
                       layout: Optional[str] = None) -> List[int]:
    """Decoder layers of each virtual stage in the model's order (stage k = chunk k // pp of rank k % pp), as
    Megatron builds them for a legal split: a layout string's stages [PL]; with the account flags (num_layers +
    emb + loss) / (pp vpp) units per stage, the first giving one to the embedding and the last one to the loss [TB];
    with end-rank counts each rank's layers over its vpp chunks (transformer_layer.py `get_transformer_layer_offset`:
    chunk v of every rank, in rank order, before chunk v + 1); else num_layers / (pp vpp) each."""
    if layout:
        return [stage.count("t") for stage in parse_layout(layout)]
    stages = pp * vpp
    if emb or loss:
        per = (num_layers + emb + loss) // stages
        counts = [per] * stages
        counts[0] -= emb
        counts[-1] -= loss
        return counts
    ranks = stage_layer_counts(num_layers, pp, first, last)
    # a legal split gives each rank a multiple of vpp; any remainder goes to its first chunks, so that the chunks
    # always sum to the rank's count
    return [ranks[k % pp] // vpp + (k // pp < ranks[k % pp] % vpp) for k in range(stages)]


def dsa_share_problem(model: ModelSpec, pp: int, vpp: int, first: Optional[int] = None, last: Optional[int] = None,
                      emb: int = 0, loss: int = 0, layout: Optional[str] = None) -> Optional[str]:
    """Why Megatron refuses this split for a model whose layers share DSA top-k (ModelSpec.dsa_indexer_topk_freq >
    1), or None: top-k indices are not passed between pipeline stages, so every virtual stage must start on a layer
    that runs its own indexer (megatron/core/models/gpt/experimental_attention_variant_module_specs.py
    `_validate_dsa_index_share_pipeline_split`, core_v0.19.0: "Choose a pipeline layout where each stage starts on
    a computing layer")."""
    if model.dsa_indexer_topk_freq <= 1 or not model.dsa_index_heads or pp * vpp == 1:
        return None
    start = 0
    for k, n in enumerate(chunk_layer_counts(model.num_layers, pp, vpp, first, last, emb, loss, layout)):
        if n and not model.dsa_computes_topk(start):
            return (f"pipeline stage {k} (rank {k % pp}{f', chunk {k // pp}' if vpp > 1 else ''}) starts on layer "
                    f"{start} (from 0), which reuses an earlier layer's DSA top-k (dsa_indexer_topk_freq="
                    f"{model.dsa_indexer_topk_freq}, dsa_indexer_skip_topk_offset="
                    f"{model.dsa_indexer_skip_topk_offset}); Megatron does not pass top-k between pipeline stages, "
                    f"so each stage must start on a layer with its own indexer")
        start += n
    return None


def strategy_dsa_share_problem(model: ModelSpec, s: Strategy) -> Optional[str]:
    """`dsa_share_problem` for the split a strategy's keys give."""
    return dsa_share_problem(model, s.pp, s.vpp, s.first_stage_layers, s.last_stage_layers, *account_units(s),
                             s.pipeline_layout)


@lru_cache(maxsize=256)
def dsa_share_splits(model: ModelSpec, pp: int, vpp: int) -> List[Tuple[int, int]]:
    """(first_stage_layers, last_stage_layers) pairs Megatron accepts at (pp, vpp) whose stages all start on a
    layer with its own DSA indexer, nearest to an even split first."""
    from autoplan.valid_values import uneven_split_problem

    L = model.num_layers
    pairs = [(f, la) for f in range(vpp, L, vpp) for la in range(vpp, L - f + 1, vpp)
             if uneven_split_problem(L, pp, vpp, f, la) is None and dsa_share_problem(model, pp, vpp, f, la) is None]
    def largest(pair):  # the most layers any rank holds
        middle = (L - pair[0] - pair[1]) / (pp - 2) if pp > 2 else 0
        return max(pair[0], pair[1], middle)

    even = L / pp
    return sorted(pairs, key=lambda p: (largest(p), abs(p[0] - even) + abs(p[1] - even), p))


def priced_as_end_ranks(counts: List[int]) -> Optional[Tuple[int, int]]:
    """(first, last) when the middle ranks hold equal counts (what the vectorised cost model prices), else None."""
    middle = counts[1:-1]
    if middle and len(set(middle)) != 1:
        return None
    return counts[0], counts[-1]


def layout_pricing_problem(text: str, pp: int, vpp: int) -> Optional[str]:
    """Why the cost model cannot price a legal layout string, or None: it prices the end ranks and equal middle
    ranks, with any MTP layers on the last rank."""
    ranks = layout_rank_stages(text, pp)
    counts = layout_rank_counts(text, pp)
    if priced_as_end_ranks(counts) is None:
        return (f"pipeline_layout={text!r} gives the middle ranks {counts[1:-1]} decoder layers; autoplan prices "
                f"layouts whose middle ranks hold equal counts")
    if any("m" in "".join(rank) for rank in ranks[:-1]):
        return f"pipeline_layout={text!r} puts MTP layers before the last rank; autoplan prices them on the last rank"
    return None


# ---- the split Megatron-Bridge uses ----------------------------------------------------------------------------

# Models whose Megatron-Bridge recipes set --account-for-embedding/loss-in-pipeline-split (recipes/llama/h100/
# llama3.py llama31_405b_pretrain_256gpu_h100_bf16_config, the base of every 405B perf recipe; recipes/qwen/h100/
# qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config), and those whose recipes give a
# pipeline_model_parallel_layout (recipes/deepseek/h100/deepseek_v3.py `_get_deepseek_v3_pipeline_layout`).
BRIDGE_ACCOUNT = {
    "llama3.1-405b": "recipes/llama/h100/llama3.py llama31_405b_pretrain_256gpu_h100_bf16_config",
    "qwen3-235b-a22b": "recipes/qwen/h100/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config",
}
BRIDGE_LAYOUT_MODELS = {"deepseek-v3": "recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout",
                        "kimi-k2": "recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout"}
# (pp, vpp) -> (embedding units, loss units) of Megatron-Bridge's DeepSeek-V3 layout map (61 layers: E with 16, 8, 4
# layers on the first stage, the last holding 3 fewer), and of the H100 perf recipe's pp8 vp4 'Et|(tt|)*30mL'.
BRIDGE_DEEPSEEK_UNITS = {(4, 1): (0, 3), (8, 1): (0, 3), (4, 2): (0, 3), (16, 1): (0, 3), (8, 2): (0, 3),
                         (4, 4): (0, 3), (8, 4): (1, 2)}


def _even(num_layers: int, pp: int, vpp: int) -> bool:
    return num_layers % pp == 0 and (num_layers // pp) % vpp == 0


def bridge_split(model: ModelSpec, pp: int, vpp: int) -> Optional[Tuple[Dict[str, object], str]]:
    """(strategy keys, note) of the stage split Megatron-Bridge uses for `model` at (pp, vpp) when Megatron cannot
    split the layers evenly; None when the even split works or no split fits. Models without a Bridge recipe get
    the account flags when they divide, else end-rank counts (vpp=1), else a balanced layout string. A split whose
    stages do not all start on a layer with its own DSA indexer (`dsa_share_problem`) is passed over."""
    found = _bridge_split(model, pp, vpp)
    if found is None:
        return None
    if strategy_dsa_share_problem(model, Strategy(pp=pp, vpp=vpp, **found[0])) is None:
        return found
    pairs = dsa_share_splits(model, pp, vpp)
    if not pairs:
        return None
    return ({"first_stage_layers": pairs[0][0], "last_stage_layers": pairs[0][1]},
            f"stage split: first_stage_layers={pairs[0][0]}, last_stage_layers={pairs[0][1]} (every stage starts on "
            f"a layer with its own DSA indexer)")


def _bridge_split(model: ModelSpec, pp: int, vpp: int) -> Optional[Tuple[Dict[str, object], str]]:
    L, key = model.num_layers, model.name.lower()
    if pp < 2 or _even(L, pp, vpp):
        return None
    mtp = model.mtp_num_layers
    if key in BRIDGE_LAYOUT_MODELS:
        units = BRIDGE_DEEPSEEK_UNITS.get((pp, vpp))
        layouts = [balanced_layout(L, pp, vpp, *units, mtp)] if units else []
        layouts += [balanced_layout(L, pp, vpp, e, u, mtp) for e, u in _unit_pairs(L, pp, vpp)]
        layout = next((x for x in layouts if x), None)
        if layout:
            how = "its layout map" if units else "its layout rule (the end stages give up layers)"
            return ({"pipeline_layout": layout},
                    f"stage split as Megatron-Bridge's {BRIDGE_LAYOUT_MODELS[key]} ({how}): pipeline_layout={layout}")
    for emb, loss in ((1, 1), (1, 0), (0, 1)):
        if account_problem(L, pp, vpp, emb, loss) is None:
            source = BRIDGE_ACCOUNT.get(key, "Megatron's account_for_*_in_pipeline_split rule")
            keys = {"account_for_embedding": bool(emb), "account_for_loss": bool(loss)}
            per = (L + emb + loss) // pp
            return ({k: v for k, v in keys.items() if v},
                    f"stage split as {'Megatron-Bridge ' if key in BRIDGE_ACCOUNT else ''}{source}: "
                    f"{', '.join(k for k, v in keys.items() if v)} ({L} layers + {emb + loss} = {pp} ranks x {per})")
    from autoplan.valid_values import suggest_uneven_split

    split = suggest_uneven_split(L, pp, vpp) if vpp == 1 else None
    if split:
        return ({"first_stage_layers": split[0], "last_stage_layers": split[1]},
                f"stage split: first_stage_layers={split[0]}, last_stage_layers={split[1]} "
                f"(--decoder-first/last-pipeline-num-layers)")
    for emb, loss in _unit_pairs(L, pp, vpp):
        layout = balanced_layout(L, pp, vpp, emb, loss, mtp)
        if layout:
            return ({"pipeline_layout": layout},
                    f"stage split: pipeline_layout={layout} (balanced virtual stages, the end stages give up "
                    f"{emb} and {loss} layers to the embedding and loss)")
    return None


def _unit_pairs(num_layers: int, pp: int, vpp: int) -> List[Tuple[int, int]]:
    """(embedding, loss) units that make the virtual stages add up, the loss side heavier first (it holds the LM
    head and cross entropy), at most one stage's layers each."""
    stages = pp * vpp
    k = -(-num_layers // stages)
    spare = stages * k - num_layers
    pairs = [(e, spare - e) for e in range(spare + 1) if e <= k and spare - e <= k]
    return sorted(pairs, key=lambda p: (abs(p[1] - p[0] - 1), -p[1]))
