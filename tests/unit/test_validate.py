"""Each Megatron-LM layout/batch/precision rule: a strategy that breaks it is rejected with a one-line message that
names the rule, and a neighbouring strategy that keeps it passes."""
from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from autoplan.cluster import ClusterSpec, GpuSpec
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.strategy import Strategy
from autoplan.valid_values import stage_layer_counts, suggest_uneven_split, uneven_split_problem
from autoplan.validate import first_broken_rule, has_dense_layers, is_blackwell, recompute_layer_limit, validate
from autoplan.workload import Workload


def gpu(gpu_id: str = "h100", fp8: bool = True, domain: int = 8) -> GpuSpec:
    peaks = {"bf16": 989.0, **({"fp8": 1979.0} if fp8 else {})}
    return GpuSpec(id=gpu_id, name=gpu_id.upper(), peak_tflops=peaks, gemm_efficiency={"bf16": 0.8},
                   hbm_gib=80.0, hbm_bandwidth_tbps=3.35, nvlink_bandwidth_gbytes_per_s=450.0,
                   nvlink_domain_size=domain, gpus_per_node=8, nics_per_node=8, nic_gbit_per_s=400.0,
                   source="test")


DENSE = dict(name="dense-8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
             num_query_groups=8, kv_channels=128, vocab_size=128256, max_position_embeddings=8192)
MOE = dict(DENSE, name="moe-8x7b", num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=14336)
MLA = dict(DENSE, name="mla", num_attention_heads=32, num_query_groups=32, multi_latent_attention=True,
           kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)


def run(model: dict = DENSE, world: int = 8, seq: int = 4096, gbs: int = 64, device: GpuSpec = None,
        strategy: Strategy = None, **keys) -> Strategy:
    """validate() on small hand-built inputs; `keys` build the Strategy unless one is given."""
    return validate(ModelSpec(**model), ClusterSpec(gpu=device or gpu(), num_gpus=world),
                    Workload(seq_len=seq, global_batch_size=gbs), strategy or Strategy(**keys))


def rejected(*words: str, **kwargs) -> str:
    """Assert the inputs are rejected with one line holding every word; return the message."""
    with pytest.raises(InputError) as info:
        run(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


# ---- parallel sizes and world size -------------------------------------------------------------------------

def test_degree_larger_than_world():
    rejected("tp=16 exceeds the 8 GPUs", "valid tp: 1, 2, 4, 8", world=8, tp=16)
    rejected("ep=16 exceeds", model=MOE, world=8, ep=16)
    assert run(world=8, tp=8, sp=True).tp == 8


def test_world_divisible_by_model_parallel():
    msg = rejected(world=96, gbs=96, tp=8, pp=4, cp=2, sp=True)
    assert msg == "world size 96 must be divisible by tp*pp*cp=8*4*2=64; valid pp for tp=8, cp=2: 1, 2, 3, 6"
    assert run(world=128, gbs=64, tp=8, pp=4, cp=2, sp=True).dp == 2
    # when only tp can change, the offered tp values also suit the heads (32) and query groups (8)
    rejected("valid tp for pp=1, cp=1: 1, 2, 4, 8, 16, 32", world=64, tp=3)


def test_dp_is_filled_in_and_a_given_dp_must_match():
    assert run(world=64, tp=2, pp=2, sp=True).dp == 16
    rejected("dp=8 does not match", "use dp=16", world=64, tp=2, pp=2, sp=True, dp=8)
    assert run(world=64, tp=2, pp=2, sp=True, dp=16).dp == 16


def test_tp_outside_nvlink_domain_is_not_an_error():
    assert run(world=16, tp=16, sp=True, device=gpu(domain=8)).tp == 16


# ---- attention shape ---------------------------------------------------------------------------------------

def test_mla_with_gqa_is_impossible():
    rejected("multi_latent_attention", "grouped-query", "num_query_groups=32",
             model=dict(MLA, num_query_groups=8))
    assert run(model=MLA, tp=8, sp=True).tp == 8


def test_hidden_divisible_by_heads_when_kv_channels_implied():
    odd = dict(DENSE, hidden_size=4112, ffn_hidden_size=14336, kv_channels=128)  # 4112 // 32 = 128, not exact
    rejected("hidden_size=4112 must be divisible by num_attention_heads=32", model=odd)
    assert run(model=dict(odd, kv_channels=96)).dp == 8  # an explicit head dim needs no divisibility


def test_heads_divisible_by_tp():
    mha28 = dict(DENSE, num_attention_heads=28, num_query_groups=28, hidden_size=3584, kv_channels=128,
                 ffn_hidden_size=18928)
    msg = rejected(model=mha28, world=56, gbs=56, tp=8, sp=True)
    assert msg == "tp=8 must divide num_attention_heads=28; valid tp: 1, 2, 4, 7, 14, 28"
    assert run(model=mha28, world=56, gbs=56, tp=7).dp == 8


def test_query_groups_multiple_or_divisor_of_tp():
    gqa6 = dict(DENSE, num_attention_heads=24, num_query_groups=6, hidden_size=3072, ffn_hidden_size=8192)
    rejected("num_query_groups=6 must be a multiple or a divisor of tp=4", "valid tp: 1, 2", model=gqa6,
             world=8, tp=4, sp=True)
    assert run(model=gqa6, world=8, tp=2, sp=True).tp == 2


def test_mlp_width_divisible_by_tp_and_etp():
    rejected("tp=4 must divide ffn_hidden_size=14330", model=dict(DENSE, ffn_hidden_size=14330), tp=4, sp=True)
    assert run(model=dict(DENSE, ffn_hidden_size=14330), tp=2, sp=True).tp == 2
    rejected("etp=4 must divide moe_ffn_hidden_size=1402", model=dict(MOE, moe_ffn_hidden_size=1402),
             tp=4, etp=4, sp=True)
    assert run(model=dict(MOE, moe_ffn_hidden_size=1402), tp=4, etp=2, sp=True).etp == 2


# ---- mixture of experts ------------------------------------------------------------------------------------

def test_dense_model_rejects_expert_parallelism():
    rejected("ep=2 needs an MoE model", "dense-8b is dense", "use ep=1", ep=2)
    rejected("etp=2", "use etp=1", etp=2)
    assert run(ep=1, etp=1).ep == 1


def test_num_experts_divisible_by_ep():
    rejected("ep=3 must divide num_experts=8", "valid ep: 1, 2, 4, 8", model=MOE, world=48, gbs=48, ep=3)
    assert run(model=MOE, world=48, gbs=48, ep=8).ep == 8


def test_expert_grid_divides_world():
    msg = rejected("world size 24 must be divisible by etp*ep*pp=2*8*1=16", "expert-DP", model=MOE, world=24,
                   gbs=24, tp=2, etp=2, ep=8, sp=True)
    assert "valid ep for etp=2, pp=1: 1, 2, 4" in msg
    assert run(model=MOE, world=24, gbs=24, tp=2, etp=2, ep=4, sp=True).ep == 4


def test_moe_with_tp_needs_sequence_parallel():
    rejected("MoE model with tp=2 needs sequence parallelism", "sp=true", model=MOE, tp=2, sp=False)
    assert run(model=MOE, tp=2, sp=True).sp


def test_moe_sequence_parallel_rule_is_megatron_only():
    args = (ModelSpec(**MOE), ClusterSpec(gpu=gpu(), num_gpus=8), Workload(seq_len=4096, global_batch_size=64),
            Strategy(tp=2, sp=False))
    assert validate(*args, engine="deepspeed").dp == 4
    with pytest.raises(InputError, match="needs sequence parallelism"):
        validate(*args)
    with pytest.raises(InputError, match="engine 'nemo' is not supported"):
        validate(*args, engine="nemo")


def test_moe_with_bias_needs_etp_1():
    biased = dict(MOE, add_bias_linear=True)
    rejected("etp=2", "add_bias_linear", "etp=1", model=biased, tp=2, etp=2, sp=True)
    assert run(model=biased, tp=2, etp=1, sp=True).etp == 1


def test_moe_a2a_overlap_rules():
    rejected("moe_a2a_overlap=true needs an MoE model with ep>1", moe_a2a_overlap=True)
    rejected("needs the interleaved schedule", model=MOE, world=16, ep=2, pp=2, moe_a2a_overlap=True)
    rejected("cannot be combined with recompute=full", model=MOE, ep=2, moe_a2a_overlap=True, recompute="full")
    assert run(model=MOE, world=16, ep=2, pp=2, vpp=2, moe_a2a_overlap=True).moe_a2a_overlap


def test_moe_flex_dispatcher_needs_moe_with_expert_parallelism():
    rejected("moe_flex_dispatcher=true needs an MoE model with ep>1", "ep=1", moe_flex_dispatcher=True)
    rejected("moe_flex_dispatcher=true", "ep=1", model=MOE, moe_flex_dispatcher=True)
    assert run(model=MOE, ep=2, moe_flex_dispatcher=True).moe_flex_dispatcher


def test_fp8_param_needs_fp8_and_distributed_optimizer():
    rejected("fp8_param=true", "needs fp8 and the distributed optimizer", "fp8=none", fp8_param=True)
    rejected("fp8_param=true", "zero=0", fp8_param=True, fp8="hybrid", zero=0)
    assert run(fp8_param=True, fp8="hybrid", zero=1).fp8_param


def test_cpu_offload_needs_pp_1_and_fewer_layers_than_the_model():
    rejected("cpu_offload_layers=2 needs pp=1", cpu_offload_layers=2, pp=2)
    rejected("must be below num_layers", cpu_offload_layers=DENSE["num_layers"])
    assert run(cpu_offload_layers=2).cpu_offload_layers == 2


# ---- pipeline and virtual pipeline -------------------------------------------------------------------------

def test_layers_divisible_by_pp_without_uneven_stages():
    msg = rejected("num_layers=30 must be divisible by pp=4", "valid pp: 1, 2",
                   "first_stage_layers=", model=dict(DENSE, num_layers=30), pp=4)
    assert "last_stage_layers=" in msg
    assert run(model=dict(DENSE, num_layers=30), pp=2).pp == 2


def test_odd_layer_count_with_vpp_suggests_vpp_1():
    odd = dict(DENSE, num_layers=61)
    msg = rejected("num_layers=61 must be divisible by pp=4", "vpp=1 with first_stage_layers=", model=odd,
                   world=16, pp=4, vpp=2)
    first = int(msg.split("first_stage_layers=")[1].split(",")[0])
    last = int(msg.split("last_stage_layers=")[1])
    assert run(model=odd, world=16, pp=4, first_stage_layers=first, last_stage_layers=last).pp == 4


def test_uneven_stages_only_with_pp_above_1():
    rejected("need pp>1", first_stage_layers=32)
    assert run(pp=2, first_stage_layers=15, last_stage_layers=17).pp == 2


def test_uneven_stage_needs_at_least_one_layer():
    rejected("first_stage_layers=0 must be >= 1", world=16, pp=4, first_stage_layers=0, last_stage_layers=8)


def test_uneven_remaining_layers_split_over_middle_stages():
    rejected("19 layers left", "2 middle pipeline ranks", world=16, pp=4, first_stage_layers=6,
             last_stage_layers=7)
    rejected("must equal num_layers=32", pp=2, first_stage_layers=10, last_stage_layers=10)
    assert run(world=16, pp=4, first_stage_layers=7, last_stage_layers=7).pp == 4
    assert run(world=16, pp=4, last_stage_layers=5).pp == 4  # 27 layers over 3 ranks


def test_vpp_needs_pp_above_1():
    rejected("vpp=2 needs pp>1", vpp=2)
    assert run(pp=2, vpp=2).vpp == 2  # p2p overlap is on, so pp=2 suffices


def test_vpp_divides_layers_per_rank():
    rejected("vpp=3 must divide the layers per pipeline rank num_layers/pp=32/4=8", "valid vpp: 1, 2, 4, 8",
             world=16, pp=4, vpp=3)
    assert run(world=16, pp=4, vpp=4).vpp == 4


def test_uneven_stages_with_vpp():
    rejected("first_stage_layers=7 must be divisible by vpp=2", world=16, pp=4, vpp=2, first_stage_layers=7,
             last_stage_layers=7)
    rejected("layers on each middle pipeline rank must be divisible by vpp=2", world=16, pp=4, vpp=2,
             first_stage_layers=8, last_stage_layers=10)  # 14 left over 2 ranks = 7 each
    assert run(world=16, pp=4, vpp=2, first_stage_layers=6, last_stage_layers=6).vpp == 2


# ---- sequence ----------------------------------------------------------------------------------------------

def test_seq_within_max_position_embeddings():
    rejected("seq_len=16384 exceeds max_position_embeddings=8192", "use seq_len <= 8192", seq=16384)
    assert run(seq=8192).dp == 8


def test_seq_divisible_by_2cp():
    rejected("seq_len=4100 must be divisible by 2*cp=2*4=8", "valid cp: 1, 2", seq=4100, cp=4)
    assert run(seq=4096, cp=4).cp == 4


def test_context_parallel_with_sliding_window_is_fine():
    windowed = dict(DENSE, sliding_window=128, num_sliding_window_layers=16)
    assert run(model=windowed, cp=2).cp == 2


# ---- sequence parallel -------------------------------------------------------------------------------------

def test_sp_needs_tp_above_1():
    rejected("sp=true needs tp>1", "set sp=false or tp>1", tp=1, sp=True)
    assert not run(tp=1, sp=False).sp


def test_tp_comm_overlap_needs_sp():
    rejected("tp_comm_overlap=true needs sequence parallelism", tp=2, sp=False, tp_comm_overlap=True)
    assert run(tp=2, sp=True, tp_comm_overlap=True).tp_comm_overlap


def test_sp_splits_local_sequence_across_tp():
    rejected("seq_len/cp=4100/1=4100 divisible by tp=8", seq=4100, tp=8, sp=True)
    assert run(seq=4100, tp=4, sp=True).sp


# ---- batch -------------------------------------------------------------------------------------------------

def test_gbs_divisible_by_mbs_times_dp():
    msg = rejected(world=64, gbs=100)
    assert msg == "gbs=100 must be divisible by mbs*dp=1*64=64; valid gbs near 100: 64, 128"
    rejected("valid mbs for dp=8: 1, 2, 4", world=8, gbs=32, mbs=3)
    assert run(world=64, gbs=128, mbs=2).mbs == 2


def test_mbs_at_least_one():
    rejected("mbs=0 must be >= 1", strategy=Strategy().model_copy(update={"mbs": 0}))


# ---- optimizer ---------------------------------------------------------------------------------------------

def test_zero_range():
    rejected("zero=4 must be 0, 1, 2 or 3", strategy=Strategy().model_copy(update={"zero": 4}))


def test_zero3_with_pipeline_rejected():
    rejected("zero=3", "pipeline parallelism (pp=2)", "use zero=1 or pp=1", pp=2, zero=3)
    assert run(pp=1, zero=3).zero == 3


def test_overlap_param_gather_needs_distributed_optimizer_and_grad_overlap():
    rejected("overlap_param_gather=true needs the distributed optimizer", zero=0, overlap_param_gather=True)
    rejected("needs overlap_grad_reduce=true", zero=1, overlap_param_gather=True, overlap_grad_reduce=False)
    assert run(zero=0).zero == 0  # the default switch applies only where possible
    assert run(zero=0, overlap_param_gather=False).zero == 0
    assert run(zero=1, overlap_param_gather=True).overlap_param_gather


# ---- precision ---------------------------------------------------------------------------------------------

def test_fp8_needs_fp8_gpu():
    rejected("fp8=hybrid needs a GPU with FP8", "a100-80g has none", "fp8=none",
             device=gpu("a100-80g", fp8=False), fp8="hybrid")
    assert run(device=gpu("h100"), fp8="hybrid").uses_fp8


def test_mxfp8_needs_blackwell():
    rejected("fp8_recipe=mxfp8 needs a Blackwell GPU", "delayed", fp8="e4m3", fp8_recipe="mxfp8")
    assert run(device=gpu("b200"), fp8="e4m3", fp8_recipe="mxfp8").fp8_recipe == "mxfp8"
    for recipe in ("delayed", "tensorwise", "blockwise"):
        assert run(device=gpu("h100"), fp8="hybrid", fp8_recipe=recipe).fp8_recipe == recipe
    assert is_blackwell("gb200-nvl72") and is_blackwell("B300") and not is_blackwell("h200")


def test_fp8_gemm_dims_multiple_of_16():
    narrow = dict(DENSE, ffn_hidden_size=14280)  # /4 = 3570, /2 = 7140: not multiples of 16
    rejected("fp8 needs GEMM dimensions divisible by 16", "ffn_hidden_size/tp=14280/4=3570", model=narrow,
             tp=4, sp=True, fp8="hybrid")
    assert not run(model=narrow, tp=4, sp=True).uses_fp8
    assert run(tp=8, sp=True, fp8="hybrid").uses_fp8


def test_fp8_tokens_multiple_of_8():
    rejected("mbs*seq_len/cp=1*4100/1=4100", seq=4100, gbs=8, fp8="hybrid")
    assert run(seq=4104, gbs=8, fp8="hybrid").uses_fp8


# ---- activation recompute ----------------------------------------------------------------------------------

def test_selective_recompute_takes_no_method_or_layers():
    base = Strategy(recompute="selective")
    rejected("recompute=selective takes no recompute_method", strategy=base.model_copy(
        update={"recompute_method": "block"}))
    rejected("recompute=selective takes no recompute_layers", strategy=base.model_copy(
        update={"recompute_layers": 2}))
    assert run(recompute="selective").recompute == "selective"


def test_full_recompute_needs_method():
    full = Strategy(recompute="full").model_copy(update={"recompute_method": None})
    rejected("recompute=full needs recompute_method", strategy=full)


def test_full_recompute_layers_within_layers_per_rank():
    rejected("recompute_layers=9 must be between 1 and 8 (layers per pipeline rank)", world=16, pp=4,
             recompute="full", recompute_method="uniform", recompute_layers=9)
    assert run(world=16, pp=4, recompute="full", recompute_method="uniform", recompute_layers=8).recompute_layers == 8


def test_full_block_recompute_counts_per_chunk_with_vpp():
    rejected("between 1 and 4 (layers per model chunk)", world=16, pp=4, vpp=2, recompute="full",
             recompute_method="block", recompute_layers=5)
    assert run(world=16, pp=4, vpp=2, recompute="full", recompute_method="block", recompute_layers=4).vpp == 2


def test_recompute_limit_uses_largest_uneven_stage():
    s = Strategy(pp=4, first_stage_layers=5, last_stage_layers=5, recompute="full", recompute_layers=11)
    assert recompute_layer_limit(ModelSpec(**DENSE), s) == 11  # 22 layers over 2 middle ranks
    assert run(world=16, strategy=s).recompute_layers == 11


# ---- helpers -----------------------------------------------------------------------------------------------

def test_stage_layer_counts_and_uneven_suggestion():
    assert stage_layer_counts(32, 4, None, None) == [8, 8, 8, 8]
    assert stage_layer_counts(32, 4, 5, None) == [5, 9, 9, 9]
    assert stage_layer_counts(32, 4, 5, 5) == [5, 11, 11, 5]
    first, last = suggest_uneven_split(61, 4)
    assert uneven_split_problem(61, 4, 1, first, last) is None
    assert sum(stage_layer_counts(61, 4, first, last)) == 61
    assert suggest_uneven_split(61, 1) is None


@pytest.mark.parametrize("layers,first_k,freq", [(4, 0, 1), (4, 1, 1), (4, 0, 2), (1, 0, 2), (5, 4, 3), (2, 1, 2)])
def test_has_dense_layers_matches_the_layer_count(layers, first_k, freq):
    m = ModelSpec(**dict(MOE, num_layers=layers, first_k_dense_layers=first_k, moe_layer_freq=freq))
    assert has_dense_layers(m) == (m.num_dense_layers > 0)
    assert has_dense_layers(ModelSpec(**DENSE))


def test_first_broken_rule_is_none_for_a_good_strategy():
    assert first_broken_rule(ModelSpec(**DENSE), ClusterSpec(gpu=gpu(), num_gpus=8),
                             Workload(seq_len=4096, global_batch_size=64), Strategy(tp=2, sp=True)) is None


# ---- property ----------------------------------------------------------------------------------------------

@st.composite
def layouts(draw):
    """(model, world, gbs, seq, strategy): a layout built from legal choices, then with one key often replaced by
    an arbitrary value, so that both outcomes are common."""
    moe, world = draw(st.booleans()), draw(st.sampled_from([8, 16, 24, 64, 96]))
    pick = lambda values: draw(st.sampled_from(values))  # noqa: E731
    tp = pick([d for d in (1, 2, 4, 8) if world % d == 0])
    pp = pick([d for d in (1, 2, 4) if world // tp % d == 0])
    cp = pick([c for c in (1, 2) if world // (tp * pp) % c == 0])
    dp = world // (tp * pp * cp)
    etp = pick([1, tp]) if moe else 1
    ep = pick([e for e in (1, 2, 4, 8) if world % (etp * e * pp) == 0]) if moe else 1
    keys = dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=pick([1, 2]) if pp > 1 else 1, mbs=pick([1, 2]),
                sp=tp > 1 and (moe or draw(st.booleans())), zero=pick([0, 1, 2] + ([3] if pp == 1 else [])),
                fp8=pick(["none", "hybrid"]), recompute=pick(["none", "selective", "full"]))
    gbs = dp * keys["mbs"] * pick([1, 2, 4])
    broken = pick([None, None, "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp", "zero", "gbs", "seq", "split"])
    seq, split = 4096, (None, None)
    if broken == "gbs":
        gbs = pick([100, 250, 1000])
    elif broken == "seq":
        seq = pick([4100, 4104, 9000])
    elif broken == "split":
        split = pick([(7, 7), (5, None), (None, 6), (0, 8), (40, 1)])
    elif broken == "sp":
        keys["sp"] = not keys["sp"]
    elif broken is not None:
        keys[broken] = pick([1, 2, 3, 4, 8, 16, 128] if broken != "zero" else [0, 1, 2, 3])
    strategy = Strategy(**keys, first_stage_layers=split[0], last_stage_layers=split[1])
    return (MOE if moe else DENSE), world, gbs, seq, strategy


@settings(max_examples=400, deadline=None)
@given(layouts())
def test_random_strategies_raise_or_tile_the_world(case):
    model, world, gbs, seq, strategy = case
    try:
        out = run(model=model, world=world, seq=seq, gbs=gbs, strategy=strategy)
    except InputError as e:
        assert str(e) and "\n" not in str(e)
        event("rejected")
        return
    event("accepted")
    assert out.dp * out.tp * out.pp * out.cp == world
    assert gbs % (out.mbs * out.dp) == 0
    assert model["num_attention_heads"] % out.tp == 0 and world % (out.etp * out.ep * out.pp) == 0
    assert out.tp > 1 or not out.sp
    assert out.model_copy(update={"dp": None}) == strategy
