"""Search encoder placements: inherit (the language model's grid, stage 0 carrying the encoder, first/last stage
layer counts searched) and disjoint (an encoder grid of whole nodes with its own TP and DP, the rest for the language
model), each with and without encoder recompute, over micro-batch sizes 1 and 2 and, for an MoE language model,
expert-parallel degrees."""
from __future__ import annotations

from typing import List, Tuple

from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.multimodal.placement import Placement, Priced, price, stage_splits
from autoplan.multimodal.spec import Freeze, ImageData, MultimodalSpec
from autoplan.strategy import Strategy
from autoplan.valid_values import valid_ep
from autoplan.workload import Workload

TP_DEGREES = (1, 2, 4, 8)
MBS = (1, 2)
MAX_EP = 64


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _llm_strategies(spec: MultimodalSpec, gpus: int, wl: Workload, gpus_per_node: int, splits: bool):
    llm = spec.llm
    for tp in TP_DEGREES:
        if tp > gpus_per_node or gpus % tp or llm.num_attention_heads % tp or \
                (llm.num_query_groups % tp and tp % llm.num_query_groups):
            continue
        for pp in _divisors(gpus // tp):
            if pp > llm.num_layers // 2 and pp > 1:
                continue
            dp = gpus // (tp * pp)
            # An MoE language model's experts spread over ep ranks (etp 1, folded over tp x dp: valid_values.py
            # valid_ep), powers of two up to MAX_EP only: `plan` tries every legal degree, but here each one
            # multiplies the encoder placements, and this keeps the joint search to seconds.
            eps = [e for e in valid_ep(llm, gpus, 1, pp) if e & (e - 1) == 0 and e <= MAX_EP] if llm.is_moe else [1]
            for mbs in MBS:
                if wl.global_batch_size % (mbs * dp):
                    continue
                mid = llm.num_layers / pp
                for first, last in stage_splits(llm.num_layers, pp):
                    if first is not None and (not splits and llm.num_layers % pp == 0):
                        continue
                    if first is not None and not (first <= mid + 1 and abs(last - mid) <= 8):
                        continue
                    for ep in eps:
                        yield Strategy(tp=tp, pp=pp, ep=ep, mbs=mbs, sp=tp > 1, zero=1, recompute="selective",
                                       first_stage_layers=first, last_stage_layers=last)


def search(spec: MultimodalSpec, cluster: ClusterSpec, wl: Workload, data: ImageData, freeze: Freeze, *,
           kinds: Tuple[str, ...] = ("inherit", "disjoint"), cal: Calibration = DEFAULT,
           headroom: float = 0.0) -> List[Priced]:
    """The priced placements, fastest (mean load) first: every one that fits, and those whose language model alone
    fits; when nothing fits, the placement that needs the least memory and those priced to find it."""
    gpus, per_node = cluster.num_gpus, cluster.gpu.gpus_per_node
    placements: List[Placement] = []
    if "inherit" in kinds:
        for s in _llm_strategies(spec, gpus, wl, per_node, splits=True):
            for rc in (False, True):
                placements.append(Placement("inherit", s, gpus, encoder_recompute=rc))
    if "disjoint" in kinds:
        # Encoder grids of 1, 2 or any multiple of 4 GPUs up to half the GPUs (MIMO places ranks freely; a
        # multiple of 4 keeps the remaining language grid divisible by the TP degrees searched).
        sizes = sorted({1, 2} | set(range(4, gpus // 2 + 1, 4)))
        for enc in sizes:
            for etp in TP_DEGREES:
                if etp > per_node or enc % etp or spec.vision.num_heads % etp:
                    continue
                edp = enc // etp
                for s in _llm_strategies(spec, gpus - enc, wl, per_node, splits=False):
                    llm_dp = (gpus - enc) // (s.tp * s.pp)
                    # Megatron-LM examples/mimo/training/args.py line 102: (mbs * llm_dp * GTP) % encoder_dp == 0.
                    if (s.mbs * llm_dp) % edp:
                        continue
                    for rc in (False, True):
                        placements.append(Placement("disjoint", s, gpus - enc, etp, edp, rc))
    # Placements whose language model alone cannot fit are left unpriced: the fitting ones and their order are the
    # same as pricing every one. When nothing fits, those that bound the least memory needed are priced to name it.
    priced = price(spec, cluster, wl, data, freeze, placements, cal, headroom, select="fitting")
    return sorted(priced, key=lambda p: (not p.fits, p.step_s))


def best_of(priced: List[Priced], kind: str):
    fits = [p for p in priced if p.placement.kind == kind and p.fits]
    return fits[0] if fits else None
