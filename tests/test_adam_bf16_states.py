"""bf16 Adam moments (Megatron's precision-aware optimizer): emitted as the flags that set them."""
from autoplan.integrations.megatron import megatron_args
from engine_checks.plans import LLAMA_8B, make_plan

FLAGS = ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]


def _contains(argv, seq):
    return any(argv[i:i + len(seq)] == seq for i in range(len(argv)))


def test_emitted_with_the_bf16_moment_dtypes_and_only_when_set():
    on = megatron_args(make_plan(LLAMA_8B, 8, 4096, 32, zero=1, adam_bf16_states=True))
    off = megatron_args(make_plan(LLAMA_8B, 8, 4096, 32, zero=1))
    assert _contains(on, FLAGS) and "--use-distributed-optimizer" in on
    assert "--use-precision-aware-optimizer" not in off and "--exp-avg-dtype" not in off
