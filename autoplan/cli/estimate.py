"""`autoplan estimate`: predict step time and memory of one strategy."""
from __future__ import annotations

from typing import List, Optional

import typer

from autoplan import keys as K
from autoplan.cli.common import (CKPT_METHOD_HELP, RESILIENCE_HELP, apply_resilience, load_inputs, print_json,
                                 read_strategy, warn_workload)


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_cmd)


def estimate_cmd(
    model: Optional[str] = typer.Option(None, "--model", help="Catalogue name, HF config.json or native spec."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help="Override a model field: key=value."),
    cluster: str = typer.Option("h100", "--cluster", help="GPU id (see `autoplan clusters`) or cluster YAML."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Number of GPUs (world size)."),
    seq: Optional[int] = typer.Option(None, "--seq", help="Sequence length, tokens (default 8192 as for plan; "
                                      "with --from-megatron it replaces the script's, noted, or fills a fragment's)."),
    gbs: Optional[int] = typer.Option(None, "--gbs", help="Global batch, sequences (default 128 as for plan; "
                                      "with --from-megatron it replaces the script's, noted, or fills a fragment's)."),
    mbs: Optional[int] = typer.Option(None, "--mbs", help="Micro batch, sequences (fills a ds_config's \"auto\")."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="'tp=8,pp=4,...' or a YAML/JSON file; "
                                                                           f"keys: {K.help_text()}."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Measured profile(s), comma-separated: layer "
                                          "times (autoplan profile) and/or collectives (autoplan profile-comm)."),
    from_megatron: Optional[str] = typer.Option(None, "--from-megatron", help="Megatron-LM args or script."),
    from_deepspeed: Optional[str] = typer.Option(None, "--from-deepspeed", help="ds_config.json (with --model)."),
    engine: str = typer.Option("megatron", "--engine", help="Engine whose rules complete a partial strategy."),
    mem_headroom: float = typer.Option(0.0, "--mem-headroom", help="Fraction of memory to keep free."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration file written by "
                                              "`autoplan calibrate` (fitted constants of this cluster's GPU)."),
    ckpt_method: Optional[str] = typer.Option(None, "--ckpt-method", help=CKPT_METHOD_HELP),
    resilience: Optional[List[str]] = typer.Option(None, "--resilience", help=RESILIENCE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (stable keys)."),
    report: Optional[str] = typer.Option(None, "--report", help="Write an HTML report (timeline, memory)."),
) -> None:
    """Predict the step time and per-GPU memory of a strategy."""
    from autoplan.complete import complete_strategy
    from autoplan.costmodel.estimate import estimate
    from autoplan.costmodel.measured import resolve_profiles
    from autoplan.errors import InputError

    given, notes = read_strategy(strategy), []
    user_keys, imported_keys = set(given), set()
    if mbs is not None:
        given.setdefault("mbs", mbs)
    if from_deepspeed:
        engine = "deepspeed"  # the imported layout is completed under DeepSpeed's rules
    if from_megatron or from_deepspeed:
        m, c, wl, imported, read_notes = _imported(from_megatron, from_deepspeed, model, sets, cluster, gpus, seq,
                                                   gbs, given.get("mbs"))
        notes += read_notes + _overridden(imported, given)
        user_keys, imported_keys = set(given), set(imported)
        given = {**imported, **given}
    else:
        if model is None:
            raise InputError("--model is required (a catalogue name such as llama3-70b, or a config.json path)")
        if gpus is None:
            raise InputError("--gpus is required (the number of GPUs in the job, e.g. --gpus 64)")
        m, c, wl = load_inputs(model, sets, cluster, gpus, seq, gbs)
    c = apply_resilience(c, ckpt_method, resilience)
    if engine == "deepspeed":
        _check_deepspeed_runs(m, given, user_keys, imported_keys)
    notes += list(m.notes)  # what reading the model's config assumed
    profiles = resolve_profiles(profile, m, c)
    c, prof = profiles.cluster, profiles.layers
    from autoplan.calibration.calfile import load_and_apply

    c, cal = load_and_apply(calibration, c, cluster)
    notes += list(profiles.notes)
    s, chosen = complete_strategy(m, c, wl, given, engine=engine)
    if (from_megatron or from_deepspeed) and not chosen:
        chosen = ["priced as written: no strategy key chosen (all from the imported config or --strategy)"]
    est = estimate(m, c, s, wl, cal=cal, profile=prof, headroom=mem_headroom, notes=notes + chosen,
                   engine=engine)
    if report:
        from autoplan.report.write import write_estimate_report
        from autoplan.results import Plan

        write_estimate_report(report, Plan(model=m, cluster=c, workload=wl, strategy=s, estimate=est), engine=engine,
                              profile=prof, headroom=mem_headroom)
    if as_json:
        print_json({**est.contract(), "strategy": s.to_dict()})
        return
    from autoplan.cli.render import console, print_estimate

    console.print(f"[bold]{m.name}[/bold] on {c.num_gpus} x {c.gpu.id}, seq {wl.seq_len}, gbs "
                  f"{wl.global_batch_size}: [cyan]{s.label()}[/cyan]")
    print_estimate(est)


def _overridden(imported: dict, given: dict) -> List[str]:
    """Notes for --strategy keys that replace what the imported config says."""
    changed = [f"{k}={given[k]} (config: {imported[k]})" for k in given if k in imported and imported[k] != given[k]]
    return [f"--strategy overrides the imported config: {', '.join(changed)}"] if changed else []


def _check_deepspeed_runs(model, given: dict, user_keys: set, imported_keys: set) -> None:
    """Keys DeepSpeed cannot run are an error naming the rule. A ds_config is priced as written (AutoEP included);
    the search that chooses the keys it lacks runs only what autoplan's DeepSpeed launcher runs, so a config with
    AutoEP must state everything."""
    from autoplan.complete import default_completion
    from autoplan.errors import InputError
    from autoplan.integrations.engines import deepspeed_unsupported
    from autoplan.strategy import CONTRACT_KEYS

    if given.get("ep", 1) > 1 and "ep" not in user_keys and "ep" in imported_keys:
        lacking = [k for k in CONTRACT_KEYS if k not in given]
        if lacking:
            raise InputError(f"the ds_config turns AutoEP on (ep={given['ep']}), which the DeepSpeed search does not "
                             f"run, so it cannot choose what the config lacks; give {', '.join(lacking)} with "
                             f"--strategy (e.g. --strategy {','.join(f'{k}=...' for k in lacking)})")
        return
    reason = deepspeed_unsupported(default_completion(given), model)
    if reason:
        raise InputError(f"{reason} (with --from-deepspeed the engine is DeepSpeed"
                         f"{'; AutoEP needs expert_parallel in the ds_config' if 'expert' in reason else ''})")


def _imported(from_megatron, from_deepspeed, model, sets, cluster, gpus, seq, gbs, mbs):
    """(model, cluster, workload, strategy dict, notes) from an existing Megatron-LM or DeepSpeed launch config."""
    from autoplan.clusterio import load_cluster
    from autoplan.errors import InputError
    from autoplan.integrations import importers

    if from_megatron:
        if model is not None:
            raise InputError("--from-megatron reads the model from the arguments; drop --model (use --set "
                             "key=value to change a field)")
        imp = importers.from_megatron_args(from_megatron, overrides=sets or (), seq_len=seq, global_batch_size=gbs,
                                           world_size=gpus)
        m = imp.model
        source = "Megatron-LM arguments"
    else:
        if model is None:
            raise InputError("--from-deepspeed needs --model: a DeepSpeed config does not describe the model")
        from autoplan.modelio import load_model

        m = load_model(model, sets or ())
        if gpus is None:
            raise InputError("--from-deepspeed needs --gpus (the world size the config is run with)")
        imp = importers.from_deepspeed_config(from_deepspeed, m, gpus, seq_len=seq, mbs=mbs, gbs=gbs)
        source = "a DeepSpeed config"
    world = gpus or imp.world_size
    if not world:
        raise InputError("the world size is not in the imported config; pass --gpus N")
    _check_launcher_world(imp, gpus)
    notes = [f"--gpus {gpus} replaces the launcher's {imp.world_size}"] if gpus and imp.world_size not in (None, gpus) \
        else []
    c = load_cluster(cluster, world)
    wl = imp.workload
    if wl is None and not seq:
        raise InputError("--from-deepspeed needs --seq: a DeepSpeed config holds no sequence length")
    if from_deepspeed and (seq is not None or gbs is not None):
        from autoplan.workload import make_workload

        wl = make_workload(wl.seq_len if seq is None else seq, wl.global_batch_size if gbs is None else gbs)
    warn_workload(wl)
    return m, c, wl, dict(imp.strategy), [f"read from {source}"] + list(imp.notes) + notes


def _check_launcher_world(imp, gpus) -> None:
    """Example scripts often launch one node while their layout needs many: say so, with the smallest job size that
    the layout tiles, instead of the first layout rule the small world breaks."""
    from autoplan.errors import InputError

    if gpus is not None or not imp.world_size:
        return
    st = imp.strategy
    model_parallel = st.get("tp", 1) * st.get("pp", 1) * st.get("cp", 1)
    expert_parallel = st.get("etp", 1) * st.get("ep", 1) * st.get("pp", 1)
    need = max(model_parallel, expert_parallel)
    if imp.world_size % model_parallel == 0 and imp.world_size % expert_parallel == 0:
        return
    import math

    tile = model_parallel * expert_parallel // math.gcd(model_parallel, expert_parallel)
    raise InputError(f"the script's launcher runs {imp.world_size} GPUs but its layout (tp*pp*cp={model_parallel}, "
                     f"etp*ep*pp={expert_parallel}) needs at least {need}; pass --gpus N with N a multiple of {tile} "
                     f"(the job's real size, e.g. --gpus {max(tile, need)})")
