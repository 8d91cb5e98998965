"""The HTML reports opened as a reader would: headless Chromium loads each page from disk (no network), and the
test fails on any console message or page error and checks from the DOM that every chart drew its marks (the
timeline: one forward and one backward bar per pipeline rank x model chunk x micro-batch).

Needs Debian's `chromium` (.ci/run installs it where apt-get can); skipped with the reason where it is absent."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from autoplan.cli.main import main

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it where apt-get can)",
                allow_module_level=True)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--enable-logging=stderr", "--log-level=0", "--virtual-time-budget=60000", "--dump-dom"]

# Put first in <head>: records page errors and console.error calls, then waits for the page's charts and writes
# what they drew (window.autoplanCharts, autoplan/report/page.py) into the DOM for --dump-dom.
HARNESS = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
(function () { var ce = console.error; console.error = function () {
  window.__errors.push(Array.prototype.join.call(arguments, ' ')); ce.apply(console, arguments); }; })();
function __report() {
  if (!document.body || document.body.getAttribute('data-charts-drawn') !== 'true') { return setTimeout(__report, 20); }
  var pre = document.createElement('pre'); pre.id = 'harness';
  pre.textContent = JSON.stringify({errors: window.__errors, charts: window.autoplanCharts});
  document.body.appendChild(pre);
}
window.addEventListener('load', function () { setTimeout(__report, 0); });
</script>"""
# A page as small as a Plotly page gets: one bar. Its load time on this machine sets the deadline of the others.
BASELINE = ('<html><head><script src="plotly.js"></script></head><body><div id="c"></div><script>'
            'Plotly.newPlot("c", [{type: "bar", x: [1], y: [1]}]).then(function () '
            '{document.body.setAttribute("data-charts-drawn", "true");});</script></body></html>')
SLOWDOWN = 40  # a report page may take this many baseline loads (it draws ~10^3 marks, the baseline one)


def _open(page: Path, timeout_s: float) -> tuple:
    """(what the harness recorded, chromium's console lines) after loading `page` with the harness."""
    probe = page.with_name(f"harnessed-{page.name}")
    probe.write_text(page.read_text().replace("<head>", "<head>" + HARNESS, 1))
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={page.parent / 'chromium-profile'}", probe.as_uri()],
                          capture_output=True, text=True, timeout=timeout_s)
    found = re.search(r'<pre id="harness">(.*?)</pre>', proc.stdout, re.S)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert found, f"the page never finished drawing (exit {proc.returncode}); console: {console[:5]}"
    import html

    return json.loads(html.unescape(found.group(1))), console


@pytest.fixture(scope="module")
def deadline_s(tmp_path_factory) -> float:
    from plotly.offline import get_plotlyjs

    folder = tmp_path_factory.mktemp("baseline")
    (folder / "plotly.js").write_text(get_plotlyjs())
    page = folder / "baseline.html"
    page.write_text(BASELINE)
    start = time.perf_counter()
    _open(page, timeout_s=600)
    return SLOWDOWN * (time.perf_counter() - start)


def _cli(args):
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), f"autoplan {' '.join(args)} exited {e.code}"


def _clean(result, console):
    assert result["errors"] == [], result["errors"]
    assert console == [], console


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory):
    """A pipelined plan of a small search, saved and reported (`plan --report --out`)."""
    out = tmp_path_factory.mktemp("plan")
    args = ["plan", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "16", "--seq", "4096", "--gbs", "32",
            "--fix", "pp=2", "--fix", "tp=2", "--top", "3", "--baseline", "tp=2,pp=2,vpp=1,mbs=1,zero=1,sp=true",
            "--report", str(out / "plan.html"), "--out", str(out)]
    _cli(args)
    return out


def _plan(folder: Path):
    from autoplan.report.inputs import load_saved

    return load_saved(str(folder / "plan.json")).plan


def test_plan_report_draws_every_chart(plan_files, deadline_s):
    plan = _plan(plan_files)
    result, console = _open(plan_files / "plan.html", deadline_s)
    _clean(result, console)
    charts = result["charts"]
    s, m = plan.strategy, plan.estimate.num_microbatches
    assert charts["timeline"]["forward"] == s.pp * s.vpp * m
    assert charts["timeline"]["backward"] == s.pp * s.vpp * m
    assert charts["timeline"]["optimizer"] == s.pp
    memory = charts["memory"]
    assert memory and all(n == s.pp for n in memory.values())
    front = charts["front"]
    assert front["winner"] == 1 and front["baseline"] == 1 and front["runner-up"] == 2
    assert front["front (fits)"] == 1
    assert sum(n for k, n in front.items() if k not in ("winner", "baseline", "runner-up", "front (fits)")) > 100
    assert all(n == 4 for n in charts["breakdown"].values())  # winner, 2 runners-up, baseline


def test_estimate_report_of_an_interleaved_strategy(tmp_path, deadline_s):
    page = tmp_path / "estimate.html"
    _cli(["estimate", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "8", "--seq", "4096", "--gbs", "16",
              "--strategy", "tp=2,pp=4,vpp=2,mbs=1,sp=true,zero=1,recompute=none", "--report", str(page)])
    result, console = _open(page, deadline_s)
    _clean(result, console)
    assert result["charts"]["timeline"]["forward"] == 4 * 2 * 16  # pp x vpp x gbs 16 / (mbs 1 x dp 1)
    assert result["charts"]["timeline"]["backward"] == 4 * 2 * 16
    assert all(n == 4 for n in result["charts"]["memory"].values())


def test_compare_page(plan_files, tmp_path, deadline_s):
    other = tmp_path / "other.json"
    _cli(["plan", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "16", "--seq", "4096", "--gbs", "32",
              "--fix", "pp=1", "--top", "1", "--out", str(tmp_path)])
    (tmp_path / "plan.json").rename(other)
    page = tmp_path / "compare.html"
    _cli(["compare", str(plan_files / "plan.json"), str(other), "--out", str(page)])
    result, console = _open(page, deadline_s)
    _clean(result, console)
    first = _plan(plan_files)
    assert result["charts"]["p0timeline"]["forward"] == first.strategy.pp * first.strategy.vpp * \
        first.estimate.num_microbatches
    assert result["charts"]["p1timeline"]["forward"] > 0
    assert all(n == 2 for n in result["charts"]["breakdown"].values())


def test_tune_report(tmp_path, deadline_s, monkeypatch):
    """`tune --report` on a study whose probes are a stand-in measuring 3x the prediction (tests/unit/test_tune_study.py)."""
    from test_tune_study import TINY, FakeProbe

    from autoplan.tuning import study as study_mod

    monkeypatch.setattr(study_mod, "run_probe", FakeProbe(mem_factor=0.9))
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "tune.html"
    _cli(["tune", "--model", str(TINY), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs", "8",
          "--engine", "deepspeed", "--trials", "3", "--out", "out", "--report", str(page)])
    result, console = _open(page, deadline_s)
    _clean(result, console)
    assert result["charts"]["tune_time"]["cost model"] == 3
    assert result["charts"]["tune_time"]["corrected (calibration fit)"] >= 1
    assert result["charts"]["tune_memory"]["cost model"] == 3
    assert "compute_scale" in page.read_text()


def test_a_broken_page_is_caught(tmp_path, deadline_s):
    """The harness itself: a page whose script throws is reported, not passed."""
    from autoplan.report.page import Page, Section, render
    from autoplan.report.charts import breakdown_figure

    figure = breakdown_figure([{"label": "x", "time_breakdown": {"compute": 1.0}}])
    text = render(Page("t", "s", [Section("b", charts=[("b", figure)])]))
    page = tmp_path / "broken.html"
    page.write_text(text.replace("</body>", "<script>undefinedFunction();</script></body>"))
    result, console = _open(page, deadline_s)
    assert result["errors"] and "undefinedFunction" in result["errors"][0]
    assert console
