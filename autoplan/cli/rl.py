"""`autoplan rl`: place and parallelise an RL post-training job (rollout engines + training) and rank the plans by
samples per second (autoplan/rl/)."""
from __future__ import annotations

import sys
from typing import List, Optional

import typer

from autoplan.cli.common import print_json


def register(app: typer.Typer) -> None:
    app.command("rl")(rl_cmd)


def rl_cmd(
    model: str = typer.Option(..., "--model", help="Actor: catalogue name, HF config.json or native spec."),
    critic: Optional[str] = typer.Option(None, "--critic", help="Critic model (PPO); default: the actor's shape "
                                         "(verl initialises the critic from the actor)."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help="Override an actor model field: key=value."),
    cluster: str = typer.Option(..., "--cluster", help="GPU id (see `autoplan clusters`) or cluster YAML."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job (rollout and training together)."),
    algo: str = typer.Option("grpo", "--algo", help="grpo or ppo."),
    prompts: int = typer.Option(..., "--prompts", help="Prompts per step."),
    samples: int = typer.Option(..., "--samples", help="Responses per prompt."),
    prompt_len: int = typer.Option(..., "--prompt-len", help="Mean prompt length, tokens."),
    response_len: int = typer.Option(..., "--response-len", help="Mean response length, tokens."),
    max_response_len: Optional[int] = typer.Option(None, "--max-response-len", help="Longest response, tokens "
                                                   "(default: the mean, i.e. every response the same length)."),
    mode: str = typer.Option("on-policy", "--mode", help="on-policy, one-step-off or async."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Rollout engine: vllm or sglang (default vllm; "
                                         "sglang with --emit slime)."),
    host_mem_gib: Optional[float] = typer.Option(None, "--host-mem-gib", help="Host RAM per node, GiB (default: the "
                                                 "node datasheet's where known)."),
    no_ref: bool = typer.Option(False, "--no-ref", help="No reference model (no KL term), as DAPO."),
    mini_batches: int = typer.Option(1, "--mini-batches", help="Optimizer steps per RL step (prompts / "
                                     "ppo_mini_batch_size)."),
    micro_batch_tokens: Optional[int] = typer.Option(None, "--micro-batch-tokens", help="Training packs sequences "
                                                     "into micro-batches of at most this many tokens per GPU (verl "
                                                     "ppo_max_token_len_per_gpu, slime --max-tokens-per-gpu; "
                                                     "default: prompt + longest response)."),
    staleness: Optional[float] = typer.Option(None, "--staleness", help="--mode async: how far the rollout may run "
                                              "ahead, in parameter versions (verl async_training."
                                              "staleness_threshold); default unbounded."),
    require_batches: Optional[int] = typer.Option(None, "--require-batches", help="--mode async: mini-batches per "
                                                  "local update (verl async_training.require_batches); must divide "
                                                  "--mini-batches."),
    train_strategy: Optional[str] = typer.Option(None, "--train-strategy", help="'tp=..,pp=..,ep=..[,offload=none|swap|"
                                                 "optimizer|all]': price this training layout."),
    rollout: Optional[str] = typer.Option(None, "--rollout", help="'tp=..,dp=..,ep=..,engines=..,"
                                          "gpu_memory_utilization=..': price this rollout layout."),
    placement: Optional[str] = typer.Option(None, "--placement", help="colocated or split:TRAIN_GPUS."),
    top: int = typer.Option(3, "--top", help="How many plans to print."),
    emit: Optional[str] = typer.Option(None, "--emit", help="Write the best plan's launch settings: verl or slime."),
    out: Optional[str] = typer.Option(None, "--out", help="Folder for --emit."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Choose the placement, training layout and rollout layout of an RL post-training step."""
    from autoplan.clusterio import load_cluster
    from autoplan.errors import InputError
    from autoplan.modelio import load_model
    from autoplan.rl import spec as S
    from autoplan.rl.search import search

    _check_choice("--algo", algo, S.ALGOS)
    _check_choice("--mode", mode, S.MODES)
    if emit is not None:
        _check_choice("--emit", emit, ("verl", "slime"))
        if not out:
            raise InputError(f"--emit {emit} needs --out DIR (the folder the launch settings are written to)")
    elif out:
        raise InputError("--out is the folder for --emit; add --emit verl or --emit slime")
    engine = engine or ("sglang" if emit == "slime" else "vllm")
    _check_choice("--engine", engine, S.ENGINES)
    if emit == "verl" and engine != "vllm" or emit == "slime" and engine != "sglang":
        raise InputError(f"--emit {emit} runs {'vLLM' if emit == 'verl' else 'SGLang'} rollouts here; drop --engine "
                         f"{engine}")
    for name, value in (("--gpus", gpus), ("--prompts", prompts), ("--samples", samples), ("--prompt-len",
                        prompt_len), ("--response-len", response_len), ("--top", top),
                        ("--mini-batches", mini_batches)):
        if value is None or value < 1:
            raise InputError(f"{name}={value} must be a positive whole number")
    longest = response_len if max_response_len is None else max_response_len
    if longest < response_len:
        raise InputError(f"--max-response-len={longest} is below --response-len={response_len} (the mean); pass "
                         f"--max-response-len >= {response_len}")
    if critic and algo != "ppo":
        raise InputError("--critic is for --algo ppo (GRPO trains no critic); drop --critic or pass --algo ppo")
    m = load_model(model, sets or ())
    c = load_cluster(cluster, gpus)
    if prompt_len + longest > m.max_position_embeddings:
        raise InputError(f"--prompt-len + --max-response-len = {prompt_len + longest} exceeds "
                         f"max_position_embeddings={m.max_position_embeddings} of {m.name}; pass --set "
                         f"max_position_embeddings={prompt_len + longest} if the model is run that long")
    if mini_batches > prompts:
        raise InputError(f"--mini-batches={mini_batches} exceeds --prompts={prompts}; use at most {prompts}")
    if (staleness is not None or require_batches is not None) and mode != "async":
        raise InputError(f"--staleness / --require-batches price verl's fully-async trainer; pass --mode async or "
                         f"drop them (--mode {mode})")
    if staleness is not None and staleness < 0:
        raise InputError(f"--staleness={staleness} must be >= 0 (0: each version's rollout starts after its sync)")
    if require_batches is not None and (require_batches < 1 or mini_batches % require_batches):
        raise InputError(f"--require-batches={require_batches} must be a positive divisor of --mini-batches="
                         f"{mini_batches} (a parameter version is a whole number of local updates)")
    fixed = _fixed(train_strategy, rollout, placement, gpus, engine)
    job = S.RLJob(algo=algo, prompts=prompts, samples=samples, prompt_len=prompt_len, response_len=response_len,
                  max_response_len=longest, mode=mode, use_ref=not no_ref, mini_batches=mini_batches,
                  micro_batch_tokens=S.micro_batch_tokens_default(prompt_len, longest, micro_batch_tokens,
                                                                  int(fixed.train.get("cp", 1))),
                  host_mem_gib=S.host_mem_default(c.gpu.id, host_mem_gib), staleness=staleness,
                  require_batches=require_batches)
    notes = ["reward: rule-based (no reward model forward)"]
    cm = load_model(critic, ()) if critic else None
    if algo == "ppo":
        notes.append(f"critic {cm.name if cm else m.name}: trained on the actor's layout; its value pass is the "
                     f"'reward' phase")
    plans, any_fit = search(m, c, job, fixed, top_k=top, critic=cm)
    result = {"plans": [p.to_dict(job) for p in plans], "model": m.name, "cluster": c.gpu.id, "gpus": gpus,
              "job": job.model_dump(), "feasible": any_fit, "notes": notes + list(m.notes)}
    if emit and any_fit:
        from autoplan.fileio import write_files
        from autoplan.rl import emit_slime, emit_verl

        writer = emit_verl if emit == "verl" else emit_slime
        files = writer.render(plans[0], m, job, model_path=model, gpus_per_node=c.gpu.gpus_per_node)
        from pathlib import Path

        written = write_files({Path(out) / name: text for name, text in files.items()})
        result["emitted"] = [str(p) for p in written]
    if as_json:
        print_json(result)
    else:
        _print(result)
    if not any_fit:
        print("autoplan: no plan fits (GPU memory, host RAM or KV cache); the closest are shown", file=sys.stderr)
        raise typer.Exit(1)


def _check_choice(flag: str, value: str, choices) -> None:
    from autoplan.errors import InputError, did_you_mean

    if value not in choices:
        raise InputError(f"{flag} {value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}")


def _fixed(train_strategy, rollout, placement, gpus: int, engine: str):
    from autoplan.errors import InputError
    from autoplan.rl import spec as S
    from autoplan.rl.search import Fixed
    from autoplan.strategy import parse_strategy_text

    f = Fixed(engine=engine)
    if train_strategy:
        items = [p.strip() for p in train_strategy.split(",") if p.strip()]
        rest = []
        for item in items:
            key, _, value = item.partition("=")
            if key.strip().lower() == "offload":
                v = value.strip().lower()
                if v not in S.OFFLOADS:
                    raise InputError(f"--train-strategy offload={value!r} is not one of {', '.join(S.OFFLOADS)}")
                f.offload = v
            else:
                rest.append(item)
        f.train = parse_strategy_text(",".join(rest)) if rest else {}
    if rollout:
        f.rollout = S.parse_rollout(rollout)
    if placement:
        f.placement = S.parse_placement(placement, gpus)
    pool = f.placement.rollout_gpus if f.placement else None
    r = f.rollout
    if r.get("radix_cache") is False and engine != "sglang":  # RolloutLayout's rule, before any layout is made
        raise InputError(f"--rollout {S.RADIX_CACHE_IS_SGLANGS}: drop it or pass --engine sglang / --emit slime")
    if pool and all(k in r for k in ("tp", "dp", "engines")) and r["tp"] * r["dp"] * r["engines"] != pool:
        raise InputError(f"--rollout tp*dp*engines = {r['tp'] * r['dp'] * r['engines']} but the rollout pool has "
                         f"{pool} GPUs; make engines = {pool} / (tp*dp)")
    if f.offload in ("all", "swap") and f.placement is not None and f.placement.kind == "split":
        raise InputError(f"--train-strategy offload={f.offload} swaps training states out while a colocated engine "
                         f"runs; a split placement keeps them on the GPU: use offload=optimizer or none")
    return f


def _print(result) -> None:
    from autoplan.cli.render import console

    console.print(f"[bold]{result['model']}[/bold] RL on {result['gpus']} x {result['cluster']}")
    for i, p in enumerate(result["plans"], 1):
        e, t, r, pl = p["estimate"], p["train"], p["rollout"], p["placement"]
        console.print(f"{i}. {pl['kind']} train {pl['train_gpus']} / rollout {pl['rollout_gpus']} GPUs | train "
                      f"tp{t['tp']} pp{t['pp']} ep{t['ep']} offload={t['offload']} | {r['engine']} tp{r['tp']} "
                      f"dp{r['dp']} ep{r['ep']} x{r['engines']} util {r['gpu_memory_utilization']}"
                      f"{'' if r.get('radix_cache', True) else ' radix-cache off'}")
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in e["phase_times_s"].items())
        console.print(f"   step {e['step_time_s']:.1f}s, {e['samples_per_s']:.2f} samples/s; {phases}; GPU "
                      f"{e['peak_mem_gib']:.1f} GiB, host {e['host_mem_gib']:.0f} GiB/node, fits={e['fits']}")
