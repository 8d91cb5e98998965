"""Build (or load) the JIT ops a DeepSpeed probe will load, before the probe is timed.

DeepSpeed compiles an op the first time a process loads it, unless it was pre-built at install (DS_BUILD_OPS=1):
- the CPU shared-memory all-reduce `deepspeed_shm_comm` whenever a process group starts on an accelerator that
  offers it (deepspeed/comm/torch.py `TorchBackend.__init__` -> `build_shm_op`, which asks the accelerator for
  `ShareMemCommBuilder` and loads it when `deepspeed.ops.__compatible_ops__` says it can be built);
- the optimizer's op when the config names one: `cpu_adam` for ZeRO-Offload of the optimizer to CPU
  (`zero_optimization.offload_optimizer.device == "cpu"`, runtime/engine.py `_configure_basic_optimizer`),
  `fused_adam` for an Adam/AdamW `optimizer` section on an accelerator (ops/adam/fused_adam.py).
A first build takes minutes on a busy machine (181-300 s for `deepspeed_shm_comm` on a loaded 2-core host, README
"Probes: op builds, stale locks, interrupts"), so a probe that built its ops inside its hang deadline was killed as
hung, mid-build, and left torch's build lock behind.

`python -m autoplan.integrations.ds_ops DS_CONFIG` (in the probe's interpreter and environment) loads each op
the way DeepSpeed will, printing one line per step:
    AUTOPLAN_OP {"op": "deepspeed_shm_comm", "state": "loading", "lock": "/.../deepspeed_shm_comm/lock"}
    AUTOPLAN_OP {"op": "deepspeed_shm_comm", "state": "ready", "seconds": 104.2}
Before loading it looks at the op's build lock (integrations/extlocks.py): a live build by another process is
waited for (state "waiting"); a stale one (its builder gone) ends the run at once with state "stale-lock", the
one-line message with its fix, and exit status STALE_LOCK_EXIT, instead of waiting forever inside torch.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

OP_PREFIX = "AUTOPLAN_OP "
STALE_LOCK_EXIT = 4
POLL_S = 1.0
MODULE = "autoplan.integrations.ds_ops"


def prepare_args(ds_config) -> List[str]:
    """Interpreter arguments that prepare the ops of DeepSpeed config `ds_config`: `python *prepare_args(path)`,
    run in the interpreter and environment the ranks will use (the probe's preparation step, the engine checks)."""
    return ["-m", MODULE, str(ds_config)]


def optimizer_builders(config: Dict[str, Any], accelerator: str) -> List[str]:
    """Op builder class names the config's optimizer settings make DeepSpeed load."""
    zero = config.get("zero_optimization", {}) or {}
    offload = (zero.get("offload_optimizer") or {}).get("device", "none")
    if offload == "cpu":
        return ["CPUAdamBuilder"]
    opt = (config.get("optimizer") or {}).get("type", "").lower()
    if opt in ("adam", "adamw") and accelerator != "cpu" and not (config["optimizer"].get("params") or {}).get(
            "torch_adam", False):
        return ["FusedAdamBuilder"]
    return []


def emit(record: Dict[str, Any]) -> None:
    sys.stdout.write(OP_PREFIX + json.dumps(record) + "\n")
    sys.stdout.flush()


def wait_for_lock(name: str, lock: Path) -> None:
    """Wait while a live build holds the lock; exit STALE_LOCK_EXIT on a stale one."""
    from autoplan.integrations.extlocks import is_stale, stale_message

    announced = False
    while lock.exists():
        if is_stale(lock):
            emit({"op": name, "state": "stale-lock", "lock": str(lock), "message": stale_message(lock)})
            sys.exit(STALE_LOCK_EXIT)
        if not announced:
            emit({"op": name, "state": "waiting", "lock": str(lock)})
            announced = True
        time.sleep(POLL_S)


def load_op(builder) -> None:
    """Load one op as DeepSpeed does (pre-built module or JIT build), reporting the steps."""
    from torch.utils.cpp_extension import _get_build_directory

    name = builder.NAME
    lock = Path(_get_build_directory(builder.name, verbose=False)) / "lock"
    emit({"op": name, "state": "loading", "lock": str(lock)})
    wait_for_lock(name, lock)
    start = time.monotonic()
    builder.load(verbose=False)
    emit({"op": name, "state": "ready", "seconds": round(time.monotonic() - start, 3)})


def main(argv: List[str]) -> int:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    config = json.loads(Path(argv[0]).read_text())
    accel = get_accelerator()
    names = ["ShareMemCommBuilder"] + optimizer_builders(config, accel._name)
    for class_name in names:
        builder = accel.create_op_builder(class_name)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            emit({"op": class_name, "state": "not-used"})
            continue
        load_op(builder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
