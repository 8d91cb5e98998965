"""The allocator allowances are at least what was measured: `Calibration.fragmentation` (default allocator) and
`fragmentation_expandable` (expandable segments) against every run in the committed H200 measurement
(benchmarks/results/allocator_fragmentation_h200_*.txt, written by `python -m benchmarks.allocator_fragmentation`)."""
from __future__ import annotations

import re
from pathlib import Path

from autoplan.costmodel.calibration import DEFAULT

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def measured() -> dict:
    """{expandable: [fragmentation of each run]} over every committed allocator measurement."""
    runs = {False: [], True: []}
    files = sorted(RESULTS.glob("allocator_fragmentation_*.txt"))
    assert files, f"no allocator measurement under {RESULTS}"
    for path in files:
        expandable = None
        for line in path.read_text().splitlines():
            conf = re.search(r"PYTORCH_CUDA_ALLOC_CONF='([^']*)'", line)
            if conf:
                expandable = "expandable_segments:True" in conf.group(1)
            value = re.match(r"\s+fragmentation\s+([0-9.]+)$", line)
            if value:
                assert expandable is not None, f"{path}: a fragmentation figure before its allocator setting"
                runs[expandable].append(float(value.group(1)))
    return runs


def test_allowances_cover_every_measured_run():
    runs = measured()
    assert len(runs[False]) >= 3 and len(runs[True]) >= 2
    assert DEFAULT.fragmentation >= max(runs[False])
    assert DEFAULT.fragmentation_expandable >= max(runs[True])


def test_expandable_segments_measured_below_the_default_allocator():
    runs = measured()
    assert max(runs[True]) < min(runs[False])
    assert DEFAULT.fragmentation_expandable < DEFAULT.fragmentation
