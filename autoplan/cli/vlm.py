"""`autoplan vlm`: plan a vision-language model (encoder, projector and language model together)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from autoplan.cli.common import DEFAULT_GBS, DEFAULT_SEQ, print_json
from autoplan.multimodal.placement import absorbable, drawn_step


def register(app: typer.Typer) -> None:
    app.command("vlm")(vlm_cmd)


def _freeze(text: Optional[str]):
    from autoplan.errors import InputError
    from autoplan.multimodal.spec import Freeze

    parts = {p.strip() for p in (text or "").split(",") if p.strip()}
    bad = parts - {"vision", "projector", "language"}
    if bad:
        raise InputError(f"--freeze {text!r}: unknown part {sorted(bad)[0]!r}; use vision, projector, language")
    return Freeze(vision_model="vision" in parts, vision_projection="projector" in parts,
                  language_model="language" in parts)


def _row(p, drawn) -> dict:
    return {"placement": p.placement.label(), "kind": p.placement.kind, "step_time_s": p.step_s,
            "tail_step_time_s": p.tail_step_s, "drawn_step_time_s": drawn, "stage_times_s": list(p.stage_s),
            "encoder_s_per_microbatch": p.encoder_s, "llm_layer_s_per_microbatch": p.layer_s, "imbalance": p.imbalance,
            "peak_mem_gib": p.peak_mem_gib, "fits": p.fits, "num_microbatches": p.num_microbatches,
            "strategy": p.placement.llm.model_dump(exclude_defaults=True),
            "encoder_tp": p.placement.encoder_tp or None, "encoder_dp": p.placement.encoder_dp or None,
            "encoder_recompute": p.placement.encoder_recompute}


def explain_lines(inherit, disjoint, data, num_layers: int, drawn) -> List[str]:
    lines = [f"image load: mean {data.mean.images_per_sample:g} images x {data.mean.tokens_per_image:g} tokens, "
             f"p{data.tail_percentile:g} {data.tail.images_per_sample:g} x {data.tail.tokens_per_image:g}"]
    for name, p in (("inherit", inherit), ("disjoint", disjoint)):
        if p is None:
            lines.append(f"{name}: no placement fits")
            continue
        stages = ", ".join(f"{t * 1e3:.0f}" for t in p.stage_s)
        lines.append(f"{p.placement.label()}: {p.step_s:.2f} s/step mean, {p.tail_step_s:.2f} s at the tail, "
                     f"{drawn[id(p)]:.2f} s with micro batches as drawn; "
                     f"stage ms per micro batch [{stages}] (imbalance {p.imbalance:.0%}); encoder "
                     f"{p.encoder_s * 1e3:.0f} ms per micro batch = {p.encoder_s / p.layer_s:.1f} language layers of "
                     f"{p.layer_s * 1e3:.1f} ms; peak {p.peak_mem_gib:.1f} GiB")
    if inherit:
        ok, shed = absorbable(inherit, num_layers)
        lines.append(f"stage 0 can shed up to {shed * 1e3:.0f} ms ({num_layers / inherit.placement.llm.pp - 1:g} of an "
                     f"even stage's layers at pp{inherit.placement.llm.pp}); the encoder takes "
                     f"{inherit.encoder_s * 1e3:.0f} ms: {'absorbable' if ok else 'not absorbable'}")
    if inherit and disjoint:
        win, lose = (inherit, disjoint) if inherit.step_s <= disjoint.step_s else (disjoint, inherit)
        why = ("stage 0 absorbs the encoder by holding fewer language layers, and no GPUs sit on a separate grid"
               if win is inherit else
               "the encoder on stage 0 outweighs what moving layers off stage 0 can absorb (or its replicated "
               "tower costs every TP rank), so a separate encoder grid sized to the language stage time is faster")
        lines.append(f"choice: {win.placement.kind} ({win.step_s:.2f} s vs {lose.step_s:.2f} s, "
                     f"{lose.step_s / win.step_s - 1:.0%} slower): {why}")
    return lines


def vlm_cmd(
    model: str = typer.Option(..., "--model", help="HF config.json with a vision_config."),
    cluster: str = typer.Option("h100", "--cluster", help="GPU id or cluster YAML."),
    gpus: int = typer.Option(64, "--gpus", help="Number of GPUs."),
    seq: int = typer.Option(DEFAULT_SEQ, "--seq", help="Language-model sequence length (text + image tokens)."),
    gbs: int = typer.Option(DEFAULT_GBS, "--gbs", help="Global batch, samples."),
    images: Optional[str] = typer.Option(None, "--images-per-sample", help="mean=M,pNN=T"),
    tokens: Optional[str] = typer.Option(None, "--tokens-per-image", help="mean=M,pNN=T (language tokens per "
                                         "image, after the merge)"),
    hist: Optional[str] = typer.Option(None, "--image-hist", help="CSV: images,tokens_per_image,count"),
    percentile: float = typer.Option(95.0, "--tail-percentile", help="Tail percentile for --image-hist."),
    freeze: Optional[str] = typer.Option(None, "--freeze", help="Frozen parts: vision,projector,language."),
    placement: str = typer.Option("auto", "--placement", help="auto, inherit or disjoint."),
    encoder_recompute: bool = typer.Option(True, "--encoder-recompute/--no-encoder-recompute",
                                           help="Also try recomputing the encoder (neither emitter can express it)."),
    explain: bool = typer.Option(False, "--explain", help="Compare the best inherit and disjoint placements."),
    emit: Optional[str] = typer.Option(None, "--emit", help="bridge and/or mimo (comma-separated)."),
    out: Optional[str] = typer.Option(None, "--out", help="Folder for emitted files."),
    as_json: bool = typer.Option(False, "--json", help="Print the plans as JSON."),
) -> None:
    """Plan a vision-language model: encoder placement, first-stage layers, encoder TP/DP, recompute."""
    from autoplan.clusterio import load_cluster
    from autoplan.errors import InputError
    from autoplan.multimodal.data import image_data
    from autoplan.multimodal.params import param_split
    from autoplan.multimodal.reader import load_multimodal
    from autoplan.multimodal.search import best_of, search
    from autoplan.workload import make_workload

    if placement not in ("auto", "inherit", "disjoint"):
        raise InputError(f"--placement {placement!r} must be auto, inherit or disjoint")
    formats = [f.strip() for f in (emit or "").split(",") if f.strip()]
    if any(f not in ("bridge", "mimo") for f in formats):
        raise InputError(f"--emit {emit!r}: formats are bridge and mimo")
    if formats and not out:
        raise InputError("--emit needs --out DIR")
    spec = load_multimodal(model)
    c = load_cluster(cluster, gpus)
    wl = make_workload(seq, gbs)
    data = image_data(images, tokens, hist, percentile)
    if data.tail.image_tokens > seq:
        raise InputError(f"the tail sample holds {data.tail.image_tokens:g} image tokens, more than --seq {seq}; "
                         f"raise --seq or lower the image load")
    fr = _freeze(freeze)
    kinds = ("inherit", "disjoint") if placement == "auto" else (placement,)
    if formats:
        # Megatron-Bridge builds the vision tower on the language model's stage 0 (inherit); the MIMO example runs
        # the encoder on its own grid (disjoint): the search keeps to what the asked-for files can express.
        from autoplan.multimodal import emit_bridge, emit_mimo

        writes = {"bridge": emit_bridge.PLACEMENT, "mimo": emit_mimo.PLACEMENT}
        wanted = {writes[f] for f in formats}
        if len(wanted) > 1 or not wanted & set(kinds):
            raise InputError(f"--emit {','.join(formats)} writes {' and '.join(sorted(wanted))} placements "
                             f"(bridge: encoder on stage 0; mimo: encoder on its own grid) and --placement {placement} "
                             f"searches {' and '.join(kinds)}; emit one format whose placement is searched")
        kinds = tuple(wanted)
    priced = search(spec, c, wl, data, fr, kinds=kinds)
    # Neither emitter can write encoder recompute: with --emit, plans that need it are left out, and named if that
    # leaves nothing that fits.
    needs_recompute = min((p for p in (best_of(priced, k) for k in kinds) if p), key=lambda p: p.step_s, default=None)
    if not encoder_recompute or formats:
        priced = [p for p in priced if not p.placement.encoder_recompute]
    inherit, disjoint = best_of(priced, "inherit"), best_of(priced, "disjoint")
    best = min((p for p in (inherit, disjoint) if p), key=lambda p: p.step_s, default=None)
    drawn = {id(p): drawn_step(spec, c, data, fr, p) for p in (inherit, disjoint) if p}
    split = param_split(spec)
    if as_json:
        print_json({"model": spec.name, "params": {"vision": split.vision, "projector": split.projector,
                    "language": split.language, "total": split.total},
                    "plans": [_row(p, drawn[id(p)]) for p in (best, inherit if best is not inherit else disjoint)
                              if p]})
    else:
        print(f"{spec.name}: {split.total / 1e9:.2f}B parameters = vision {split.vision / 1e6:.0f}M + projector "
              f"{split.projector / 1e6:.0f}M + language {split.language / 1e9:.2f}B")
        for note in spec.notes:
            print(f"note: {note}")
        if best:
            print(f"best: {best.placement.label()}: {best.step_s:.2f} s/step (p{data.tail_percentile:g} load "
                  f"{best.tail_step_s:.2f} s, micro batches as drawn {drawn[id(best)]:.2f} s), peak "
                  f"{best.peak_mem_gib:.1f} GiB")
        if explain:
            for line in explain_lines(inherit, disjoint, data, spec.llm.num_layers, drawn):
                print(line)
    if best is None:
        import sys

        if not priced:
            print(f"no legal placement: --gbs {gbs} must divide into micro batches over the data-parallel ranks of "
                  f"some layout of {gpus} GPUs (try a --gbs with more factors of 2)", file=sys.stderr)
        elif formats and needs_recompute is not None and needs_recompute.placement.encoder_recompute:
            print(f"no placement fits without encoder recompute, which the --emit {','.join(formats)} files cannot "
                  f"express; with it, {needs_recompute.placement.label()} fits ({needs_recompute.step_s:.2f} s/step, "
                  f"{needs_recompute.peak_mem_gib:.1f} GiB): plan without --emit to see it, or try more GPUs, "
                  f"--freeze, or a lighter image load", file=sys.stderr)
        else:
            least = min(priced, key=lambda p: p.peak_mem_gib)
            print(f"no placement fits in memory: the least needs {least.peak_mem_gib:.1f} GiB per GPU "
                  f"({least.placement.label()}); try more GPUs, --freeze, or a lighter image load", file=sys.stderr)
        raise typer.Exit(1)
    if formats:
        _emit(spec, best, fr, formats, Path(out), c.num_gpus, seq, gbs)


def _emit(spec, best, fr, formats, out: Path, world: int, seq: int, gbs: int) -> None:
    from autoplan.multimodal.emit_bridge import BRIDGE_RELEASE, bridge_overrides, bridge_yaml
    from autoplan.multimodal.emit_mimo import LAUNCH_ENV, MIMO_COMMIT, mimo_args

    files = {}
    if "bridge" in formats:
        files["bridge_overrides.yaml"] = bridge_yaml(bridge_overrides(spec, best.placement, fr, seq, gbs),
                                                     [f"{spec.name}: {BRIDGE_RELEASE} VLM recipe overrides",
                                                      best.placement.label()])
    if "mimo" in formats:
        args = mimo_args(spec, best.placement, world, seq, gbs)
        pairs = [" ".join(args[i:i + 2]) if i + 1 < len(args) and not args[i + 1].startswith("--") else args[i]
                 for i in range(len(args)) if args[i].startswith("--")]
        env = " ".join(f"{k}={v}" for k, v in LAUNCH_ENV)
        files["mimo_args.txt"] = (
            f"# Megatron-LM examples/mimo/pretrain_mimo.py at {MIMO_COMMIT} or later\n"
            f"# launch environment: {env}\n"
            f"# --model-provider: that commit registers only nemotron-moe-vlm; name a provider that builds this "
            f"model\n" + "\n".join(pairs) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
