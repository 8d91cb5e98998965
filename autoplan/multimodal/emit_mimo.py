"""Megatron-LM MIMO example arguments (examples/mimo/train.py) for a disjoint encoder grid.

The heterogeneous-grid arguments exist from Megatron-LM commit cfb8e46ffe08fa027c38ffbe3898e7d8937bd019
(examples/mimo/training/args.py, 2026-08-18); megatron-core 0.16.1's examples/mimo has none of them, so the files are
for that commit or later. Its validation imports a megatron-core newer than the pinned 0.16.1
(`resolve_tensor_parallel_weight_shards`), so it is replicated here, citing examples/mimo/training/args.py at that
commit: CP = 1 only (line 66), experts divisible by --llm-ep (line 76), (micro_batch_size x llm_dp x GTP) %
encoder_dp == 0 (line 102), encoder ranks [0, encoder_tp x encoder_dp) disjoint from the language ranks from
--llm-offset (line 114) and together covering the world exactly (line 122). The removed
--encoder-tensor-model-parallel-size / --encoder-pipeline-model-parallel-size are never written."""
from __future__ import annotations

from typing import List

from autoplan import keys as K
from autoplan.errors import InputError
from autoplan.multimodal.placement import Placement
from autoplan.multimodal.spec import MultimodalSpec

MIMO_COMMIT = "cfb8e46ffe08fa027c38ffbe3898e7d8937bd019"
GTP = 1  # generalized TP weight sharding: not planned (--tensor-parallel-num-weight-shards unset)


def check_mimo(spec: MultimodalSpec, p: Placement, world: int) -> None:
    s = p.llm
    llm_dp = p.llm_gpus // (s.tp * s.pp * s.cp)
    if s.cp != 1:
        raise InputError(f"hetero MIMO training currently supports CP=1 only (--llm-cp {s.cp})")
    if spec.llm.num_experts and spec.llm.num_experts % s.ep:
        raise InputError(f"--num-experts ({spec.llm.num_experts}) must be divisible by --llm-ep ({s.ep})")
    if (s.mbs * llm_dp * GTP) % p.encoder_dp:
        raise InputError(f"--micro-batch-size * --llm-dp * GTP must be divisible by --encoder-dp (got {s.mbs} * "
                         f"{llm_dp} * {GTP} % {p.encoder_dp} != 0)")
    enc = set(range(p.encoder_tp * p.encoder_dp))
    offset = p.encoder_tp * p.encoder_dp
    llm = set(range(offset, offset + s.tp * GTP * s.cp * s.pp * llm_dp))
    if enc & llm:
        raise InputError(f"hetero MIMO expects disjoint module rank spans; spans overlap at {sorted(enc & llm)[:8]}")
    if enc | llm != set(range(world)):
        raise InputError(f"the non-colocated module grids must cover every rank exactly once: "
                         f"{len(enc | llm)} ranks covered, world {world}")


def mimo_args(spec: MultimodalSpec, p: Placement, world: int, seq: int, gbs: int) -> List[str]:
    if p.kind != "disjoint":
        raise InputError("the MIMO example runs the encoder on its own ranks only; an encoder on pipeline stage 0 "
                         "(inherit) is emitted with --emit bridge")
    if p.encoder_recompute:
        raise InputError("the MIMO example has no encoder recompute argument; plan without encoder recompute")
    check_mimo(spec, p, world)
    s = p.llm
    llm_dp = p.llm_gpus // (s.tp * s.pp * s.cp)
    args = ["--encoder-tp", str(p.encoder_tp), "--encoder-dp", str(p.encoder_dp),
            "--llm-offset", str(p.encoder_tp * p.encoder_dp), "--llm-tp", str(s.tp), "--llm-cp", str(s.cp),
            "--llm-pp", str(s.pp), "--llm-dp", str(llm_dp), "--llm-ep", str(s.ep),
            *K.valued("mbs", s.mbs), "--global-batch-size", str(gbs), "--seq-length", str(seq), "--bf16"]
    for key in ("first_stage_layers", "last_stage_layers"):  # Megatron's arguments (autoplan/keys.py)
        if getattr(s, key) is not None:
            args += K.valued(key, getattr(s, key))
    return args
