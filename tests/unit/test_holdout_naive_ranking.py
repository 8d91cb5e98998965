"""The hold-out split, the naive bar and the ranking statistic of the accuracy benchmark."""
import hashlib
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` lives at the repository root, outside the installed package

from autoplan.clusterio import load_cluster  # noqa: E402
from autoplan.modelio import load_model  # noqa: E402
from autoplan.workload import Workload  # noqa: E402
from benchmarks import holdout, ranking  # noqa: E402
from benchmarks.naive import NaiveBar, achieved_tflops  # noqa: E402
from benchmarks.published import read_rows  # noqa: E402


def test_every_published_row_has_a_family_and_a_source():
    # Rows whose architecture the table does not give (DeepSeek-V4) are never priced, so they have no family.
    for row in (r for r in read_rows() if not r["model"].startswith("DeepSeekV4")):
        assert holdout.family_of(row["model"]) in holdout.ARCH_OF_FAMILY
        assert holdout.source_of(row["id"]) in holdout.SOURCES


def test_unknown_family_or_source_is_refused_not_guessed():
    with pytest.raises(ValueError, match="no family"):
        holdout.family_of("Falcon-180B")
    with pytest.raises(ValueError, match="not in benchmarks/holdout.py SOURCES"):
        holdout.source_of("paper_megascale_175b")


def test_split_follows_the_stated_hash_rule():
    order = sorted(holdout.SOURCES, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    assert holdout.held_out_sources() == tuple(order[::3])
    for arch in ("dense", "moe"):
        fams = sorted((f for f, a in holdout.ARCH_OF_FAMILY.items() if a == arch),
                      key=lambda n: hashlib.sha256(n.encode()).hexdigest())
        assert set(fams[::3]) <= set(holdout.held_out_families())
        assert not set(fams) - set(fams[::3]) & set(holdout.held_out_families())


def test_both_architectures_keep_training_and_held_out_families():
    held = set(holdout.held_out_families())
    for arch in ("dense", "moe"):
        fams = {f for f, a in holdout.ARCH_OF_FAMILY.items() if a == arch}
        assert fams & held and fams - held


def test_a_row_trains_only_when_family_and_source_both_train():
    train_src = next(s for s in holdout.SOURCES if s not in holdout.held_out_sources() + holdout.TEST_SOURCES
                     and s.startswith("mb-"))
    held_src = next(s for s in holdout.held_out_sources() if s.startswith("mb-"))
    train_model = next(m for m, f in (("LLAMA3_70B", "llama3"), ("GPT3-5B", "gpt3"))
                       if f not in holdout.held_out_families() + holdout.TEST_FAMILIES)
    held_model = next(p for p, f in holdout.FAMILY_PREFIXES if f in holdout.held_out_families())
    row = lambda src: f"mb_{src[3:]}_pre-training_x_tok"  # noqa: E731
    assert holdout.side(train_model, row(train_src)) == "train"
    assert holdout.side(train_model, row(held_src)) == "source"
    assert holdout.side(held_model, row(train_src)) == "family"
    runs = [SimpleNamespace(model_name=train_model, id=row(train_src)),
            SimpleNamespace(model_name=held_model, id=row(held_src))]
    sides = holdout.split(runs)
    assert sides["train"] == [0] and sides["holdout"] == [1] and sides["family"] == [1]


def _run(gpu, precision, arch, tokens, model="llama3-8b", seq=8192):
    m = load_model(model)
    return SimpleNamespace(model=m, workload=Workload(seq_len=seq, global_batch_size=128), gpu=gpu,
                           precision=precision, arch=arch, measured_tokens_per_gpu=tokens,
                           strategy=SimpleNamespace(fp8_recipe=None), cluster=load_cluster(gpu, 8))


def test_naive_bar_is_the_geometric_mean_of_achieved_tflops_per_key():
    a, b = _run("h100", "fp8", "dense", 10000.0), _run("h100", "fp8", "dense", 40000.0)
    bar = NaiveBar.fit([a, b])
    expected = np.sqrt(achieved_tflops(a) * achieved_tflops(b))
    assert bar.tflops(_run("h100", "fp8", "dense", 1.0)) == pytest.approx(expected)
    # Same TFLOP/s, so tokens/s scale inversely with FLOPs per token.
    long = _run("h100", "fp8", "dense", 1.0, seq=16384)
    assert bar.predict(long) < bar.predict(_run("h100", "fp8", "dense", 1.0))


def test_naive_bar_falls_back_to_a_fraction_of_the_gpu_peak():
    h100 = _run("h100", "fp8", "dense", 10000.0)
    bar = NaiveBar.fit([h100])
    b200 = _run("b200", "fp8", "dense", 1.0)
    mfu = achieved_tflops(h100) / h100.cluster.gpu.peak_tflops["fp8"]
    assert bar.tflops(b200) == pytest.approx(mfu * b200.cluster.gpu.peak_tflops["fp8"])
    assert bar.levels_used["MFU precision x arch"] == 1


def test_spearman_matches_the_textbook_values():
    assert ranking.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert ranking.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert ranking.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert list(ranking.ranks([5, 1, 5])) == [2.5, 1.0, 2.5]
    assert np.isnan(ranking.spearman([1, 1, 1], [1, 2, 3]))


def test_setups_average_releases_of_one_strategy_and_count_ordered_pairs():
    def run(i, tp, meas):
        s = SimpleNamespace(label=lambda: f"tp{tp}")
        return SimpleNamespace(id=f"mb_26.02_{i}", model_name="M", gpu="gb200", precision="fp8",
                               workload=Workload(seq_len=8192, global_batch_size=256),
                               cluster=SimpleNamespace(num_gpus=64), strategy=s, measured_tokens_per_gpu=meas)
    runs = [run(0, 1, 100.0), run(1, 1, 400.0), run(2, 2, 150.0), run(3, 4, 300.0)]
    found = ranking.setups(runs, [220.0, 180.0, 100.0, 250.0])
    assert len(found) == 1 and len(found[0].strategies) == 3
    s = found[0]
    assert s.measured[s.strategies.index("64g gbs256 tp1")] == pytest.approx(200.0)  # geometric mean
    assert s.pairs() == (3, 3) and s.rho == pytest.approx(1.0)


def test_report_fits_on_training_rows_and_scores_only_held_out_ones():
    from benchmarks.accuracy import build_report, headline_runs, predict, row_records

    runs, excluded, no_fit = headline_runs()
    sides = holdout.split(runs)
    pick = sides["train"][:6] + sides["family"][:3] + sides["source"][:3]
    subset = [runs[i] for i in pick]
    results = predict(subset)
    rep = build_report(subset, results, no_fit, max_evals=12)
    assert rep.train_rows == 6 and len(rep.held) == 6
    # Each held-out row's record carries its error under the training-row constants; training rows carry none.
    records = row_records(results, rep)
    held_errors = {records[i]["id"]: records[i]["holdout_error_pct"] for i in rep.held}
    assert held_errors == {subset[i].id: round(e * 100.0, 2) for i, e in zip(rep.held, rep.model_out)}
    assert sum(r["holdout_error_pct"] is None for r in records) == 6
    assert set(rep.held_side) == {"family", "source"}
    assert np.all(np.isfinite(rep.model_out)) and np.all(np.isfinite(rep.naive_out))
    table = dict(rep.table(lambda r: "all"))["all"]
    assert table["rows"] == 12 and table["held"] == 6
    # Every excluded row names its reason, and none of them is a regression judged from errors.
    assert excluded and all(why and "weaker GPU" not in why for _, why in excluded)


def test_the_frozen_test_split_is_the_stated_rule_and_never_trains_or_validates():
    # The family is the first MoE family in SHA-256 order that the validation rule trains on; the source is the
    # newest Megatron-Bridge release in the table.
    assert holdout.TEST_FAMILIES == (holdout.test_family_by_rule(),)
    newest = max((s for s in holdout.SOURCES if s.startswith("mb-")), key=lambda s: tuple(map(int, s[3:].split("."))))
    assert holdout.TEST_SOURCES == (newest,)
    for offset in range(holdout.HOLD_EVERY):
        assert not set(holdout.TEST_FAMILIES) & set(holdout.held_out_families(offset))
        assert not set(holdout.TEST_SOURCES) & set(holdout.held_out_sources(offset))
    rows = [SimpleNamespace(model_name=m, id=f"mb_{src[3:]}_pre-training_x_tok")
            for m in ("GPT OSS 120B", "LLAMA3_70B", "DeepSeekV3") for src in holdout.SOURCES if src.startswith("mb-")]
    for offset in range(holdout.HOLD_EVERY):
        sides = holdout.split(rows, offset)
        test = set(sides["test"])
        assert test == {i for i, r in enumerate(rows) if r.model_name.startswith("GPT OSS") or "26.08" in r.id}
        assert not test & (set(sides["train"]) | set(sides["holdout"]))


def test_rotation_holds_out_other_names():
    assert holdout.held_out_sources(0) != holdout.held_out_sources(1)
    assert set(holdout.held_out_families(1)).isdisjoint(holdout.held_out_families(0))
