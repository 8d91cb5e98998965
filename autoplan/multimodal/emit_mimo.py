"""Megatron-LM MIMO example arguments (examples/mimo/pretrain_mimo.py, the heterogeneous-grid entry point) for a
disjoint encoder grid.

The heterogeneous-grid arguments exist from Megatron-LM commit cfb8e46ffe08fa027c38ffbe3898e7d8937bd019
(examples/mimo/training/args.py, 2026-08-18); megatron-core 0.16.1's examples/mimo has none of them, so the files are
for that commit or later. Its validation imports a megatron-core newer than the pinned 0.16.1
(`resolve_tensor_parallel_weight_shards`), so it is replicated here, citing examples/mimo/training/args.py at that
commit: CP = 1 only (line 66), experts divisible by --llm-ep (line 76), (micro_batch_size x llm_dp x GTP) %
encoder_dp == 0 (line 102), encoder ranks [0, encoder_tp x encoder_dp) disjoint from the language ranks from
--llm-offset (line 114) and together covering the world exactly (line 122). The removed
--encoder-tensor-model-parallel-size / --encoder-pipeline-model-parallel-size are never written.

pretrain_mimo.py `_parse_and_validate` also runs Megatron-LM's validate_args on the language grid, so the language
model's shape flags are written (integrations/megatron.architecture_args), and it refuses a run without
--use-distributed-optimizer (pretrain_mimo.py line 67). validate_args asks for CUDA_DEVICE_MAX_CONNECTIONS=1 in the
launch environment when TP or CP > 1 on GPUs before Blackwell (megatron/training/arguments.py line 1446): LAUNCH_ENV.
benchmarks/vlm_parser_check.py runs the written arguments through that code."""
from __future__ import annotations

from typing import List

from autoplan import keys as K
from autoplan.errors import InputError
from autoplan.multimodal.emit_bridge import check_transformer_config
from autoplan.multimodal.placement import Placement
from autoplan.multimodal.spec import MultimodalSpec

MIMO_COMMIT = "cfb8e46ffe08fa027c38ffbe3898e7d8937bd019"
LAUNCH_ENV = (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)
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


def arg_list(spec: MultimodalSpec, p: Placement, world: int, seq: int, gbs: int) -> List[str]:
    """The arguments for a disjoint placement, unchecked (mimo_args checks them first)."""
    from autoplan.integrations.megatron import architecture_args

    s = p.llm
    llm_dp = p.llm_gpus // (s.tp * s.pp * s.cp)
    args = ["--encoder-tp", str(p.encoder_tp), "--encoder-dp", str(p.encoder_dp),
            "--llm-offset", str(p.encoder_tp * p.encoder_dp), "--llm-tp", str(s.tp), "--llm-cp", str(s.cp),
            "--llm-pp", str(s.pp), "--llm-dp", str(llm_dp), "--llm-ep", str(s.ep),
            *K.valued("mbs", s.mbs), "--global-batch-size", str(gbs), "--bf16",
            "--use-distributed-optimizer"]
    args += architecture_args(spec.llm, seq)
    for key in ("first_stage_layers", "last_stage_layers"):  # Megatron's arguments (autoplan/keys.py)
        if getattr(s, key) is not None:
            args += K.valued(key, getattr(s, key))
    return args


# The one placement kind the MIMO example expresses: the encoder on its own ranks.
PLACEMENT = "disjoint"


def mimo_args(spec: MultimodalSpec, p: Placement, world: int, seq: int, gbs: int) -> List[str]:
    if p.kind != PLACEMENT:
        raise InputError("the MIMO example runs the encoder on its own ranks only; an encoder on pipeline stage 0 "
                         "(inherit) is emitted with --emit bridge")
    if p.encoder_recompute:
        raise InputError("the MIMO example has no encoder recompute argument; plan without encoder recompute")
    check_mimo(spec, p, world)
    s = p.llm  # the language model's TransformerConfig is built from these arguments (core_transformer_config_from_args)
    check_transformer_config(spec.llm.num_layers, spec.llm.num_attention_heads, spec.llm.num_query_groups, s.tp, s.pp,
                             s.first_stage_layers, s.last_stage_layers)
    return arg_list(spec, p, world, seq, gbs)
