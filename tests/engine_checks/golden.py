"""Golden-file comparison: tests/golden/<case>/<file>. AUTOPLAN_UPDATE_GOLDEN=1 rewrites the files instead."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
# ds_train.py and ds_hf_train.py are copies of integrations/ds_train.py and ds_hf_train.py, tested on their own; model.json is the plan's ModelSpec as
# pydantic writes it (every new model field would change it), read back by ds_train.py in the DeepSpeed CPU runs.
UNTRACKED = ("ds_train.py", "ds_hf_train.py", "model.json")


def check_golden(case: str, files: Dict[str, str], skip: Iterable[str] = UNTRACKED) -> None:
    folder = GOLDEN_DIR / case
    files = {name: text for name, text in files.items() if name not in skip}
    if os.environ.get("AUTOPLAN_UPDATE_GOLDEN") == "1":
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
        return
    stored = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    assert stored == sorted(files), f"{case}: golden files {stored} != emitted {sorted(files)}; " \
                                    f"rerun with AUTOPLAN_UPDATE_GOLDEN=1 if the change is intended"
    for name, text in files.items():
        expected = (folder / name).read_text()
        assert text == expected, f"{case}/{name} differs from the golden file; " \
                                 f"rerun with AUTOPLAN_UPDATE_GOLDEN=1 if the change is intended"
