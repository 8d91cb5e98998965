"""`autoplan calibrate RUN... --out cal.json`: fit the cost model's constants to measured runs of one cluster.

Each RUN is a runs table (`.csv` / `.json`), a training log (Megatron-LM with `--from-megatron ARGS|script`,
DeepSpeed or ds_train.py with `--from-deepspeed CFG --model M --gpus N --seq S`, torchtitan with `--from-torchtitan
STRATEGY --model M --gpus N --seq S --gbs B`), or a probe's
`probe_result.json` (or its folder). With several logs of one engine, give one config for all of them or one per log
in the order of the logs. The file it writes is read by `estimate`, `plan` and `tune` with `--calibration FILE`.

Exit codes: 0 written, 2 bad input (one line naming the run; nothing written)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from autoplan.errors import InputError


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_cmd)


def calibrate_cmd(
    runs: List[str] = typer.Argument(..., help="Runs tables (.csv/.json), training logs or probe results."),
    out: Path = typer.Option(..., "--out", help="Calibration file to write (JSON)."),
    from_megatron: Optional[List[str]] = typer.Option(None, "--from-megatron",
                                                      help="Megatron-LM args or script of the Megatron logs."),
    from_deepspeed: Optional[List[str]] = typer.Option(None, "--from-deepspeed",
                                                       help="ds_config.json of the DeepSpeed logs."),
    from_torchtitan: Optional[List[str]] = typer.Option(None, "--from-torchtitan",
                                                        help="Layout of the torchtitan logs: an estimate --strategy "
                                                        "string or file (with --model, --gpus, --seq, --gbs)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model of the DeepSpeed logs (configs lack it)."),
    cluster: str = typer.Option("h100", "--cluster", help="GPU id or cluster YAML the logs ran on."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="World size of the logs (when the config lacks it)."),
    seq: Optional[int] = typer.Option(None, "--seq", help="Sequence length of the logs (DeepSpeed)."),
    gbs: Optional[int] = typer.Option(None, "--gbs", help="Global batch of the logs (fills \"auto\")."),
    warmup: int = typer.Option(2, "--warmup", help="Leading logged iterations left out of each log's median."),
    as_json: bool = typer.Option(False, "--json", help="Print the calibration file as JSON."),
) -> None:
    """Fit the cluster's constants to measured runs and write a calibration file."""
    from autoplan.calibration import calfile
    from autoplan.calibration.fit import fit
    from autoplan.calibration.runs import check_repeats

    if warmup < 0:
        raise InputError(f"--warmup={warmup} must be >= 0")
    calfile.check_out(out)
    measured = read_runs(runs, from_megatron or [], from_deepspeed or [], model, cluster, gpus, seq, gbs, warmup,
                         from_torchtitan or [])
    check_repeats(measured)
    result = fit(measured)
    cal = calfile.from_fit(result)
    calfile.write(cal, out)
    if as_json:
        print(json.dumps(cal.model_dump(), indent=2))
        return
    for line in render(cal, result):
        typer.echo(line)
    typer.echo(f"wrote {out}")


def read_runs(paths: List[str], megatron: List[str], deepspeed: List[str], model, cluster, gpus, seq, gbs,
              warmup: int, torchtitan: Optional[List[str]] = None):
    """Every RUN argument's runs, in order; logs paired with their configs."""
    from autoplan.calibration.runs import LogConfig, detect_log_format, is_probe_result, read_log, read_probe, \
        read_table

    kinds = []
    for text in paths:
        path = Path(text)
        if not path.exists():
            raise InputError(f"{text}: file not found; each RUN is a runs table (.csv/.json), a training log or a "
                             f"probe result")
        if is_probe_result(path):
            kinds.append("probe")
        elif path.suffix.lower() in (".csv", ".json"):
            kinds.append("table")
        elif path.is_dir():
            raise InputError(f"{text}: a folder without probe_result.json; pass a runs table, a log or a probe folder")
        else:
            fmt = detect_log_format(path.read_text(encoding="utf-8", errors="replace"))
            kinds.append(fmt if fmt in ("megatron", "torchtitan") else "deepspeed")
    configs = {"megatron": _pair(megatron, kinds.count("megatron"), "--from-megatron", "Megatron-LM"),
               "deepspeed": _pair(deepspeed, kinds.count("deepspeed"), "--from-deepspeed", "DeepSpeed"),
               "torchtitan": _pair(torchtitan or [], kinds.count("torchtitan"), "--from-torchtitan", "torchtitan")}
    out = []
    for text, kind in zip(paths, kinds):
        path = Path(text)
        if kind == "probe":
            out.append(read_probe(path))
        elif kind == "table":
            out.extend(read_table(path))
        else:
            config = configs[kind].pop(0) if len(configs[kind]) > 1 else (configs[kind] or [None])[0]
            cfg = LogConfig(from_megatron=config if kind == "megatron" else None,
                            from_deepspeed=config if kind == "deepspeed" else None,
                            from_torchtitan=config if kind == "torchtitan" else None, model=model, cluster=cluster,
                            gpus=gpus, seq=seq, gbs=gbs, warmup=warmup)
            out.append(read_log(path, cfg))
    return out


def _pair(configs: List[str], logs: int, flag: str, engine: str) -> List[str]:
    if configs and not logs:
        raise InputError(f"{flag} is given but no {engine} log is among the runs; drop it or add the log")
    if len(configs) not in (0, 1, logs):
        raise InputError(f"{len(configs)} {flag} configs for {logs} {engine} logs; give one for all of them or one "
                         f"per log, in the order of the logs")
    return list(configs)


def render(cal, result) -> List[str]:
    """The fit as text: runs (measured vs predicted), constants (prior -> fitted), what the runs did not identify."""
    lines = [f"calibration of {cal.gpu} on {len(cal.runs)} run(s): RMS log error of step time "
             f"{cal.rms_log_error_prior:.3f} with the priors -> {cal.rms_log_error_fit:.3f} fitted", "",
             f"{'run':34s} {'strategy':36s} {'measured s':>10s} {'prior s':>9s} {'err':>7s} {'fitted s':>9s} "
             f"{'err':>7s} {'mem GiB meas/pred':>18s}"]
    for r in result.residuals:
        mem = f"{r.run.peak_mem_gib:.1f}/{r.predicted_peak_mem_gib:.1f}" if r.run.peak_mem_gib else \
            f"-/{r.predicted_peak_mem_gib:.1f}"
        lines.append(f"{r.run.label[:34]:34s} {r.run.strategy.label(r.run.model.is_moe)[:36]:36s} "
                     f"{r.run.step_time_s:10.4g} {r.predicted_prior_s:9.4g} {r.error_prior:+7.1%} "
                     f"{r.predicted_fit_s:9.4g} {r.error_fit:+7.1%} {mem:>18s}")
    lines += ["", "priors' spreads: " + ("the datasheet's (the runs read as a cluster unlike the reference stack)"
                                      if result.prior_scale == 1.0 else
                                      f"x{result.prior_scale:.2f}, a reference stack's (the runs read as one; "
                                      f"fit.STACK_SIGMA)")]
    lines += ["", f"{'constant':26s} {'prior':>10s} {'fitted':>10s} {'runs fix':>8s}  status"]
    for name, prior in result.priors.items():
        status = "identified" if name in result.identified else "not identified"
        lines.append(f"{name:26s} {prior:10.4g} {result.values[name]:10.4g} {result.data_share[name]:8.0%}  {status}")
    if result.unidentified:
        lines += ["", "not identified by these runs:"]
        lines += [f"  {name}: {why}" for name, why in result.unidentified.items()]
    under = [r for r in result.residuals if r.run.peak_mem_gib and r.run.peak_mem_gib > r.predicted_peak_mem_gib]
    if under:
        lines += ["", "measured peak memory above the prediction (the memory model is not calibrated): "
                  + ", ".join(f"{r.run.label} {r.run.peak_mem_gib:.1f} > {r.predicted_peak_mem_gib:.1f} GiB"
                              for r in under)]
    return lines
