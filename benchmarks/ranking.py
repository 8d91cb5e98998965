"""Does the cost model order strategies the way the measurements do?

A setup is one model on one GPU type at one precision, sequence length and recipe source family (Megatron-Bridge
or NeMo) measured with several distinct strategies (layout, micro batch, GPU count or global batch differ).
Within a setup the measured tokens/s/GPU of one strategy is the geometric mean over the releases that ran it, so
release drift does not count as a strategy. Per setup with at least MIN_STRATEGIES strategies the Spearman rank
correlation (average ranks for ties) between predicted and measured tokens/s/GPU is reported; over every setup with
two or more strategies, the fraction of strategy pairs ordered as measured.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations
from typing import Dict, List, Sequence, Tuple

import numpy as np

from benchmarks.naive import precision_of

MIN_STRATEGIES = 3


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="mergesort")
    r = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the ranks; nan when either side is constant."""
    ra, rb = ranks(a), ranks(b)
    if np.std(ra) == 0 or np.std(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass(frozen=True)
class Setup:
    key: Tuple
    strategies: Tuple[str, ...]
    predicted: Tuple[float, ...]  # tokens/s/GPU
    measured: Tuple[float, ...]

    @property
    def rho(self) -> float:
        return spearman(self.predicted, self.measured)

    def pairs(self) -> Tuple[int, int]:
        """(pairs ordered as measured, pairs) over strategy pairs whose measurements differ."""
        good = total = 0
        for i, j in combinations(range(len(self.measured)), 2):
            if self.measured[i] == self.measured[j]:
                continue
            total += 1
            good += (self.predicted[i] - self.predicted[j]) * (self.measured[i] - self.measured[j]) > 0
        return good, total


def strategy_key(run) -> str:
    s = run.strategy
    return f"{run.cluster.num_gpus}g gbs{run.workload.global_batch_size} {s.label()}"


def setups(runs: Sequence, predicted: Sequence[float]) -> List[Setup]:
    """Setups with two or more distinct strategies, largest first."""
    groups: Dict[Tuple, Dict[str, List[Tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for run, pred in zip(runs, predicted):
        source = "mb" if run.id.startswith("mb_") else "nemo"
        key = (run.model_name, run.gpu, precision_of(run), run.workload.seq_len, source)
        groups[key][strategy_key(run)].append((pred, run.measured_tokens_per_gpu))
    out = []
    for key, by_strategy in groups.items():
        if len(by_strategy) < 2:
            continue
        names = tuple(sorted(by_strategy))
        pred = tuple(float(np.exp(np.mean(np.log([p for p, _ in by_strategy[n]])))) for n in names)
        meas = tuple(float(np.exp(np.mean(np.log([m for _, m in by_strategy[n]])))) for n in names)
        out.append(Setup(key, names, pred, meas))
    return sorted(out, key=lambda s: (-len(s.strategies), s.key))


def summary(found: Sequence[Setup]) -> Dict[str, object]:
    ranked = [s for s in found if len(s.strategies) >= MIN_STRATEGIES]
    good = sum(s.pairs()[0] for s in found)
    total = sum(s.pairs()[1] for s in found)
    rhos = [s.rho for s in ranked if not np.isnan(s.rho)]
    return {
        "setups": [{"setup": " ".join(str(k) for k in s.key), "strategies": len(s.strategies),
                    "rho": s.rho, "pairs_ordered": s.pairs()[0], "pairs": s.pairs()[1]} for s in found],
        "ranked_setups": len(ranked),
        "mean_rho": float(np.mean(rhos)) if rhos else float("nan"),
        "setups_rho_at_least_0.8": sum(r >= 0.8 for r in rhos),
        "pairs_ordered": good, "pairs": total,
    }
