"""The calibration file: fitted constants of one GPU type with their provenance, and applying it to a cluster.

`autoplan calibrate` writes it; `estimate`, `plan` and `tune` read it with `--calibration FILE`. JSON, one object:
`format`, `gpu` (the GPU id the runs ran on; the file applies only to clusters of that GPU), `created` (UTC),
`autoplan_version`, `constants` (Calibration fields), `gpu_overrides` (GpuSpec fields), `priors`, `identified`,
`unidentified` ({name: why}), `prior_scale` (the factor the fit put on the priors' spreads: 1 for a cluster unlike
the reference stack, below 1 when the runs read as a reference stack on a catalogue GPU; fit.prior_spreads),
`rms_log_error` (before / after) and `runs` (each run's source, setup, measured and
predicted step time before and after the fit)."""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import fields
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoplan.calibration.fit import FitResult, apply_values, rms_log_error
from autoplan.calibration.params import BY_NAME
from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.errors import InputError

FORMAT = "autoplan-calibration/1"


class RunRecord(BaseModel):
    """Provenance of one run the constants were fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str = Field(description="The run as the command named it (file, row).")
    source: str = Field(description="File it was read from.")
    model: str = Field(description="Model name.")
    gpus: int = Field(description="World size.")
    seq: int = Field(description="Sequence length, tokens.")
    gbs: int = Field(description="Global batch, sequences.")
    engine: str = Field(description="megatron or deepspeed.")
    strategy: Dict[str, object] = Field(description="The strategy as priced (Strategy.to_dict()).")
    measured_step_time_s: float = Field(description="Measured step time, s.")
    predicted_prior_s: float = Field(description="Predicted step time with the prior constants, s.")
    predicted_fit_s: float = Field(description="Predicted step time with the fitted constants, s.")
    measured_peak_mem_gib: Optional[float] = Field(None, description="Measured peak device memory, GiB, if known.")
    predicted_peak_mem_gib: float = Field(description="Predicted peak device memory (all ranks), GiB.")


class CalibrationFile(BaseModel):
    """Fitted constants of one GPU type with their provenance."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = Field(FORMAT, description="File format tag.")
    gpu: str = Field(description="GPU id the runs ran on; the file applies to clusters of this GPU only.")
    created: str = Field(description="When the fit was made, ISO 8601 UTC.")
    autoplan_version: str = Field(description="autoplan version that made the fit.")
    constants: Dict[str, float] = Field(description="Calibration fields (autoplan/costmodel/calibration.py).")
    gpu_overrides: Dict[str, float] = Field(default_factory=dict, description="GpuSpec fields replaced.")
    priors: Dict[str, float] = Field(description="Each fitted constant's prior (profile or Calibration default).")
    identified: List[str] = Field(description="Constants the runs determine (variance shrunk at least by half).")
    unidentified: Dict[str, str] = Field(description="Constants the runs do not determine, and why.")
    prior_scale: float = Field(1.0, description="Factor on the priors' spreads chosen by the fit (fit.prior_spreads): "
                                                "1 = the datasheet's, below 1 = a reference stack's.")
    rms_log_error_prior: float = Field(description="RMS of log(predicted / measured) step time with the priors.")
    rms_log_error_fit: float = Field(description="The same with the fitted constants.")
    runs: List[RunRecord] = Field(description="The runs fitted on.")


def from_fit(result: FitResult) -> CalibrationFile:
    from autoplan import __version__

    homes = {name: BY_NAME[name].home for name in result.values}
    runs = [RunRecord(label=r.run.label, source=r.run.source, model=r.run.model.name, gpus=r.run.cluster.num_gpus,
                      seq=r.run.workload.seq_len, gbs=r.run.workload.global_batch_size, engine=r.run.engine,
                      strategy=r.run.strategy.to_dict(), measured_step_time_s=r.run.step_time_s,
                      predicted_prior_s=r.predicted_prior_s, predicted_fit_s=r.predicted_fit_s,
                      measured_peak_mem_gib=r.run.peak_mem_gib, predicted_peak_mem_gib=r.predicted_peak_mem_gib)
            for r in result.residuals]
    return CalibrationFile(
        gpu=result.residuals[0].run.cluster.gpu.id,
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        autoplan_version=__version__,
        constants={k: v for k, v in result.values.items() if homes[k] == "calibration"},
        gpu_overrides={k: v for k, v in result.values.items() if homes[k] == "gpu"},
        priors=dict(result.priors), identified=list(result.identified), unidentified=dict(result.unidentified),
        prior_scale=result.prior_scale, rms_log_error_prior=rms_log_error(result.residuals, fitted=False),
        rms_log_error_fit=rms_log_error(result.residuals, fitted=True), runs=runs)


def check_out(path: Path) -> None:
    """--out must name a file, not a folder (checked before any fitting)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"--out {path} is a folder; name the calibration file, e.g. --out {path / 'cal.json'}")


def write(cal: CalibrationFile, path: Path) -> None:
    """Write all or none (autoplan/fileio.py): the file is either the old one or the whole new one."""
    from autoplan.fileio import write_text

    check_out(path)
    write_text(path, json.dumps(cal.model_dump(), indent=2) + "\n")


def load(path: str, where: str = "--calibration") -> CalibrationFile:
    """Read a calibration file; every problem is one InputError naming the file (`where` says who named it)."""
    from autoplan.fileio import read_text

    p = Path(path).expanduser()
    text = read_text(p, f"{where} file", f"write one with `autoplan calibrate RUN... --out {p.name}`")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{where} {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{where} {path}: not an autoplan calibration file (format {FORMAT!r}); write one "
                         f"with `autoplan calibrate`")
    try:
        cal = CalibrationFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"{where} {path}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
    known = {f.name for f in fields(Calibration)}
    gpu_known = {name for name, c in BY_NAME.items() if c.home == "gpu"}
    bad = sorted(set(cal.constants) - known) + sorted(set(cal.gpu_overrides) - gpu_known)
    if bad:
        raise InputError(f"{where} {path}: unknown constant {bad[0]!r}; the file was written by another "
                         f"autoplan version: recalibrate with `autoplan calibrate`")
    return cal


def calibrated(cal: Optional[CalibrationFile], cluster: ClusterSpec, where: str = "--calibration"
               ) -> Tuple[ClusterSpec, Calibration]:
    """The cluster and Calibration to price with: unchanged without a file; with one, its constants applied. A file
    fitted on another GPU type is refused."""
    if cal is None:
        return cluster, DEFAULT
    if cal.gpu != cluster.gpu.id:
        raise InputError(f"{where}: the file was fitted on {cal.gpu} runs but the cluster's GPU is {cluster.gpu.id}; "
                         f"calibrate on {cluster.gpu.id} runs or drop {where}")
    return apply_values({**cal.constants, **cal.gpu_overrides}, cluster, DEFAULT)


def load_and_apply(path: Optional[str], cluster: ClusterSpec, cluster_ref: Optional[str] = None
                   ) -> Tuple[ClusterSpec, Calibration]:
    """`--calibration FILE` for a command, else the `calibration:` entry of the cluster YAML `cluster_ref` (the
    flag wins when both are given): (cluster, Calibration); (cluster, DEFAULT) when neither names a file."""
    from autoplan.clusterio import cluster_calibration

    if path:
        return calibrated(load(path), cluster)
    entry = cluster_calibration(cluster_ref)
    if entry is None:
        return cluster, DEFAULT
    where = f"cluster file {cluster_ref} calibration:"
    return calibrated(load(entry, where), cluster, where)
