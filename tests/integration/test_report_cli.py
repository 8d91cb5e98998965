"""`autoplan report` and `autoplan compare`: saved plans and estimates read back, the comparison's keys and terms,
self-contained pages, and bad input refused in one line (exit 2) with nothing written."""
from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli as _run
from autoplan.cluster import ClusterSpec
from autoplan.clusterio import load_gpu
from autoplan.costmodel.estimate import estimate
from autoplan.modelio import load_model
from autoplan.report.compare import term_differences
from autoplan.report.inputs import load_saved
from autoplan.results import Plan
from autoplan.strategy import Strategy
from autoplan.validate import validate
from autoplan.workload import Workload


def _plan(**strategy) -> Plan:
    m, c = load_model("llama3-8b"), ClusterSpec(gpu=load_gpu("h100"), num_gpus=16)
    wl = Workload(seq_len=4096, global_batch_size=32)
    s = validate(m, c, wl, Strategy(**strategy))
    return Plan(model=m, cluster=c, workload=wl, strategy=s, estimate=estimate(m, c, s, wl))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    fast = _plan(tp=2, pp=2, vpp=4, mbs=1, sp=True, zero=1)
    slow = _plan(tp=8, pp=2, mbs=1, sp=True, zero=1)
    (folder / "fast.json").write_text(fast.model_dump_json())
    (folder / "slow.json").write_text(slow.model_dump_json())
    est = {**slow.estimate.contract(), "strategy": slow.strategy.to_dict()}  # what estimate --json prints
    (folder / "estimate.json").write_text(json.dumps(est))
    return folder, fast, slow


def test_compare_names_the_differing_keys_and_the_largest_term_first(saved, capsys):
    folder, fast, slow = saved
    code, out, _ = _run(["compare", str(folder / "slow.json"), str(folder / "fast.json")], capsys)
    assert code == 0
    keys = re.search(r"strategy keys that differ: (.*)", out).group(1)
    assert "tp: 8 / 2" in keys and "vpp: 1 / 4" in keys and "sp:" not in keys
    why = " ".join(out[out.index("fast.json is "):].split())
    ratio = slow.estimate.step_time_s / fast.estimate.step_time_s
    assert why.startswith(f"fast.json is {ratio:.3f}x faster than slow.json")
    terms = re.findall(r"(\w+) ([+-]\d+\.\d+) s", why.split("against it:")[1])
    expected = [(k, d) for k, d in term_differences(load_saved(str(folder / "fast.json")),
                                                    load_saved(str(folder / "slow.json")))]
    assert [t for t, _ in terms] == [k for k, _ in expected]
    sizes = [abs(float(d)) for _, d in terms]
    assert sizes == sorted(sizes, reverse=True)


def test_compare_reads_an_estimate_file(saved, capsys):
    folder, fast, slow = saved
    code, out, _ = _run(["compare", str(folder / "estimate.json"), str(folder / "fast.json")], capsys)
    assert code == 0
    assert f"{slow.estimate.step_time_s:.3f}" in out and f"{fast.estimate.step_time_s:.3f}" in out


def test_report_page_is_self_contained(saved, tmp_path, capsys):
    folder, fast, _ = saved
    page = tmp_path / "fast.html"
    code, out, _ = _run(["report", str(folder / "fast.json"), "--out", str(page), "--no-front"], capsys)
    assert code == 0 and f"wrote {page}" in out
    text = page.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # nothing fetched at view time
    assert "Plotly.newPlot" in text and '"name":"forward"' in text
    s = fast.strategy
    bars = json.loads(re.search(r"var figures = (\{.*?\});\n", text, re.S).group(1))["timeline"]["data"]
    forward = next(t for t in bars if t["name"] == "forward")
    assert len(forward["x"]) == s.pp * s.vpp * fast.estimate.num_microbatches


@pytest.mark.parametrize("args,needle", [
    (["report", "{folder}/estimate.json"], "estimate without its model"),
    (["report", "{folder}/missing.json"], "does not exist"),
    (["report", "{folder}/fast.json", "--out", "{folder}/no/such/dir/x.html"], "does not exist"),
    (["report", "{folder}/fast.json", "--engine", "vllm"], "--engine"),
    (["compare", "{folder}/fast.json"], "two or more files"),
    (["compare", "{folder}/fast.json", "{folder}/broken.json"], "is not JSON"),
])
def test_bad_input_is_one_line_and_writes_nothing(saved, capsys, args, needle):
    folder = saved[0]
    (folder / "broken.json").write_text("{not json")
    before = sorted(p.name for p in folder.rglob("*"))
    code, out, err = _run([a.format(folder=folder) for a in args], capsys)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in folder.rglob("*")) == before
