"""Read a folder of Hugging Face `config.json` files as `autoplan plan --model` and `autoplan vlm --model` read them,
and check each model read against the model transformers builds from the same file on the meta device: the
language model's layers and parameter count (`autoplan/hf_meta.py` compare) for a text model, the whole model's
parameter count (vision tower, projector, language model) for a vision-language one. Prints one row per file and
the counts: read and equal to the built model, read but not checkable (transformers cannot build it), read but
different (a defect), refused (with each one-line reason).

    python -m benchmarks.read_hf_configs DIR [--source TEXT]

DIR holds the files (`*.json`); `--source` names where they come from in the printed header (a repository and
commit). The figures of record: benchmarks/results/read_hf_configs_*.txt.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import warnings
from collections import Counter
from pathlib import Path
from typing import Tuple

from autoplan.errors import InputError


def _built_total(cfg) -> int:
    """Parameters of the whole model transformers builds from `cfg` on the meta device (a vision-language model
    with its tower and projector); InputError when it cannot build it."""
    import torch
    import transformers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items()
                                                                             if k != "model_type"})
            with torch.device("meta"):
                model = transformers.AutoModelForImageTextToText.from_config(config)
    except Exception as exc:  # noqa: BLE001 - transformers' own refusal, reported as the row's reason
        raise InputError(f"transformers cannot build it: {str(exc).strip().splitlines()[0][:120]}") from None
    return sum(p.numel() for p in model.parameters())


def check(path: Path) -> Tuple[str, str, str]:
    """(status, model_type, detail) of one file: status is equal, unchecked, different or refused."""
    from autoplan.costmodel.params import count_parameters
    from autoplan.hf_meta import compare, load_structure
    from autoplan.modelio import load_model
    from autoplan.multimodal.params import param_split
    from autoplan.multimodal.reader import is_multimodal, load_multimodal

    cfg = json.loads(path.read_text())
    kind = str(cfg.get("model_type"))
    try:
        if is_multimodal(cfg):
            total = param_split(load_multimodal(str(path))).total
            try:
                built = _built_total(cfg)
            except InputError as e:
                return "unchecked", kind, f"vlm, {total:,} parameters read; {e}"
            return ("equal" if total == built else "different"), kind, f"vlm, {total:,} read, {built:,} built"
        m = load_model(str(path))
    except InputError as e:
        return "refused", kind, str(e).replace(str(path), path.name)
    read = count_parameters(m.model_copy(update={"mtp_num_layers": 0}))[0]
    try:
        diffs = compare(m, load_structure(cfg, path.name))
    except InputError as e:
        return "unchecked", kind, f"{read:,} parameters read (MTP left out); {e}"
    return ("different" if diffs else "equal"), kind, f"{read:,} parameters (MTP left out)" + (
        f"; {'; '.join(diffs)}" if diffs else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--source", default="")
    args = ap.parse_args(argv)
    files = sorted(Path(args.folder).glob("*.json"))
    import transformers

    print(f"{len(files)} config.json files from {args.source or args.folder}; transformers {transformers.__version__}")
    counts: Counter = Counter()
    for path in files:
        status, kind, detail = check(path)
        counts[status] += 1
        print(f"{status:9s}  {path.name:62s}  {kind:18s}  {detail}")
    read = counts["equal"] + counts["unchecked"] + counts["different"]
    print(f"\nread {read} of {len(files)}: {counts['equal']} equal to the built model, {counts['unchecked']} not "
          f"checkable, {counts['different']} different; refused {counts['refused']}")
    return 1 if counts["different"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
