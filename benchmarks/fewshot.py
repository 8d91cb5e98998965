"""Few-shot calibration on the published runs: calibrate on one run, predict the others of its group.

A group is the published runs of one (GPU, software release, GEMM precision): one cluster type running one software
stack, as a user's own cluster would be. For every group with at least 2 runs, each of its runs in turn is the one
calibration run (`autoplan.calibration.fit.fit`, the fitter `autoplan calibrate` uses, with its priors); the other
runs of the group are predicted with the fitted constants. Printed beside it, on the same predicted rows:
- the uncalibrated model (the priors: profiles/gpus and autoplan/costmodel/calibration.py);
- the naive constant-throughput bar (benchmarks/naive.py) given the same one run: its achieved model TFLOP/s per GPU
  carried to the other runs of the group.
MAPE is the mean over every (calibration run, predicted run) pair, split by architecture (dense / MoE).

Ranking: within each multi-layout setup of `benchmarks/ranking.py` (one model on one GPU type at one precision,
sequence length and source family, measured with 3 or more strategies; a strategy measured in several releases
counts once, at the geometric mean), calibrate on each of its runs in turn and report Spearman's rho between
predicted and measured tokens/s/GPU over its strategies (mean and minimum over the calibration choices); the
uncalibrated model's rho beside it. Rows the source flags as regressed (`benchmarks.accuracy.FOOTNOTE`) are left
out. Below the rho table, each setup's strategy pairs are split by release (`release_pairs`): two layouts measured in
one release (one software stack: a layout comparison), and apart from them two strategies never measured in one
release, whose order in the rho above also carries the drift between their releases. Both are printed; the rho
table is not regrouped. A within-release pair measured closer than the run noise (`fit.RUN_SIGMA`) is marked a tie.

Split (`benchmarks/holdout.py`): by default (`--split validation`) the rows of the frozen test split are left out
altogether (no group, setup or pair holds one); these are the figures the model and the fit are chosen by.
`--split test` evaluates the test split once a change is final: the pairs whose predicted run is a test row (the
calibration run is any other run of its group) and the ranking setups that hold a test row.

    python -m benchmarks.fewshot                  # both parts on the validation rows, about 20 minutes on 2 cores
    python -m benchmarks.fewshot --part ranking   # the ranking part only
    python -m benchmarks.fewshot --split test     # the frozen test split (once a change is final)
    python -m benchmarks.fewshot --part discrepancy   # fit.MODEL_SIGMA, STACK_SIGMA and UNLIKE_REFERENCE's figures
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from typing import Dict, List, Sequence, Tuple

import numpy as np

from autoplan.calibration.fit import RUN_SIGMA, Predictor, fit, priors_of
from autoplan.calibration.runs import MeasuredRun
from benchmarks.naive import NaiveBar, precision_of
from benchmarks.published import PublishedRun



def release_of(run: PublishedRun, source: str) -> str:
    """The software release a row was measured with: the container its source names (a Megatron-Bridge section
    '26.04.01 NeMo Container', NeMo's '24.07 perf numbers' or 'container NeMo24.03'), else the source document (one
    document, one release)."""
    m = re.search(r"(?:section '|\(')(\d\d\.\d\d(?:\.\d\d)?)|NeMo ?(\d\d\.\d\d)", source)
    return (m.group(1) or m.group(2)) if m else source.split(" @ ")[0].split(",")[0]


def measured_run(run: PublishedRun) -> MeasuredRun:
    step = run.workload.tokens_per_step / (run.measured_tokens_per_gpu * run.cluster.num_gpus)
    return MeasuredRun(label=run.id, source="data/published_runs.csv", model=run.model, cluster=run.cluster,
                       workload=run.workload, strategy=run.strategy, engine="megatron", step_time_s=step)


def tokens_per_gpu(run: PublishedRun, step_s: float) -> float:
    return run.workload.tokens_per_step / step_s / run.cluster.num_gpus


def predict(runs: Sequence[PublishedRun], values: Dict[str, float]) -> np.ndarray:
    steps = Predictor([measured_run(r) for r in runs]).step_times(values)
    return np.array([tokens_per_gpu(r, s) for r, s in zip(runs, steps)])


def groups(runs: Sequence[PublishedRun], sources: Dict[str, str]) -> Dict[Tuple, List[PublishedRun]]:
    out: Dict[Tuple, List[PublishedRun]] = defaultdict(list)
    for r in runs:
        out[(r.gpu, release_of(r, sources[r.id]), precision_of(r))].append(r)
    return {k: v for k, v in out.items() if len(v) >= 2}


def few_shot(group: List[PublishedRun], log=print, predicted=lambda run: True
             ) -> List[Tuple[str, float, float, float]]:
    """(arch, calibrated error, uncalibrated error, naive error) of every (calibration run, predicted run) pair whose
    predicted run passes `predicted`."""
    priors = priors_of(group[0].cluster)
    prior_pred = predict(group, priors)
    measured = np.array([r.measured_tokens_per_gpu for r in group])
    out = []
    for i, cal_run in enumerate(group):
        values = fit([measured_run(cal_run)]).values
        others = [j for j in range(len(group)) if j != i and predicted(group[j])]
        if not others:
            continue
        pred = predict([group[j] for j in others], {**priors, **values})
        naive = NaiveBar.fit([cal_run])
        for k, j in enumerate(others):
            out.append((group[j].arch, pred[k] / measured[j] - 1, prior_pred[j] / measured[j] - 1,
                        naive.predict(group[j]) / measured[j] - 1))
        log(f"    calibrated on {cal_run.id}")
    return out


def setup_runs(runs: Sequence[PublishedRun]) -> Dict[Tuple, List[PublishedRun]]:
    """The runs of every ranking setup with MIN_STRATEGIES or more strategies (benchmarks/ranking.py's grouping)."""
    from benchmarks import ranking

    ranked = {s.key for s in ranking.setups(runs, [1.0] * len(runs))
              if len(s.strategies) >= ranking.MIN_STRATEGIES}
    out: Dict[Tuple, List[PublishedRun]] = defaultdict(list)
    for r in runs:
        key = (r.model_name, r.gpu, precision_of(r), r.workload.seq_len, "mb" if r.id.startswith("mb_") else "nemo")
        if key in ranked:
            out[key].append(r)
    return out


def rank_rho(setup: List[PublishedRun], predicted: Sequence[float]) -> float:
    from benchmarks import ranking

    (found,) = ranking.setups(setup, list(predicted))
    return found.rho


def setup_ranking(setup: List[PublishedRun], log=print) -> Tuple[List[np.ndarray], np.ndarray]:
    """(predicted tokens/s/GPU of the setup's runs after calibrating on each of its runs in turn, uncalibrated)."""
    priors = priors_of(setup[0].cluster)
    calibrated = []
    for r in setup:
        calibrated.append(predict(setup, {**priors, **fit([measured_run(r)]).values}))
        log(f"    calibrated on {r.id}: rho {rank_rho(setup, calibrated[-1]):+.2f}")
    return calibrated, predict(setup, priors)


def release_pairs(setup: List[PublishedRun], sources: Dict[str, str]) -> Tuple[List[Tuple], List[Tuple]]:
    """The setup's strategy pairs split by release: (within, across). within: (release, i, j) for two runs of one
    release with different strategies, i.e. a layout comparison on one software stack. across: (strategy a, strategy
    b, indices of a's runs, indices of b's runs) for two strategies never measured in one release, which
    `benchmarks/ranking.py` compares through their geometric means over different releases, so release-to-release
    drift enters their order."""
    from itertools import combinations

    from benchmarks import ranking

    release = [release_of(r, sources[r.id]) for r in setup]
    strategy = [ranking.strategy_key(r) for r in setup]
    within = [(release[i], i, j) for i, j in combinations(range(len(setup)), 2)
              if release[i] == release[j] and strategy[i] != strategy[j]]
    runs_of: Dict[str, List[int]] = defaultdict(list)
    for i, name in enumerate(strategy):
        runs_of[name].append(i)
    across = [(a, b, runs_of[a], runs_of[b]) for a, b in combinations(sorted(runs_of), 2)
              if not {release[i] for i in runs_of[a]} & {release[i] for i in runs_of[b]}]
    return within, across


def geo(values: Sequence[float], idx: Sequence[int]) -> float:
    return float(np.exp(np.mean(np.log([values[i] for i in idx]))))


def discrepancy(runs: Sequence[PublishedRun], sources: Dict[str, str]) -> Dict[str, Tuple[float, float, int]]:
    """arch -> (within, between, groups) of the uncalibrated model's log error over the (GPU, release, precision)
    groups of that architecture, the test split (benchmarks/holdout.py) left out:
    - within: the pooled within-group standard deviation, the scatter among runs of one group where every constant
      is the same, i.e. the model's setup-specific (structural) error that no cluster constant can remove
      (autoplan/calibration/fit.py MODEL_SIGMA);
    - between: the standard deviation of the group means less their sampling noise (one-way random-effects
      estimate, var(means) - mean(within^2 / runs), floored at 0), i.e. the part of the error one cluster and stack
      share, the part a calibration run can carry to its other runs (fit.STACK_SIGMA)."""
    from benchmarks import holdout

    runs = [r for r in runs if not holdout.is_test(r.model_name, r.id)]
    out = {}
    for arch in ("dense", "moe"):
        sq, dof = 0.0, 0
        means, sizes = [], []
        for key, group in groups([r for r in runs if r.arch == arch], sources).items():
            errs = np.log(predict(group, priors_of(group[0].cluster)) /
                          np.array([r.measured_tokens_per_gpu for r in group]))
            sq += float(np.sum((errs - errs.mean()) ** 2))
            dof += len(errs) - 1
            means.append(float(errs.mean()))
            sizes.append(len(errs))
        within = float(np.sqrt(sq / dof)) if dof else float("nan")
        between = float(np.sqrt(max(0.0, float(np.var(means, ddof=1)) - float(np.mean(
            [within ** 2 / n for n in sizes]))))) if len(means) > 1 else float("nan")
        out[arch] = (within, between, len(means))
    return out


def unlike_reference(runs: Sequence[PublishedRun], sources: Dict[str, str]) -> Tuple[float, float, int]:
    """(expected groups unlike the reference, prior probability of a group unlike the reference, groups): the
    mixing probability of autoplan/calibration/fit.py's two hypotheses over the (GPU, release, precision) groups,
    test split left out. Each group's log Bayes factor is the one `fit.prior_spreads` weighs for a user's runs
    (`fit.unlike_log_odds`, linearised at the priors, the runs' covariance `fit.run_covariance`); the probability is
    found by expectation-maximisation (Dempster, Laird & Rubin 1977) with the rule of succession as its update,
    (expected groups unlike + 1) / (groups + 2), iterated to its fixed point (fit.UNLIKE_REFERENCE)."""
    from autoplan.calibration.fit import linearised, run_covariance, unlike_log_odds
    from autoplan.calibration.params import CONSTANTS
    from benchmarks import holdout

    runs = [r for r in runs if not holdout.is_test(r.model_name, r.id)]
    sd = np.array([c.prior_sd for c in CONSTANTS])
    log_bf = []
    for group in groups(runs, sources).values():
        measured = [measured_run(r) for r in group]
        residual, jd = linearised(measured)
        log_bf.append(unlike_log_odds(jd, residual, run_covariance(measured), sd))
    expected, p = mixing_probability(log_bf)
    return expected, p, len(log_bf)


def mixing_probability(log_bf: Sequence[float]) -> Tuple[float, float]:
    """(expected groups unlike the reference, prior probability of one) from each group's log Bayes factor (unlike
    against reference): EM, each step the groups' posterior probabilities under the current prior (E) and the rule
    of succession (expected + 1) / (groups + 2) as the new prior (M), from 1/2 to its fixed point."""
    log_bf = np.asarray(log_bf, dtype=float)
    p, expected = 0.5, 0.0
    for _ in range(1000):
        expected = float(np.sum(1.0 / (1.0 + np.exp(-(log_bf + np.log(p / (1.0 - p)))))))
        p, last = (expected + 1.0) / (len(log_bf) + 2.0), p
        if abs(p - last) < 1e-9:
            break
    return expected, p


def mape(errors: Sequence[float]) -> float:
    return float(np.mean(np.abs(errors)) * 100) if len(errors) else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quiet", action="store_true", help="No progress lines.")
    ap.add_argument("--part", choices=("all", "mape", "ranking", "discrepancy"), default="all",
                    help="Which figures to compute.")
    ap.add_argument("--split", choices=("validation", "test"), default="validation",
                    help="validation: the test split's rows left out (default); test: the frozen test split's pairs "
                         "and setups (once a change is final).")
    args = ap.parse_args(argv)
    from benchmarks import holdout
    from benchmarks.accuracy import headline_runs
    from benchmarks.published import read_rows

    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    runs, _, footnote = headline_runs()
    runs = [r for r in runs if r.id not in footnote]
    sources = {row["id"]: row["source"] for row in read_rows()}
    if args.part == "discrepancy":
        for arch, (within, between, n) in discrepancy(runs, sources).items():
            print(f"model discrepancy {arch}: within-group SD of the uncalibrated log error {within:.3f}, "
                  f"between-group SD of its group means {between:.3f} ({n} groups)")
        expected, p, n = unlike_reference(runs, sources)
        print(f"clusters unlike the reference stack: {expected:.2f} of {n} (GPU, release, precision) groups expected "
              f"(EM), prior probability (expected + 1) / (groups + 2) = {p:.3f}")
        return 0
    is_test = lambda r: holdout.is_test(r.model_name, r.id)  # noqa: E731
    if args.split == "validation":
        runs, predicted = [r for r in runs if not is_test(r)], (lambda r: True)
    else:
        predicted = is_test
    what = "test rows left out" if args.split == "validation" else "pairs predicting a test row, setups holding one"
    print(f"Split: {args.split} ({what})")
    if args.part in ("all", "mape"):
        few_shot_table(runs, sources, log, predicted)
    if args.part in ("all", "ranking"):
        ranking_table(runs, sources, log, predicted)
    return 0


def few_shot_table(runs: Sequence[PublishedRun], sources: Dict[str, str], log, predicted=lambda r: True) -> None:
    pairs: List[Tuple] = []
    print("Few-shot: calibrate on one run of a (GPU, release, precision) group, predict the others "
          "(MAPE of tokens/s/GPU over every pair)")
    print(f"  {'group':34s} {'runs':>4s} {'calibrated':>10s} {'uncalibrated':>12s} {'naive bar':>9s}")
    for key, group in sorted(groups(runs, sources).items()):
        if not any(predicted(r) for r in group):
            continue
        log(f"  group {key}")
        rows = few_shot(group, log, predicted)
        pairs += rows
        print(f"  {'/'.join(key):34s} {len(group):4d} {mape([r[1] for r in rows]):9.1f}% "
              f"{mape([r[2] for r in rows]):11.1f}% {mape([r[3] for r in rows]):8.1f}%")
    print(f"  {'all pairs':34s} {len(pairs):4d} {mape([p[1] for p in pairs]):9.1f}% "
          f"{mape([p[2] for p in pairs]):11.1f}% {mape([p[3] for p in pairs]):8.1f}%")
    for arch, target in (("dense", 5.0), ("moe", 8.0)):
        sel = [p for p in pairs if p[0] == arch]
        print(f"  {arch + ' pairs':34s} {len(sel):4d} {mape([p[1] for p in sel]):9.1f}% "
              f"{mape([p[2] for p in sel]):11.1f}% {mape([p[3] for p in sel]):8.1f}%   (target <= {target:g}%)")


def ranking_table(runs: Sequence[PublishedRun], sources: Dict[str, str], log, predicted=lambda r: True) -> None:
    from benchmarks import ranking

    print(f"Ranking within multi-strategy setups ({ranking.MIN_STRATEGIES}+ strategies): Spearman rho after "
          f"calibrating on one of its runs (mean, min over the choices; target >= 0.9) and uncalibrated")
    means, details = [], []
    for key, setup in sorted(setup_runs(runs).items()):
        if not any(predicted(r) for r in setup):
            continue
        log(f"  setup {key}")
        calibrated, prior = setup_ranking(setup, log)
        rhos = [rank_rho(setup, c) for c in calibrated]
        mean, low = float(np.nanmean(rhos)), float(np.nanmin(rhos))
        means.append(mean)
        name = ' '.join(str(k) for k in key)
        print(f"  {name:44s} {len(setup):2d} runs  rho {mean:+.2f} (min {low:+.2f})  "
              f"uncalibrated {rank_rho(setup, prior):+.2f}", flush=True)
        details.append((name, setup, calibrated, prior))
    print(f"  setups with mean rho >= 0.9: {sum(m >= 0.9 for m in means)} of {len(means)}")
    release_table(details, sources)


def release_table(details, sources: Dict[str, str]) -> None:
    """Each setup's strategy pairs split by release (`release_pairs`): the layout comparisons within one release,
    and apart from them the strategies only ever measured in different releases, whose order the rho above also
    counts."""
    from benchmarks import ranking

    print("The same setups' strategy pairs by release: within one release (measured and predicted tokens/s/GPU; "
          "ordered as measured uncalibrated, and in how many of the calibration choices) and, apart, strategies "
          "never measured in one release (geometric means over their releases)")
    for name, setup, calibrated, prior in details:
        within, across = release_pairs(setup, sources)
        measured = [r.measured_tokens_per_gpu for r in setup]
        label = [ranking.strategy_key(r) for r in setup]
        good = [0, 0]
        print(f"  {name}")
        for rel, i, j in within:
            order = lambda p: (p[i] - p[j]) * (measured[i] - measured[j]) > 0  # noqa: E731
            hits = sum(order(c) for c in calibrated)
            gap = abs(math.log(measured[i] / measured[j]))
            tie = gap < RUN_SIGMA  # closer than two launches of one setup differ: no order to get right
            good[0] += order(prior) and not tie
            good[1] += not tie
            print(f"    within {rel:9s} {label[i]} vs {label[j]}: measured {measured[i]:.0f} vs {measured[j]:.0f}, "
                  f"predicted {prior[i]:.0f} vs {prior[j]:.0f}: {'ordered' if order(prior) else 'NOT ordered'} "
                  f"({hits} of {len(calibrated)} calibrated)"
                  + (f"; measured gap {gap:.1%} < the run noise {RUN_SIGMA:.0%} (fit.RUN_SIGMA): a tie" if tie else ""))
        for a, b, ia, ib in across:
            ma, mb, pa, pb = geo(measured, ia), geo(measured, ib), geo(prior, ia), geo(prior, ib)
            hits = sum((geo(c, ia) - geo(c, ib)) * (ma - mb) > 0 for c in calibrated)
            rel = lambda idx: "+".join(sorted({release_of(setup[k], sources[setup[k].id]) for k in idx}))  # noqa
            print(f"    across    {a} ({rel(ia)}) vs {b} ({rel(ib)}): measured {ma:.0f} vs {mb:.0f}, predicted "
                  f"{pa:.0f} vs {pb:.0f}: {'ordered' if (pa - pb) * (ma - mb) > 0 else 'NOT ordered'} "
                  f"({hits} of {len(calibrated)} calibrated)")
        print(f"    within-release pairs ordered as measured (uncalibrated, ties left out): {good[0]} of {good[1]}; "
              f"pairs across releases only: {len(across)}")


if __name__ == "__main__":
    sys.exit(main())
