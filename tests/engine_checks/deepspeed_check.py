"""Build deepspeed's own `DeepSpeedConfig` from emitted configs on a fake process group of each plan's world size.

With pipeline stages or AutoTP the data-parallel size comes from DeepSpeed's own topology classes
(`PipeModelDataParallelTopology` + `PipelineParallelGrid`), as the pipeline engine builds it.

    python deepspeed_check.py WORLD_SIZE CONFIG_JSON [WORLD_SIZE CONFIG_JSON ...]
prints 'OK CONFIG_JSON dp=N' per accepted config, or 'REJECTED CONFIG_JSON: <DeepSpeed's error>'."""
from __future__ import annotations

import json
import sys


def check(world_size: int, config: dict) -> int:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    deepspeed.init_distributed(dist_backend="fake")
    try:
        pp = int(config.get("pipeline", {}).get("stages", 1))
        tp = int(config.get("tensor_parallel", {}).get("autotp_size", 1) or 1)
        mpu = None
        if pp > 1 or tp > 1:
            topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=world_size // (pp * tp))
            mpu = PipelineParallelGrid(topology=topology)
        ds_config = DeepSpeedConfig(config, mpu=mpu)
        return int(ds_config.world_size)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    pairs = sys.argv[1:]
    for world, path in zip(pairs[::2], pairs[1::2]):
        try:
            dp = check(int(world), json.load(open(path)))
            print(f"OK {path} dp={dp}", flush=True)
        except Exception as e:  # every failure is a verdict on this file; the next file is still checked
            print(f"REJECTED {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
