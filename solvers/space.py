"""The search space: every legal strategy for a model, cluster and workload, as `Layouts` (struct of arrays).

Every solver draws from here, so solvers cannot disagree about what is legal. Legality is `autoplan.validate`'s:
the generators enumerate divisors and prune with the masks of the rules validate reads (autoplan/layout_rules.py,
switch_rules.py, deepspeed_rules.py), never with a condition of their own; a contract test checks that every point
generated here passes `validate`. Preferences that are not rules — TP inside the NVLink domain,
sequence parallelism whenever tp > 1 (it only saves memory and elementwise time at the same communication
volume: Korthikanti et al. 2022 sec. 4.2.2) — narrow the default space and are lifted with `allow`."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from autoplan import pipeline_split as PS
from autoplan import cuda_graphs as G
from autoplan import deepspeed_rules as DS
from autoplan import keys as K
from autoplan import layout_rules as LR
from autoplan import switch_rules as SR
from autoplan import recompute as R
from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT as DEFAULT_CALIBRATION, Calibration
from autoplan.costmodel.layout import Layouts, engine_columns, recipe_columns
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.numerics import fp8_allowed, precision_conflict
from autoplan.strategy import SPLIT_KEYS, Strategy, coerce_strategy_value, strategy_items
from autoplan.valid_values import uneven_split_problem
from autoplan.valid_values import divisors  # each call passes the largest value the search uses (tp <= GPUs,
# pp <= layers, vpp and mbs <= 16, ep*etp <= GPUs), so the search's time does not grow with the GPU count or batch
from autoplan.keys import ENGINES
from autoplan.validate import effective_fp8_recipe, interleaving_blocked, module_set_problem
from autoplan.workload import Workload

ALLOW_CHOICES = ("tp-outside-domain", "ep-outside-domain", "no-sp", "non-pow2-mbs")


def _one(value):
    """A fixed key's single value: the first alternative of a list; a tuple (e.g. module names) is one value."""
    return value[0] if isinstance(value, list) else value


@dataclass(frozen=True)
class Problem:
    """What to search: the inputs plus the user's narrowing (`fixed`, `excluded`) and widening (`allow`)."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    fixed: Dict[str, object] = field(default_factory=dict)  # key -> value every plan must have
    excluded: Dict[str, Tuple[object, ...]] = field(default_factory=dict)  # key -> values no plan may have
    allow: FrozenSet[str] = frozenset()
    engine: str = "megatron"
    mem_headroom: float = 0.0  # fraction of device memory kept free
    # GEMM precision the search may try (autoplan/numerics.py PRECISIONS); None: what a fixed fp8 / fp8_recipe says,
    # else bf16. The numerics are never chosen for speed unless asked.
    precision: Optional[str] = None
    calibration: Calibration = DEFAULT_CALIBRATION  # constants every candidate is priced with (--calibration)
    objective: str = "throughput"  # throughput (step time) or goodput (step time / useful-time fraction)

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise InputError(f"engine {self.engine!r} is not supported; use one of: {', '.join(ENGINES)}")
        conflict = precision_conflict(self.precision, self.fixed)
        if conflict:
            raise InputError(conflict)
        if self.precision == "fp8" and not _has_fp8(self):
            raise InputError(f"--precision fp8 needs a GPU with FP8 tensor cores; {self.cluster.gpu.id} has none, "
                             f"use --precision bf16")
        if self.precision == "fp8" and self.engine != "megatron":
            raise InputError(f"--precision fp8: the {self.engine} launch files run bf16 GEMMs only; use --engine "
                             f"megatron or --precision bf16")
        unknown = set(self.allow) - set(ALLOW_CHOICES)
        if unknown:
            raise InputError(f"--allow {sorted(unknown)[0]!r} is unknown; valid: {', '.join(ALLOW_CHOICES)}")
        if not 0.0 <= self.mem_headroom < 1.0:
            raise InputError(f"mem-headroom={self.mem_headroom} must be in [0, 1); e.g. 0.1 keeps 10% free")
        # The other single-valued fixed switches a CUDA-graph module set is checked with.
        others = {k: _one(v) for k, v in self.fixed.items()
                  if k in ("moe_a2a_overlap", "cpu_offload_layers", "recompute", "recompute_modules")
                  and not (isinstance(v, list) and len(v) != 1)}
        for key in ("recompute_modules", "cuda_graph_modules"):  # module sets the model itself rules out
            want = self.fixed.get(key)
            if want is None:
                continue
            sets = want if isinstance(want, list) else [want]
            # Model-wide rules only; what an engine cannot run is named where the search applies the switch.
            problems = [module_set_problem(self.model, self.cluster, self.workload, key, v,
                                           others=others if key == "cuda_graph_modules" else None)
                        for v in sets if v is not None]
            if problems and all(problems):
                raise InputError(problems[0])


def parse_constraints(items: Sequence[str], what: str) -> Dict[str, List[object]]:
    """['tp=8', 'pp=2|4'] -> {'tp': [8], 'pp': [2, 4]} with values coerced like strategy values. --exclude may
    name a key several times (each value is excluded); --fix may not: a plan has one value, and 'tp=8|4' is how
    to allow either."""
    out: Dict[str, List[object]] = {}
    given: Dict[str, str] = {}
    for item in items:
        for part in strategy_items(item):
            if "=" not in part:
                raise InputError(f"{what} {part!r} must be key=value (e.g. {what} tp=8)")
            key, raw = (s.strip() for s in part.split("=", 1))
            key = key.lower().replace("-", "_")
            if what == "--fix" and key in given:
                raise InputError(f"--fix {key} is given twice ({what} {given[key]} and {what} {part}); a plan has one "
                                 f"{key}: keep one, or write {key}={given[key].split('=', 1)[1]}|{raw} to allow either")
            given[key] = part
            alternatives = [raw] if key == "pipeline_layout" else raw.split("|")  # '|' separates a layout's stages
            out.setdefault(key, []).extend(coerce_strategy_value(key, v) for v in alternatives)
    return out


def _pow2_upto(n: int) -> List[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _has_fp8(problem: Problem) -> bool:
    return problem.cluster.gpu.has_dtype("fp8")


def _env(problem: Problem) -> LR.Env:
    """What the rule book (autoplan/layout_rules.py) reads besides the candidates."""
    wl = problem.workload
    return LR.Env(problem.model, problem.cluster.num_gpus, wl.seq_len, wl.global_batch_size, problem.engine)


def _legal(problem: Problem, rules, key: str, values, **fixed) -> List:
    """The values of `key` (the other columns `fixed`) that every rule of `rules` allows: a generator prunes with
    the rules' masks, never a condition of its own."""
    return LR.keep_values(_env(problem), rules, key, values, **fixed)


def _choices(problem: Problem, key: str, default: Iterable) -> List:
    vals = list(default)
    if key in problem.fixed:
        want = problem.fixed[key] if isinstance(problem.fixed[key], (list, tuple)) else [problem.fixed[key]]
        vals = [v for v in vals if v in want]  # a fixed value must still be legal
    ex = set(problem.excluded.get(key, ()))
    return [v for v in vals if v not in ex]


def tp_choices(problem: Problem) -> List[int]:
    m, hw_domain = problem.model, problem.cluster.gpu.nvlink_domain_size
    # The NVLink-domain preference never overrides a tp the user fixed.
    wide = "tp-outside-domain" in problem.allow or "tp" in problem.fixed
    limit = problem.cluster.num_gpus if wide else min(hw_domain, problem.cluster.num_gpus)
    # Divisors of the heads that divide the GPU count (LR.TP_HEADS, LR.WORLD_TILES), enumerated as such.
    out = divisors(math.gcd(m.num_attention_heads, problem.cluster.num_gpus), upto=limit)
    if not wide:
        out = [t for t in out if limit % t == 0]  # a TP group crossing an NVLink domain (a node, or into a partly
        # used last node) is slow: a preference, not a rule
    return _legal(problem, (LR.TP_GROUPS, LR.TP_MIXER, DS.KV_HEADS), "tp", out)


def stage_splits(num_layers: int, pp: int, vpp: int, uneven: bool) -> List[Tuple[int, int]]:
    """(first, last) layer counts (-1 = even split) that Megatron accepts for pp ranks and vpp chunks through
    --decoder-first/last-pipeline-num-layers."""
    out = []
    if pp == 1:
        return [(-1, -1)] if vpp == 1 else []
    if _even_split(num_layers, pp, vpp):
        out.append((-1, -1))
    if not uneven:
        return out
    base = -(-num_layers // pp)
    for first in range(max(1, base - 3), base + 1):
        for last in range(max(1, base - 3), base + 1):
            if uneven_split_problem(num_layers, pp, vpp, first, last) is not None:
                continue  # the uneven-split rule (validate._pipeline_split)
            mids = pp - 2
            mid = (num_layers - first - last) // mids if mids else first
            if (first, last) == (mid, mid):
                continue  # that is the even split
            out.append((first, last))
    return out


def _even_split(num_layers: int, pp: int, vpp: int) -> bool:
    """Whether the layers split evenly over pp ranks and vpp chunks (LR.EVEN_LAYERS, LR.VPP_DIVIDES_RANK)."""
    env = LR.Env(SimpleNamespace(num_layers=num_layers))
    return bool(LR.holds(env, (LR.EVEN_LAYERS, LR.VPP_DIVIDES_RANK), LR.columns(pp=pp, vpp=vpp)))


# A split: (first, last) end-rank layer counts (-1 = the middle ranks' count), account_for_* bits (1 embedding,
# 2 loss), and a --pipeline-model-parallel-layout string or None (autoplan/pipeline_split.py).
Split = Tuple[int, int, int, object]


def all_stage_splits(model: ModelSpec, pp: int, vpp: int, uneven: bool) -> List[Split]:
    """Every way Megatron can place the layers at (pp, vpp), one per distinct pair of end-rank counts, in order of
    preference: even, account_for_* (Megatron-Bridge's split for Llama-3.1-405B and Qwen3-235B), first/last rank
    counts, then (vpp > 1, for the models whose Bridge recipes give layouts: DeepSeek-V3, Kimi-K2) balanced layout
    strings as Megatron-Bridge writes them. Any other layout is taken when fixed (--fix pipeline_layout=...)."""
    L = model.num_layers
    even = [(-1, -1, 0, None)] if pp == 1 or _even_split(L, pp, vpp) else []
    if pp == 1 or not uneven:
        return even if (pp > 1 or vpp == 1) else []
    seen = {(L // pp, L // pp)} if even else set()
    out: List[Split] = list(even)
    for emb, loss in ((1, 1), (1, 0), (0, 1)):
        if PS.account_problem(L, pp, vpp, emb, loss) is None:
            per = (L + emb + loss) // pp
            if (per - emb, per - loss) not in seen and per - max(emb, loss) >= 0:
                seen.add((per - emb, per - loss))
                out.append((per - emb, per - loss, emb + 2 * loss, None))
    # a model sharing DSA top-k needs stages that start on indexer layers: the nearest such end-rank counts too
    shared = PS.dsa_share_splits(model, pp, vpp)[:2] if model.dsa_indexer_topk_freq > 1 else []
    for first, last in stage_splits(L, pp, vpp, True) + shared:
        if first >= 0 and (first, last) not in seen:
            seen.add((first, last))
            out.append((first, last, 0, None))
    # Layouts as Bridge writes them for its models, and for any model that no other split carries at this vpp (as
    # pipeline_split.bridge_split chooses for them).
    if vpp > 1 and (model.name.lower() in PS.BRIDGE_LAYOUT_MODELS or not out):
        units = PS.BRIDGE_DEEPSEEK_UNITS.get((pp, vpp))
        for emb, loss in ([units] if units else PS._unit_pairs(L, pp, vpp)[:1]):
            text = PS.balanced_layout(L, pp, vpp, emb, loss, model.mtp_num_layers)
            k = (L + emb + loss) // (pp * vpp)
            ends = (vpp * k - emb, vpp * k - loss)
            if text and ends not in seen:
                seen.add(ends)
                out.append((ends[0], ends[1], 0, text))
    return out


def split_vpps(model: ModelSpec, pp: int) -> List[int]:
    """vpp values (<= 16) some Megatron split supports at pp: divisors of the layers per rank (even, or with the
    embedding/loss counted), and, for the models searched with layouts, any vpp a balanced layout string can fill."""
    L = model.num_layers
    vals = set(divisors(L // pp if L % pp == 0 else L, upto=16))
    for extra in (1, 2):
        if (L + extra) % pp == 0:
            vals |= set(divisors((L + extra) // pp, upto=16))
    if model.name.lower() in PS.BRIDGE_LAYOUT_MODELS:
        vals |= {v for v in range(2, 17) if pp * v <= L and PS._unit_pairs(L, pp, v)}
    return sorted(v for v in vals if v <= 16)


def _fixed_ints(problem: Problem, key: str) -> set:
    """The values the user fixed for an integer key (the search's own range may leave them out: powers of two, a
    cap); the layout rules below decide whether they are legal."""
    fixed = problem.fixed.get(key)
    return {int(v) for v in (fixed if isinstance(fixed, (list, tuple)) else [fixed]) if v is not None}


def _fixed_vpps(problem: Problem, pp: int) -> List[int]:
    """vpp values the user fixed, directly or through a layout string, that the search's own range leaves out
    (above 16, or a layout string's vpp for a model without a Bridge recipe): any vpp is legal where a stage split
    carries it (Megatron-LM takes one layer per virtual stage, e.g. Llama-2-70B at pp4 vpp20), so the splits
    decide, not a cap."""
    out = sorted(_fixed_ints(problem, "vpp"))
    text = _one(problem.fixed.get("pipeline_layout"))
    if text is not None and not out:
        try:
            vpp = PS.layout_vpp(text, pp)
        except ValueError:
            vpp = None
        out += [vpp] if vpp else []
    return out


def _fixed_split(problem: Problem, pp: int, vpp: int) -> List[Split]:
    """The splits that match the split keys the user fixed (first/last stage layers, account_for_*, a layout)."""
    f = problem.fixed

    def one(key):
        return _one(f.get(key))

    m, L = problem.model, problem.model.num_layers
    text = one("pipeline_layout")
    if text is not None:  # exactly that layout, where Megatron takes it and the cost model prices it
        if PS.layout_problem(text, pp, vpp, L, m.mtp_num_layers) or PS.layout_pricing_problem(text, pp, vpp):
            return []
        counts = PS.rank_layer_counts(Strategy(pp=pp, vpp=vpp, pipeline_layout=text), L)
        return [(counts[0], counts[-1], 0, text)]
    emb, loss = int(bool(one("account_for_embedding"))), int(bool(one("account_for_loss")))
    if emb or loss:
        if PS.account_problem(L, pp, vpp, emb, loss):
            return []
        per = (L + emb + loss) // pp
        return [(per - emb, per - loss, emb + 2 * loss, None)]
    first, last = one("first_stage_layers"), one("last_stage_layers")
    pairs = stage_splits(L, pp, vpp, True)
    if first is not None and last is not None and uneven_split_problem(L, pp, vpp, first, last) is None:
        pairs = pairs + [(first, last)]  # both given and legal: taken as written, however far from even
    if m.dsa_indexer_topk_freq > 1:  # the end-rank counts a model sharing DSA top-k splits at (validate's advice)
        pairs = pairs + PS.dsa_share_splits(m, pp, vpp)
    return list(dict.fromkeys((a, b, 0, None) for a, b in pairs
                              if a >= 0 and first in (None, a) and last in (None, b)))


def _dsa_share_ok(model: ModelSpec, pp: int, vpp: int, split: Split) -> bool:
    """Whether every virtual stage of the split starts on a layer with its own DSA indexer, where the model shares
    DSA top-k between layers (validate._dsa_index_share; pipeline_split.dsa_share_problem)."""
    if model.dsa_indexer_topk_freq <= 1:
        return True
    first, last, bits, layout = split
    emb, loss = (bits & 1, (bits & 2) >> 1) if bits else (0, 0)
    ends = (None, None) if bits or layout or first < 0 else (first, last)
    return PS.dsa_share_problem(model, pp, vpp, *ends, emb, loss, layout) is None


def structural_points(problem: Problem) -> List[Dict[str, int]]:
    """(tp, cp, pp, vpp, first, last, ep, etp, dp) combinations that satisfy the layout rules."""
    m, world = problem.model, problem.cluster.num_gpus
    L = m.num_layers
    split_fixed = any(k in problem.fixed for k in SPLIT_KEYS)
    points = []
    for tp in _choices(problem, "tp", tp_choices(problem)):
        cps = sorted(set(_pow2_upto(world // tp)) | _fixed_ints(problem, "cp"))
        # pp=1 here: a tp*cp that does not divide the GPUs tiles with no pp.
        cps = _legal(problem, (LR.CP_SEQ, LR.CP_MIXERS, LR.WORLD_TILES, DS.NO_CP), "cp", cps, tp=tp, pp=1)
        for cp in _choices(problem, "cp", cps):
            for pp in _choices(problem, "pp", divisors(world // (tp * cp), upto=L)):
                dp = world // (tp * cp * pp)
                if not LR.holds(_env(problem), (LR.BATCH_DIVIDES,), LR.columns(mbs=1, dp=dp)):
                    continue  # gbs divisible by mbs*dp needs at least dp | gbs (mbs=1)
                vpps = sorted(set(split_vpps(m, pp) + _fixed_vpps(problem, pp))) if pp > 1 else [1]
                for vpp in _choices(problem, "vpp", _legal(problem, (DS.NO_VPP,), "vpp", vpps)):
                    if split_fixed:
                        splits = _fixed_split(problem, pp, vpp)
                    else:
                        splits = all_stage_splits(m, pp, vpp, uneven=problem.engine == "megatron")
                    splits = [sp for sp in splits if _dsa_share_ok(m, pp, vpp, sp)]
                    for ep, etp in _expert_choices(problem, tp, pp, cp, dp):
                        for first, last, account, text in splits:
                            points.append(dict(tp=tp, cp=cp, pp=pp, vpp=vpp, first=first, last=last, ep=ep,
                                               etp=etp, dp=dp, account=account, layout=text))
    return points


def _expert_choices(problem: Problem, tp: int, pp: int, cp: int, dp: int):
    """(ep, etp) pairs. Expert parallelism may leave the NVLink domain: its all-to-all is priced over the network
    (with the flex dispatcher's one copy per destination node, collectives.flex_all_to_all_time) and the search takes
    it where it is faster (Megatron-MoE-ModelZoo's Qwen3-235B on 256 H100 runs fastest with EP 32 over 4 nodes,
    data/moe_layout_runs.csv). `--allow ep-outside-domain` is accepted and changes nothing."""
    m, world = problem.model, problem.cluster.num_gpus
    if not m.is_moe:
        return [(1, e) for e in _choices(problem, "etp", [1])] if _choices(problem, "ep", [1]) else []
    out = []
    etps = _legal(problem, (LR.BIASED_EXPERTS_ETP, DS.NO_ETP), "etp", sorted({1, tp}))
    for etp in _choices(problem, "etp", etps):
        # ep divides the experts (enumerated as such); etp*ep*pp divides the GPUs, which also folds the experts
        # inside the tp*cp*dp ranks of one stage.
        eps = _legal(problem, (LR.EXPERT_GRID, DS.NO_EP), "ep", divisors(m.num_experts, upto=world), etp=etp, pp=pp)
        out += [(ep, etp) for ep in _choices(problem, "ep", eps)]
    return out


def mbs_choices(problem: Problem, dp: int) -> List[int]:
    per_dp = problem.workload.global_batch_size // dp
    cands = divisors(per_dp, upto=16) if "non-pow2-mbs" in problem.allow else \
        _legal(problem, (LR.BATCH_DIVIDES,), "mbs", _pow2_upto(per_dp), dp=dp)
    # The search's own range stops at 16; an mbs the user fixed is taken wherever the batch divides.
    cands += _legal(problem, (LR.BATCH_DIVIDES,), "mbs", [v for v in sorted(_fixed_ints(problem, "mbs")) if v > 16],
                    dp=dp)
    return [v for v in _choices(problem, "mbs", cands) if v <= 16 or "mbs" in problem.fixed]


def selective_module_sets(problem: Problem) -> List[int]:
    """Bit masks of the selective-recompute module sets the search tries (autoplan.recompute.ladder), or the one
    `--fix recompute_modules=...` names."""
    if "recompute_modules" in problem.fixed:
        want = problem.fixed["recompute_modules"]
        sets = want if isinstance(want, list) and want and isinstance(want[0], (list, tuple)) else [want]
        return [R.mask(s) for s in sets]
    if problem.engine == "deepspeed":
        return [R.mask(R.DEFAULT)]
    m = problem.model
    return [R.mask(s) for s in R.ladder(m.is_moe, m.multi_latent_attention)]


def recompute_options(problem: Problem, chunk_layers: int) -> List[Tuple[int, bool, int, int]]:
    """(code, block, layers, modules): none, selective with each module set of `selective_module_sets`, full
    block with n layers per chunk (powers of two and all), full uniform (every layer). Ordered by increasing
    recompute time (and decreasing memory), so the first that fits is the fastest."""
    opts = [(0, False, 0, 0)] + [(1, False, 0, bits) for bits in selective_module_sets(problem)]
    blocks = sorted({v for v in _pow2_upto(chunk_layers)} | {chunk_layers})
    opts += [(2, True, n, 0) for n in blocks if n < chunk_layers]
    opts.append((2, False, 1, 0))
    names = {0: "none", 1: "selective", 2: "full"}
    allowed = set(_choices(problem, "recompute", ["none", "selective", "full"]))
    if "recompute_modules" in problem.fixed:
        allowed &= {"selective"}  # a module set is selective recompute (Strategy._local_rules), never dropped
    graphs = _one(problem.fixed.get("cuda_graph_modules"))
    if graphs and not SR.allowed("cuda_graph_modules", problem.model, LR.columns(recompute=[2]), G.mask(graphs),
                                 rules=(SR.FULL_RECOMPUTE_GRAPH,))[0]:
        allowed -= {"full"}  # full recompute only under the full-iteration graph (switch_rules.py)
    out = [o for o in opts if names[o[0]] in allowed]
    if "recompute_layers" in problem.fixed and "recompute_method" in problem.fixed:
        # Method and layers both written: exactly those (a block of at most a chunk's layers), e.g. uniform/1 for
        # full recompute of every layer, whether or not the default ladder holds them.
        full = [(2, meth == "block", n, 0) for meth in _as_list(problem.fixed["recompute_method"])
                for n in _as_list(problem.fixed["recompute_layers"]) if 1 <= n <= chunk_layers]
        full = sorted(set(full), key=lambda o: (not o[1], o[2])) if "full" in allowed else []
        return [o for o in out if o[0] != 2] + full
    if "recompute_layers" in problem.fixed:
        want = problem.fixed["recompute_layers"]
        want = want if isinstance(want, list) else [want]
        out = [o for o in out if o[0] != 2 or o[2] in want or (not o[1] and 1 in want)]
    if "recompute_method" in problem.fixed:
        meth = problem.fixed["recompute_method"]
        meth = meth if isinstance(meth, list) else [meth]
        out = [o for o in out if o[0] != 2 or ("block" if o[1] else "uniform") in meth]
    return out


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def zero_choices(problem: Problem, pp: int) -> List[int]:
    vals = [0, 1, 3] if problem.engine == "megatron" else [0, 1, 2, 3]  # Megatron: DDP, dist-opt, FSDP
    return _choices(problem, "zero", _legal(problem, (LR.ZERO3_NO_PP,), "zero", vals, pp=pp))


def fp8_choices(problem: Problem) -> List[bool]:
    """FP8 GEMMs off and/or on: what the fixed fp8 / fp8_recipe and the hardware allow, narrowed to the precision
    the user asked for (autoplan/numerics.py: bf16 unless --precision or a fixed fp8 says otherwise)."""
    vals = _legal(problem, (DS.NO_FP8,), "fp8", [False, True] if _has_fp8(problem) else [False])
    allowed = _choices(problem, "fp8", ["none", "hybrid", "e4m3"])
    if "fp8_recipe" in problem.fixed:
        allowed = [v for v in allowed if v != "none"]  # a fixed FP8 recipe needs FP8 GEMMs on every plan
    if "fp8" in problem.fixed or "fp8_recipe" in problem.fixed:
        vals = sorted({v != "none" for v in allowed if v == "none" or _has_fp8(problem)})
    else:
        vals = [v for v in vals if ("hybrid" if v else "none") in allowed]
    wanted = fp8_allowed(problem.precision, problem.fixed)
    return [v for v in vals if v in wanted]


def sp_choices(problem: Problem, tp: int, cp: int = 1) -> List[bool]:
    """Sequence parallelism on and/or off at (tp, cp): what the rules allow (on needs tp > 1, MoE at tp > 1 needs
    it on Megatron, DeepSpeed has none), with the preference for it whenever tp > 1 on Megatron (lifted by
    --allow no-sp) taken before the rule that SP splits each rank's tokens over tp."""
    vals = _legal(problem, (LR.SP_NEEDS_TP, LR.MOE_NEEDS_SP, DS.NO_SP), "sp", [True, False], tp=tp, cp=cp)
    if problem.engine == "megatron" and tp > 1 and "no-sp" not in problem.allow:
        vals = [v for v in vals if v]
    return _choices(problem, "sp", _legal(problem, (LR.SP_SPLITS_SEQ,), "sp", vals, tp=tp, cp=cp))


@dataclass(frozen=True)
class Grid:
    """The candidates, grouped: `layouts` (all candidates), `group` (index of the structural point with the
    same everything-but-memory-knobs), `level` (0.. in increasing time order inside a group)."""

    layouts: Layouts
    group: np.ndarray
    level: np.ndarray


# A candidate's grid columns: its structural point, the outer choices (one group each) and the memory knobs (the
# levels of a group, `_knobs`' row order).
STRUCTURAL = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "first", "last", "account", "layout")
OUTER = ("mbs", "fp8", "sp")
KNOBS = ("zero", "rc", "block", "rl", "mods")


def enumerate_grid(problem: Problem) -> Grid:
    """Every legal candidate. Within a group (same layout, mbs, fp8, sp), the memory knobs (zero, recompute)
    are ordered from fastest to slowest so a search can stop at the first that fits."""
    knob_table: Dict[Tuple[int, int, bool], int] = {}  # (chunk layers, pp, fp8) -> index into `knobs`
    delayed = _delayed_fp8(problem)
    layout_ids: Dict[str, int] = {}  # layout strings, numbered for the integer grid
    fp8s = fp8_choices(problem)
    # The outer choices depend on a point's dp (mbs) and (tp, cp) (sp) alone: worked out once per value, not once
    # per structural point (tens of thousands of points share a few dp and tp values).
    outer_table: Dict[Tuple[int, int, int, bool], int] = {}  # (dp, tp, cp, fp8) -> index into `outers`
    outers: List[np.ndarray] = []
    knobs: List[np.ndarray] = []
    blocks: List[Tuple[Tuple[int, ...], int, int]] = []  # (structural columns, outer index, knobs index)
    for p in structural_points(problem):
        p["layout"] = -1 if p["layout"] is None else layout_ids.setdefault(p["layout"], len(layout_ids))
        chunk = max((p["first"] if p["first"] >= 0 else problem.model.num_layers // p["pp"]) // p["vpp"], 1)
        fixed = tuple(p[k] for k in STRUCTURAL)
        for fp8 in fp8s:
            ki = knob_table.get((chunk, p["pp"], fp8))
            if ki is None:
                ki = knob_table[(chunk, p["pp"], fp8)] = len(knobs)
                knobs.append(_knobs(problem, chunk, p["pp"], fp8 and delayed))
            oi = outer_table.get((p["dp"], p["tp"], p["cp"], fp8))
            if oi is None:
                oi = outer_table[(p["dp"], p["tp"], p["cp"], fp8)] = len(outers)
                outers.append(np.array(list(itertools.product(mbs_choices(problem, p["dp"]), [fp8],
                                                              sp_choices(problem, p["tp"], p["cp"]))),
                                       dtype=np.int64).reshape(-1, 3))
            if len(knobs[ki]) and len(outers[oi]):
                blocks.append((fixed, oi, ki))
    gbs = problem.workload.global_batch_size

    def schedulable(pp, vpp, mbs, dp):
        """Megatron's interleaved schedule runs whole groups of pp micro-batches (validate._interleaved_schedule)."""
        return ~interleaving_blocked(pp, vpp, gbs // np.maximum(mbs * dp, 1))

    col, groups, levels = _assemble(blocks, outers, knobs, keep=schedulable)
    return _grid_from(problem, col, groups, levels, sorted(layout_ids, key=layout_ids.get))


def _assemble(blocks, outers: List[np.ndarray], knobs: List[np.ndarray], keep=None):
    """({column: values}, group, level) of the candidates of every block (structural columns, outer table, knobs
    table) in block order: each block holds outer x knobs candidates, one group per outer row, the knobs in level
    order. `keep(pp, vpp, mbs, dp)`, when given, is a row filter applied before the other columns are built."""
    if not blocks:
        return ({name: np.zeros(0, np.int64) for name in STRUCTURAL + OUTER + KNOBS}, np.zeros(0, np.int64),
                np.zeros(0, np.int64))
    fixed = np.array([b[0] for b in blocks], dtype=np.int64)
    oi = np.array([b[1] for b in blocks])
    ki = np.array([b[2] for b in blocks])
    n_o = np.array([len(o) for o in outers])[oi]
    n_k = np.array([len(k) for k in knobs])[ki]
    rows = n_o * n_k
    block = np.repeat(np.arange(len(blocks)), rows)  # each candidate's block
    j = np.arange(int(rows.sum())) - np.repeat(np.cumsum(rows) - rows, rows)  # its row inside the block
    nk = n_k[block]
    o_off = np.cumsum([0] + [len(o) for o in outers])[:-1]
    k_off = np.cumsum([0] + [len(k) for k in knobs])[:-1]
    outer_row = o_off[oi][block] + j // nk
    knob_row = k_off[ki][block] + j % nk
    group = np.repeat(np.cumsum(n_o) - n_o, rows) + j // nk
    level = j % nk
    # One contiguous array per column (a column of a 19-wide matrix is a strided view, slow to compute on).
    outer_cols, knob_cols = np.vstack(outers).T, np.vstack(knobs).T
    if keep is not None:
        def structural(name):
            return fixed[:, STRUCTURAL.index(name)][block]

        mask = keep(structural("pp"), structural("vpp"), outer_cols[OUTER.index("mbs")][outer_row], structural("dp"))
        block, outer_row, knob_row, group, level = (x[mask] for x in (block, outer_row, knob_row, group, level))
    cols = {name: fixed[:, c][block] for c, name in enumerate(STRUCTURAL)}
    cols.update({name: outer_cols[c][outer_row] for c, name in enumerate(OUTER)})
    cols.update({name: knob_cols[c][knob_row] for c, name in enumerate(KNOBS)})
    return cols, group, level


def _knobs(problem: Problem, chunk: int, pp: int, delayed_fp8: bool) -> np.ndarray:
    """(zero, recompute, block, layers, modules) rows of one structural point. FP8 delayed scaling (the default
    recipe before Blackwell) does not run layernorm / moe_act recompute (transformer_config.py;
    autoplan/validate.py `_recompute_modules`), so FP8 candidates then drop those two from each module set (and the
    set, when nothing new is left). A set the user fixed is never changed: FP8-delayed candidates that cannot run
    it are left out instead."""
    options = fp8_recompute_options(problem, chunk, delayed_fp8)
    rows = [(z, rc, block, rl, mods) for (rc, block, rl, mods) in options for z in zero_choices(problem, pp)]
    return np.array(rows, dtype=np.int64).reshape(-1, 5)


def fp8_recompute_options(problem: Problem, chunk: int, delayed_fp8: bool) -> List[Tuple[int, bool, int, int]]:
    """`recompute_options` as a candidate with (delayed_fp8=True) or without FP8 delayed scaling can run them: the
    module sets lose layernorm / moe_act, or are left out when the user fixed them (see `_knobs`). The CP-SAT
    refinement draws from here too, so it never puts back a set the candidate cannot run."""
    unsupported = R.mask(("layernorm", "moe_act"))
    user_set = "recompute_modules" in problem.fixed
    options, seen = [], set()
    for rc, block, rl, mods in recompute_options(problem, chunk):
        if delayed_fp8 and rc == 1 and user_set and mods & unsupported:
            continue
        if delayed_fp8 and rc == 1:
            mods &= ~unsupported
            if not mods or mods in seen:
                continue
            seen.add(mods)
        options.append((rc, block, rl, mods))
    return options


def delayed_fp8(problem: Problem) -> bool:
    """Whether FP8 candidates of this search run delayed scaling (the recipe fixed, else the GPU's default)."""
    return _delayed_fp8(problem)


def _grid_from(problem: Problem, col: Dict[str, np.ndarray], g: np.ndarray, lv: np.ndarray,
               layout_names=()) -> Grid:
    """The candidates' Layouts from the grid's columns (`_assemble`, the rows Megatron's interleaved schedule cannot
    run already dropped), the fixed switches set and the rows that cannot carry them (or that the DeepSpeed emitter
    cannot write) dropped."""
    n = len(g)
    names = np.array(list(layout_names) + [None], dtype=object)  # layout id -1 -> None
    fp8 = col["fp8"].astype(bool)
    # The FP8 recipe as fixed, on the FP8 candidates; its effective columns come from the one place it is applied.
    written = np.where(fp8, _one(problem.fixed.get("fp8_recipe")), None).astype(object)
    lay = Layouts(
        tp=col["tp"], pp=col["pp"], vpp=col["vpp"], cp=col["cp"], ep=col["ep"], etp=col["etp"], dp=col["dp"],
        mbs=col["mbs"], sp=col["sp"].astype(bool), zero=col["zero"], recompute=col["rc"],
        recompute_block=col["block"].astype(bool), recompute_layers=col["rl"], recompute_modules=col["mods"],
        fp8=fp8, first=col["first"], last=col["last"], account=col["account"], layout=names[col["layout"]],
        fp8_recipe=written, **engine_columns(problem.engine, n), **recipe_columns(fp8, written, problem.cluster.gpu.id),
        **searched_switches(problem, col, n))  # the switches as the search sets them (autoplan/keys.py)
    lay, keep = _apply_switches(problem, lay)
    if problem.engine == "deepspeed" and n:
        # What the DeepSpeed emitter writes: the one rule list of integrations/engines.py (deepspeed_unsupported).
        from autoplan.integrations.engines import deepspeed_blocked

        keep = keep & ~deepspeed_blocked(lay, problem.model)
    if not keep.all():
        lay, g, lv = lay.take(keep), g[keep], lv[keep]
    return Grid(lay, g, lv)


def searched_switches(problem: Problem, columns, n: int) -> Dict[str, np.ndarray]:
    """The switch columns the search gives n candidates (autoplan/keys.py `Switch.search`) from the grid's columns
    (tp, pp, vpp, ep, zero, sp, fp8, rc = recompute code, mods = recompute module bits). A fixed CUDA-graph scope
    that captures the mlp/moe halves leaves the all-to-all overlap off unless it is fixed too (validate._cuda_graphs:
    the two cannot be combined; `--fix` of both is refused there)."""
    out = K.search_columns(columns, problem.engine, n)
    graphs = _one(problem.fixed.get("cuda_graph_modules"))
    if graphs and "moe_a2a_overlap" not in problem.fixed and G.mask(graphs) & G.mask(("mlp", "moe")):
        out["moe_a2a_overlap"] = np.zeros(n, bool)
    return out


def refresh_searched(problem: Problem, lay: Layouts) -> Layouts:
    """`lay` with the switches the user did not fix set again as the search sets them, for candidates whose
    recompute or split a solver changed after enumeration (solvers/cpsat.py)."""
    cols = dict(tp=lay.tp, pp=lay.pp, vpp=lay.vpp, cp=lay.cp, ep=lay.ep, etp=lay.etp, dp=lay.dp, mbs=lay.mbs,
                fp8=lay.fp8, sp=lay.sp, zero=lay.zero, rc=lay.recompute, mods=lay.recompute_modules)
    fresh = searched_switches(problem, cols, len(lay))
    return Layouts(**{**lay.__dict__, **{k: v for k, v in fresh.items()
                                         if k not in problem.fixed and K.BY_NAME[k].search is not None}})


def _effective_recipe(problem: Problem) -> str:
    """The FP8 recipe every FP8 candidate runs: the one fixed, else the GPU's default (validate.py)."""
    recipe = _one(problem.fixed.get("fp8_recipe"))
    return effective_fp8_recipe(recipe, problem.cluster.gpu.id)


def _delayed_fp8(problem: Problem) -> bool:
    return _effective_recipe(problem) == "delayed"


# Switches the search does not vary: `--fix key=value` sets them on every candidate, and candidates that cannot
# carry the value (the key's rules in autoplan/switch_rules.py, which validate.py checks too; the model-wide rules of
# a module set are refused up front, Problem) are left out, so no plan silently lacks a setting the user fixed.
# key -> (Layouts column, rows that may carry value v).
SWITCHES = {k.name: (k.column_name, lambda p, lay, v, key=k.name: SR.allowed(key, p.model, lay, v))
            for k in K.SWITCHES + (K.BY_KEY["cuda_graph_modules"],)}
# Keys that only label a candidate (the cost model prices them alike): stamped on every plan by `stamp_fixed`.
LABELS = ("fp8", "fp8_recipe")


def _fixed_value(problem: Problem, key: str):
    want = problem.fixed[key]
    return want[0] if isinstance(want, (list, tuple)) else want


def _apply_switches(problem: Problem, lay: Layouts):
    """(candidates with the fixed switches set, rows that can carry them)."""
    cols, keep = {}, np.ones(len(lay), bool)
    for key, (col, allowed) in SWITCHES.items():
        if key not in problem.fixed:
            continue
        if K.BY_KEY[key].code is not None:  # a tuple value (e.g. module names) is one value; a list: alternatives
            want = K.BY_KEY[key].coded(_one(problem.fixed[key]))
        else:
            want = _fixed_value(problem, key)
        dtype = getattr(lay, col).dtype
        cols[col] = np.full(len(lay), want, dtype=dtype)
    if not cols:
        return lay, keep
    # Every rule reads the candidates with all fixed switches written (one switch's rule may test another's).
    lay = Layouts(**{**lay.__dict__, **cols})
    for key, (col, allowed) in SWITCHES.items():
        if key in problem.fixed:
            want = cols[col][0] if len(lay) else 0
            keep &= np.broadcast_to(allowed(problem, lay, want), (len(lay),))
    return lay, keep


def stamp_fixed(problem: Problem, strategy: Strategy) -> Strategy:
    """`strategy` with the FP8 format the user fixed on its FP8 GEMMs (a label: the cost model prices every format
    alike, so the grid holds FP8 as on or off)."""
    if strategy.uses_fp8 and "fp8" in problem.fixed and _fixed_value(problem, "fp8") != "none":
        return strategy.model_copy(update={"fp8": _fixed_value(problem, "fp8")})
    return strategy


def legal_strategies(problem: Problem) -> List[Strategy]:
    """Every legal strategy of a (small) space, as Strategy objects."""
    grid = enumerate_grid(problem)
    return [stamp_fixed(problem, grid.layouts.strategy(i)) for i in range(len(grid.layouts))]
