"""Reading Megatron-LM arguments and launch scripts; emit -> import round trips."""
import pytest

from autoplan.errors import InputError
from autoplan.integrations.importers import ImportedConfig, from_megatron_args
from autoplan.integrations.megatron import emit_megatron
from autoplan.integrations.megatron_flags import NOT_PRICED_FLAGS, READ_FLAGS
from autoplan.integrations.megatron_model_args import padded_vocab
from autoplan.strategy import strategy_from_mapping
from autoplan.validate import effective_fp8_recipe
from autoplan.costmodel.params import count_parameters
from engine_checks.plans import (B200, DEEPSEEK_V2_LITE, GPT2_SMALL, LLAMA_8B, MIXTRAL, TINY, TINY_MOE,
                                 golden_plans, make_plan, mixer_plans)

ROUND_TRIP = {name: plan for name, (plan, engine) in golden_plans().items() if engine == "megatron"}
ROUND_TRIP.update({
    "mixtral_vpp_a2a": make_plan(MIXTRAL, 64, 4096, 256, tp=2, pp=2, vpp=2, ep=8, etp=2, sp=True,
                                 moe_a2a_overlap=True),
    "mixtral_flex_dispatcher": make_plan(MIXTRAL, 64, 4096, 256, ep=8, moe_flex_dispatcher=True),
    "gpt2_fsdp": make_plan(GPT2_SMALL, 8, 1024, 32, zero=3, tp=2, sp=True, tp_comm_overlap=True),
    "sp_without_tp_overlap_bf16_grads": make_plan(GPT2_SMALL, 8, 1024, 32, tp=2, sp=True, tp_comm_overlap=False,
                                                  grad_reduce_bf16=True),
    "gpt2_uneven_zero0": make_plan(GPT2_SMALL, 8, 1024, 32, zero=0, pp=2, first_stage_layers=5, last_stage_layers=7,
                                   overlap_grad_reduce=False),
    "mla_q_lora": make_plan(DEEPSEEK_V2_LITE.model_copy(update={"q_lora_rank": 512, "moe_layer_freq": 2}), 8, 1024,
                            32, ep=8),
    "fp8_param_gather": make_plan(LLAMA_8B, 8, 8192, 128, fp8="hybrid", fp8_param=True, zero=1,
                                  grad_reduce_bf16=True),
    "cpu_offload": make_plan(LLAMA_8B, 8, 4096, 64, tp=2, sp=True, cpu_offload_layers=8),
    "llama31_rope_scaling": make_plan(LLAMA_8B.model_copy(update={"rope_scaling": "llama3",
                                                                  "rope_scaling_factor": 8.0}), 8, 8192, 64),
    "yarn": make_plan(LLAMA_8B.model_copy(update={"rope_scaling": "yarn", "rope_scaling_factor": 4.0,
                                                  "rope_original_max_position_embeddings": 8192}), 8, 8192, 64),
    "gpt_oss_like": make_plan(TINY_MOE.model_copy(update={
        "attention_sinks": True, "swiglu_limit": 7.0, "moe_aux_loss_coeff": 0.9, "add_bias_linear": True,
        "add_qkv_bias": True, "sliding_window": 64, "num_sliding_window_layers": 4, "first_k_dense_layers": 0}),
        8, 128, 8, ep=4),
    "yarn_betas": make_plan(LLAMA_8B.model_copy(update={"rope_scaling": "yarn", "rope_scaling_factor": 32.0,
                                                        "rope_original_max_position_embeddings": 4096,
                                                        "rope_beta_fast": 1.0, "rope_beta_slow": 0.5}), 8, 8192, 64),
    "window_one_token": make_plan(TINY.model_copy(update={"sliding_window": 1, "num_sliding_window_layers": 4}),
                                  8, 128, 8),
    "mla_yarn": make_plan(DEEPSEEK_V2_LITE.model_copy(update={
        "rope_scaling": "yarn", "rope_scaling_factor": 40.0, "rope_original_max_position_embeddings": 4096,
        "rope_mscale": 0.707, "rope_mscale_all_dim": 0.707}), 8, 1024, 32, ep=8),
    "account_for_embedding_and_loss": make_plan(LLAMA_8B.model_copy(update={"num_layers": 30}), 16, 4096, 64,
                                                pp=2, tp=2, sp=True, account_for_embedding=True,
                                                account_for_loss=True),
    "pipeline_layout": make_plan(LLAMA_8B, 16, 4096, 64, pp=2, vpp=2, pipeline_layout="Et*7|t*9|t*8|t*8L"),
    "nvfp4": make_plan(LLAMA_8B, 8, 4096, 64, gpu=B200, fp8="hybrid", fp8_recipe="nvfp4"),
    "window_block": make_plan(TINY.model_copy(update={"sliding_window": 64, "num_sliding_window_layers": 2,
                                                      "add_qkv_bias": True, "qk_layernorm": True}),
                              8, 128, 8, recompute="full", recompute_method="block", recompute_layers=2),
    "te_op_fuser": make_plan(MIXTRAL, 64, 4096, 256, ep=8, te_op_fuser=True),
    "cuda_graphs_per_layer": make_plan(MIXTRAL, 64, 4096, 256, ep=8,
                                       cuda_graph_modules=("attn", "moe_router", "moe_preprocess")),
    "cuda_graphs_full_iteration": make_plan(LLAMA_8B, 8, 4096, 64, cuda_graph_modules=("full_iteration",),
                                            recompute="full", recompute_method="uniform", recompute_layers=1),
})


def effective(strategy, gpu_id="h100"):
    """tp_comm_overlap=None means 'follows sp' and fp8_recipe=None 'the GPU's default'; compare what runs."""
    recipe = effective_fp8_recipe(strategy.fp8_recipe, gpu_id) if strategy.uses_fp8 else None
    return strategy.model_copy(update={"tp_comm_overlap": strategy.tp_overlap_on, "fp8_recipe": recipe})


@pytest.mark.parametrize("case", sorted(ROUND_TRIP))
def test_round_trip(case, tmp_path):
    plan = ROUND_TRIP[case]
    path = tmp_path / "megatron_args.txt"
    path.write_text(emit_megatron(plan)["megatron_args.txt"])
    imported = from_megatron_args(str(path))
    assert isinstance(imported, ImportedConfig) and imported.source == "megatron"
    # Megatron pads the vocabulary to a multiple of 128 x tp; the imported model holds the rows the run allocates.
    # With biases on every linear layer the QKV bias is implied (add_qkv_bias is then not written).
    padded = padded_vocab(plan.model.vocab_size, {}, plan.strategy.tp)
    qkv_bias = plan.model.add_qkv_bias and not plan.model.add_bias_linear
    assert imported.model.model_copy(update={"name": plan.model.name}) == \
        plan.model.model_copy(update={"vocab_size": padded, "add_qkv_bias": qkv_bias})
    assert effective(strategy_from_mapping(imported.strategy), plan.cluster.gpu.id) == \
        effective(plan.strategy, plan.cluster.gpu.id)
    assert imported.workload == plan.workload


def test_imported_config_is_frozen():
    imported = from_megatron_args(emit_megatron(ROUND_TRIP["gpt2_fsdp"])["megatron_args.txt"])
    with pytest.raises(Exception):
        imported.world_size = 4


LAUNCH_SCRIPT = r"""#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
DATA_PATH=/data/x   # not used here
torchrun --nproc_per_node 8 --nnodes 2 --master_addr $MASTER_ADDR \
    pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 \
    --seq-length 4096 --max-position-embeddings 8192 \
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 \
    --num-layers-per-virtual-pipeline-stage 4 \
    --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear \
    --untie-embeddings-and-output-weights --vocab-size 32000 \
    --micro-batch-size 2 --global-batch-size 64 --bf16 --use-distributed-optimizer \
    --data-path $DATA_PATH --lr 1e-4 --save-interval 500 --use-flash-attn \
    --recompute-activations  # [V] selective recompute
"""


def test_launch_script_with_continuations_and_shell_variables():
    imported = from_megatron_args(LAUNCH_SCRIPT)
    m = imported.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels) == (32, 4096, 32, 8,
                                                                                                        128)
    # Megatron's SwiGLU default ffn: 2/3 of 4h, rounded down to a multiple of 64.
    assert m.ffn_hidden_size == 10880 and m.max_position_embeddings == 8192 and not m.tie_embeddings
    s = imported.strategy
    assert (s["tp"], s["pp"], s["vpp"], s["mbs"], s["zero"]) == (4, 2, 4, 2, 1)
    assert imported.world_size == 16 and imported.workload.global_batch_size == 64
    assert s["recompute"] == "selective" and s["fp8"] == "none"


def test_megatron_defaults_when_flags_are_absent():
    imported = from_megatron_args("--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 "
                                  "--vocab-size 50257 --global-batch-size 8")
    m = imported.model
    assert m.tie_embeddings and m.add_bias_linear and m.activation == "gelu" and m.normalization == "layernorm"
    assert m.position_embedding == "learned" and m.ffn_hidden_size == 3072 and m.max_position_embeddings == 1024
    assert imported.strategy["zero"] == 0 and imported.world_size is None
    assert m.hidden_dropout == 0.1  # TransformerConfig.hidden_dropout default: its masks are counted
    assert from_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                              "--vocab-size 100 --global-batch-size 8 --hidden-dropout 0.0").model.hidden_dropout == 0.0


def test_global_batch_defaults_to_mbs_times_dp_with_known_world():
    imported = from_megatron_args("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                                  "--num-attention-heads 4 --seq-length 128 --vocab-size 100 "
                                  "--tensor-model-parallel-size 2 --micro-batch-size 3")
    assert imported.workload.global_batch_size == 12 and imported.notes


@pytest.mark.parametrize("text, message", [
    ("--num-layers x --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 9 --global-batch-size 1",
     "--num-layers expects a positive integer, got 'x'"),
    ("--num-layers $L --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 9 --global-batch-size 1",
     "the shell variable L is not assigned in the file"),
    ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --global-batch-size 1",
     "cannot tell the vocabulary size"),
    ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 9 --global-batch-size 1",
     "lack --seq-length"),
    ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 9 --global-batch-size 1 "
     "--num-experts 4 --moe-layer-freq [1,0,1,1]", "not 'k dense layers, then every n-th layer MoE'"),
    ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 9 --global-batch-size 1 "
     "--num-experts 4 --moe-layer-freq '([1]*4).copy()'", "is not a list pattern"),
    ("--num-layers 2 --hidden-size 64 'unclosed", "quoting"),
    ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8 --vocab-size 9 --global-batch-size 1 "
     "--window-size -2,0", "--window-size left=-2 must be >= 0"),
])
def test_malformed_input_is_one_line_error(text, message):
    with pytest.raises(InputError, match=None) as err:
        from_megatron_args(text)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("window, expected", [("127,0", (128, 2)), ("(4095, 0)", (4096, 2)), ("-1,0", (0, 0))])
def test_window_size_is_flash_attentions_left_count(window, expected):
    # flash-attention window_size=(left, right): a query sees `left` earlier keys and itself, so HF sliding_window is
    # left + 1; -1 is flash-attention's "no limit" (full causal attention).
    model = from_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 8 "
                               f"--vocab-size 9 --global-batch-size 1 --window-size '{window}'").model
    assert (model.sliding_window, model.num_sliding_window_layers) == expected


@pytest.mark.parametrize("dispatcher, expected", [
    ("--moe-token-dispatcher-type flex", True),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", True),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep", True),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep", False),
    ("--moe-token-dispatcher-type alltoall", False),
])
def test_flex_dispatcher_is_read_back(dispatcher, expected):
    text = emit_megatron(make_plan(MIXTRAL, 64, 4096, 256, ep=8))["megatron_args.txt"]
    text = text.replace("--moe-token-dispatcher-type alltoall", dispatcher)
    assert dispatcher in text
    assert from_megatron_args(text).strategy.get("moe_flex_dispatcher", False) is expected


@pytest.mark.parametrize("case", sorted(ROUND_TRIP) + sorted(mixer_plans()))
def test_every_emitted_flag_is_read_or_known_not_to_change_the_price(case):
    argv = emit_megatron({**ROUND_TRIP, **mixer_plans()}[case])["megatron_args.txt"].split()
    flags = {w[2:] for w in argv if w.startswith("--")}
    assert flags - READ_FLAGS - NOT_PRICED_FLAGS == set()


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        from_megatron_args(str(tmp_path / "train.sh"))


SMALL = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --global-batch-size 8 "


@pytest.mark.parametrize("tokenizer, vocab", [
    ("--tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt", 50304),  # 50257 -> x128
    ("--tokenizer-type GPT2BPETokenizer --tensor-model-parallel-size 4", 50688),  # 50257 -> x512
    ("--vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt", 50304),
    ("--tokenizer-type Llama2Tokenizer --tokenizer-model /data/tokenizer.model", 32000),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B", 128256),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V3 "
     "--make-vocab-size-divisible-by 3232", 129280),
    ("--vocab-size 128256 --tokenizer-type NullTokenizer --tensor-model-parallel-size 8", 129024),
])
def test_tokenizer_implies_the_padded_vocabulary(tokenizer, vocab):
    assert from_megatron_args(SMALL + tokenizer).model.vocab_size == vocab


def test_unknown_tokenizer_asks_for_vocab_size_and_set_supplies_it():
    text = SMALL + "--tokenizer-type HuggingFaceTokenizer --tokenizer-model /models/my-tokenizer"
    with pytest.raises(InputError) as err:
        from_megatron_args(text)
    assert "--set vocab_size=N" in str(err.value) and "\n" not in str(err.value)
    assert from_megatron_args(text, overrides=["vocab_size=50000"]).model.vocab_size == 50000


SCRIPT = r"""#!/bin/bash
NUM_LAYERS=${NUM_LAYERS:-4}   # environment default
GPUS_PER_NODE=8; NNODES=2
WORLD=$(($GPUS_PER_NODE*$NNODES))
DTYPE="fp8"
MODEL_ARGS=(
    --num-layers $NUM_LAYERS
    --hidden-size 256 --num-attention-heads 8   # a comment (with parentheses)
    --seq-length 1024 --vocab-size 32000
)
if [[ "$DTYPE" == "fp8" ]]; then
    PREC=("--fp8-format hybrid" "--fp8-param-gather")
elif [[ "$DTYPE" == "bf16" ]]; then
    PREC=(--bf16)
else
    PREC=()
fi
if [ -n "${WANDB_API_KEY}" ]; then
    MODEL_ARGS+=(--num-layers 99)
fi
TRAIN=(--micro-batch-size 2 --global-batch-size 64 --use-distributed-optimizer --bf16
       --cpu-offloading-num-layers 2)
while [[ $# -gt 0 ]]; do
    case $1 in
        --layers) NUM_LAYERS="$2"; shift 2 ;;
    esac
done
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py ${MODEL_ARGS[@]} \
    "${TRAIN[@]}" ${PREC[@]} 2>&1 | tee log.txt
"""


def test_script_arrays_branches_and_defaults_are_read():
    imported = from_megatron_args(SCRIPT)
    assert imported.model.num_layers == 4 and imported.world_size == 16
    s = imported.strategy
    assert (s["fp8"], s.get("fp8_param"), s["zero"], s["mbs"], s.get("cpu_offload_layers")) == \
        ("hybrid", True, 1, 2, 2)


def test_bf16_script_stays_bf16_and_unknown_variables_are_named():
    assert from_megatron_args(SCRIPT.replace('DTYPE="fp8"', 'DTYPE="bf16"')).strategy["fp8"] == "none"
    with pytest.raises(InputError) as err:
        from_megatron_args(SCRIPT.replace("--seq-length 1024", "--seq-length $SEQ"))
    assert "shell variable SEQ is not assigned" in str(err.value)


def test_memory_switches_of_a_script_are_read():
    script = SCRIPT.replace("DTYPE=", "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nDTYPE=")
    script = script.replace("--cpu-offloading-num-layers 2",
                            "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te")
    s = from_megatron_args(script).strategy
    assert s.get("expandable_segments") is True and s.get("te_cross_entropy") is True
    native = from_megatron_args(SCRIPT.replace("--cpu-offloading-num-layers 2", "--cross-entropy-loss-fusion"))
    assert "te_cross_entropy" not in native.strategy and "expandable_segments" not in native.strategy


def test_routing_round_trips_and_sigmoid_ignores_pre_softmax(tmp_path):
    from autoplan.modelio import load_model

    plan = make_plan(load_model("deepseek-v3"), 64, 4096, 256, tp=2, ep=32, etp=1, sp=True, zero=1)
    path = tmp_path / "megatron_args.txt"
    path.write_text(emit_megatron(plan)["megatron_args.txt"])
    model = from_megatron_args(str(path)).model
    names = ("moe_router_score_function", "moe_router_norm_topk_prob", "moe_router_expert_bias",
             "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk", "moe_load_balancing")
    assert {n: getattr(model, n) for n in names} == {n: getattr(plan.model, n) for n in names}
    # Megatron-LM's DeepSeek-R1 fragment writes --moe-router-pre-softmax with the sigmoid router, which still
    # renormalises its top-k weights (moe_utils.py); a softmax router with it does not.
    for score, norm in (("sigmoid", True), ("softmax", False)):
        text = path.read_text().replace("--moe-router-score-function sigmoid\n",
                                        f"--moe-router-score-function {score}\n--moe-router-pre-softmax\n")
        text = text.replace("--moe-router-enable-expert-bias\n", "" if score == "softmax" else
                            "--moe-router-enable-expert-bias\n")
        path.write_text(text)
        assert from_megatron_args(str(path)).model.moe_router_norm_topk_prob is norm


@pytest.mark.parametrize("case", sorted(mixer_plans()))
def test_recent_attention_variants_round_trip(case):
    """Qwen3-Next's and DeepSeek-V3.2's emitted arguments read back as the model they were written from: the
    mixers, their sizes and gates, and so its parameter count."""
    plan = mixer_plans()[case]
    imported = from_megatron_args(emit_megatron(plan)["megatron_args.txt"]).model
    fields = ("linear_attention_layers", "linear_attention_freq", "gdn_num_key_heads", "gdn_num_value_heads",
              "gdn_key_head_dim", "gdn_value_head_dim", "gdn_conv_kernel", "attention_output_gate",
              "shared_expert_gate", "layernorm_zero_centered", "dsa_index_heads", "dsa_index_head_dim",
              "dsa_index_topk", "dsa_indexer_loss_coeff", "num_layers", "num_experts")
    assert {k: getattr(imported, k) for k in fields} == {k: getattr(plan.model, k) for k in fields}
    padded = plan.model.model_copy(update={"vocab_size": imported.vocab_size})
    assert count_parameters(imported)[0] == count_parameters(padded)[0]


def test_gated_deltanet_pattern_and_missing_sizes_are_read_or_named():
    base = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 1000 "
            "--micro-batch-size 1 --global-batch-size 8 --experimental-attention-variant gated_delta_net ")
    m = from_megatron_args(base + "--linear-attention-freq '[1]*3+[0]+[1]*3+[0]'").model
    assert (m.linear_attention_layers, m.linear_attention_freq) == (6, 4)
    m = from_megatron_args(base + "--linear-attention-freq '[0]*2+[1]*6'").model
    assert (m.linear_attention_layers, m.linear_attention_freq) == (6, 0)
    with pytest.raises(InputError, match="needs --linear-attention-freq"):
        from_megatron_args(base)


def test_dsa_topk_sharing_is_written_for_its_release_and_read_back():
    """GLM-5.2's shared top-k goes out as --dsa-indexer-topk-freq / --dsa-indexer-skip-topk-offset (core_v0.19.0's
    parser has them) and comes back as the same model."""
    from pathlib import Path

    from autoplan.modelio import load_model

    hf = Path(__file__).parents[1] / "data" / "hf_configs"
    m = load_model(str(hf / "glm5_2.json"), ["dsa_indexer_loss_coeff=0.01"])
    plan = make_plan(m, 1024, 4096, 2048, tp=2, pp=4, ep=32, etp=1, sp=True, zero=1, first_stage_layers=18,
                     last_stage_layers=20)
    text = emit_megatron(plan)["megatron_args.txt"]
    assert "--dsa-indexer-topk-freq 4" in text and "--dsa-indexer-skip-topk-offset 3" in text
    imported = from_megatron_args(text).model
    assert (imported.dsa_indexer_topk_freq, imported.dsa_indexer_skip_topk_offset,
            imported.num_dsa_indexer_layers) == (4, 3, 21)
    with pytest.raises(InputError, match="dsa-indexer-topk-freq.*core_v0.19.0"):
        emit_megatron(plan, release="core_v0.18.2")
