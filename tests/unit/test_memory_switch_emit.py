"""Memory switches and the Megatron emitter: bf16 Adam moments emitted as the flags that set them; the fused
weighted squared ReLU, which has no flag, refused."""
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


def test_fused_weighted_squared_relu_is_not_emitted_silently():
    """Megatron-LM's arguments.py has no flag for use_fused_weighted_squared_relu: a plan carrying it is refused
    rather than launched without it (the launch would hold more memory than priced)."""
    import pytest
    from autoplan.errors import InputError
    from engine_checks.plans import MIXTRAL
    relu = MIXTRAL.model_copy(update={"activation": "gelu"})
    with pytest.raises(InputError, match="fused_weighted_squared_relu=true has no Megatron-LM command-line flag"):
        megatron_args(make_plan(relu, 64, 4096, 256, ep=8, fused_weighted_squared_relu=True))


def test_bf16_moments_round_trip_and_fp32_moments_stay_at_twelve_bytes(tmp_path):
    from autoplan.integrations.importers import from_megatron_args
    from autoplan.integrations.megatron import emit_megatron
    path = tmp_path / "megatron_args.txt"
    path.write_text(emit_megatron(make_plan(LLAMA_8B, 8, 4096, 32, zero=1, adam_bf16_states=True))["megatron_args.txt"])
    assert from_megatron_args(str(path)).strategy.get("adam_bf16_states")
    fp32_moments = path.read_text().replace("--exp-avg-dtype bf16", "--exp-avg-dtype fp32")
    assert not from_megatron_args(fp32_moments).strategy.get("adam_bf16_states")
