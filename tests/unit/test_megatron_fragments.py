"""Megatron-LM's own example files (tests/data/megatron_examples, sources in its SOURCES.md): model fragments with no
launch line, hybrid patterns, well-known tokenizers, quoting an `eval` re-reads, and models that are not GPT
decoders. Each model file is read with the job from the command line, or refused by name."""
import json
from pathlib import Path

import pytest

from autoplan.errors import InputError
from autoplan.integrations.importers import from_megatron_args
from autoplan.integrations.megatron_tokenizers import HF_TOKENIZER_VOCAB, hf_tokenizer_vocab

DATA = Path(__file__).parents[1] / "data" / "megatron_examples"
HF = Path(__file__).parents[1] / "data" / "hf_configs"

# Files that hold no model to price, and the reason the refusal names.
NO_MODEL = {
    "post_training__modelopt__conf__arguments.sh": "holds no Megatron-LM argument",
    "post_training__modelopt__conf__moonshotai__kimi_k2_instruct.sh": "names its model only by its Hugging Face "
                                                                      "checkpoint (HF_MODEL_CKPT=/workspace/scratch/"
                                                                      "moonshotai/Kimi-K2-Instruct)",
    "post_training__modelopt__conf__moonshotai__kimi_k2_instruct_export.sh": "names its model only by its Hugging "
                                                                             "Face checkpoint",
    "rl__model_configs__common.sh": "but no model",
    "rl__model_configs__nemotron6_3b_moe.sh": "reads the model from its checkpoint (--use-checkpoint-args)",
    "post_training__modelopt__train.sh": "takes its model arguments from a sourced file",
    "academic_paper_scripts__sc21__SRUN.sh": "runs pretrain_gpt.py with $MEGATRON_PARAMS",
}
NOT_GPT = {
    "bert__train_bert_340m_distributed.sh": "BERT/T5 is not a decoder-only GPT model; autoplan plans GPT/Mamba/MoE "
                                            "decoders",
    "t5__train_t5_220m_distributed.sh": "BERT/T5 is not a decoder-only GPT model; autoplan plans GPT/Mamba/MoE "
                                        "decoders",
    "mimo__scripts__run_hetero_nemotron_20l_mock_train.sh": "pretrain_mimo.py trains a multimodal (MIMO) model",
    "multimodal__pretrain_mistral_clip.sh": "MultimodalTokenizer trains a multimodal (vision-language) model",
}
# A tokenizer given only as a script argument ($2): not a well-known one, so its size is asked for.
ASKS_VOCAB = {"mamba__train.sh"}
FRAGMENTS = sorted(p.name for p in DATA.glob("*.sh") if p.name.startswith(("post_training__modelopt__conf__",
                                                                          "rl__model_configs__")))


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.sh")))
def test_every_example_is_read_with_the_job_or_refused_by_name(name):
    if name in NO_MODEL or name in NOT_GPT or name in ASKS_VOCAB:
        with pytest.raises(InputError) as e:
            from_megatron_args(DATA / name, seq_len=None, global_batch_size=256)
        want = NO_MODEL.get(name) or NOT_GPT.get(name) or "cannot tell the vocabulary size"
        assert want in str(e.value)
        assert "\n" not in str(e.value)
        return
    imp = from_megatron_args(DATA / name, global_batch_size=256)
    assert imp.workload.global_batch_size == 256
    assert imp.model.num_layers > 0 and imp.model.vocab_size > 0


def test_fragments_are_read_and_leave_the_unwritten_layout_to_the_search():
    assert len(FRAGMENTS) == 41  # 28 modelopt confs less one symbolic link, 14 RL configs
    imp = from_megatron_args(DATA / "post_training__modelopt__conf__Qwen__Qwen3-30B-A3B.sh", global_batch_size=512)
    m = imp.model
    assert (m.num_layers, m.hidden_size, m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size) == \
        (48, 2048, 128, 8, 768)
    # Qwen/Qwen3-30B-A3B (TOKENIZER_MODEL, which modelopt's scripts pass): 151936 rows, padded to 1187 x 128.
    assert m.vocab_size == 151936
    assert (imp.workload.seq_len, imp.workload.global_batch_size) == (4096, 512)
    assert imp.strategy["mbs"] == 1 and "tp" not in imp.strategy and "pp" not in imp.strategy
    assert any("chosen by the search" in n for n in imp.notes)


def test_the_command_line_job_fills_and_replaces_with_a_note():
    path = DATA / "rl__model_configs__nemotron5_56b.sh"
    with pytest.raises(InputError, match="global-batch-size"):
        from_megatron_args(DATA / "post_training__modelopt__conf__Qwen__Qwen3-8B.sh")
    imp = from_megatron_args(path, seq_len=8192)
    assert imp.workload.seq_len == 8192
    assert "--seq 8192 replaces the script's --seq-length 8191" in imp.notes
    assert imp.strategy["tp"] == 8  # TP=${TP:-8}


@pytest.mark.parametrize("name, pattern_layers, mamba_heads, experts, latent", [
    ("post_training__modelopt__conf__nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.sh", 52, 64, 128, 0),
    ("post_training__modelopt__conf__nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh", 88, 128, 512, 1024),
    ("post_training__modelopt__conf__nvidia__Nemotron-H-8B-Base-8K.sh", 52, 128, 0, 0),
    # --hybrid-override-pattern (deprecated) with --num-layers 108: the pattern's length wins, as in Megatron.
    ("post_training__modelopt__conf__nvidia__NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.sh", 108, 256, 512, 2048),
    # no --mamba-num-heads: 2 x hidden / head dim (8192 x 2 / 64)
    ("post_training__modelopt__conf__nvidia__Nemotron-H-56B-Base-8K.sh", 118, 256, 0, 0),
])
def test_hybrid_layer_patterns_build_hybrid_models(name, pattern_layers, mamba_heads, experts, latent):
    m = from_megatron_args(DATA / name, global_batch_size=256).model
    assert m.is_hybrid and m.num_layers == pattern_layers == len(m.hybrid_layer_pattern)
    assert (m.mamba_num_heads, m.num_experts, m.moe_latent_size) == (mamba_heads, experts, latent)
    assert m.activation == "gelu" and m.position_embedding == "rope"  # squared ReLU and "none": no extra weights


def test_hybrid_pattern_names_what_is_not_priced():
    base = "--hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --global-batch-size 8 --vocab-size 1000 "
    with pytest.raises(InputError, match="Gated DeltaNet"):
        from_megatron_args(base + "--hybrid-layer-pattern MG*-")
    with pytest.raises(InputError, match="cannot both be given"):
        from_megatron_args(base + "--hybrid-layer-pattern M*- --hybrid-override-pattern M*-")
    m = from_megatron_args(base + "--hybrid-layer-pattern M*-M/*-/*-").model
    assert (m.num_layers, m.mtp_num_layers, m.mtp_layer_pattern) == (4, 2, "*-")


@pytest.mark.parametrize("fixture, model_id", [
    ("llama3_8b.json", "meta-llama/Meta-Llama-3-8B"), ("qwen2.5_7b.json", "Qwen/Qwen2.5-7B"),
    ("qwen3_8b.json", "Qwen/Qwen3-8B"), ("qwen3_30b_a3b.json", "Qwen/Qwen3-30B-A3B"),
    ("deepseek_v3.json", "deepseek-ai/DeepSeek-V3"), ("deepseek_v2_lite.json", "deepseek-ai/DeepSeek-V2-Lite"),
    ("kimi_k2.json", "moonshotai/Kimi-K2-Instruct"), ("mistral_7b_v0.1.json", "mistralai/Mistral-7B-v0.1"),
    ("mixtral_8x7b.json", "mistralai/Mixtral-8x7B-v0.1"), ("gpt_oss_120b.json", "openai/gpt-oss-120b"),
])
def test_known_tokenizer_sizes_equal_the_models_config(fixture, model_id):
    assert hf_tokenizer_vocab(model_id) == json.loads((HF / fixture).read_text())["vocab_size"]
    assert hf_tokenizer_vocab("/checkpoints/" + model_id.split("/")[1]) == hf_tokenizer_vocab(model_id)


@pytest.mark.parametrize("tokenizer, tp, rows", [
    ("--vocab-file /data/gpt2-vocab.json --merge-file /data/gpt2-merges.txt", 1, 50304),
    ("--tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt", 8, 51200),
    ("--tokenizer-type Llama2Tokenizer --tokenizer-model /t/tokenizer.model", 1, 32000),
    ("--tokenizer-type Llama3Tokenizer --tokenizer-model /t/tokenizer.model", 2, 128256),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model NousResearch/Llama-2-7b-hf", 1, 32000),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model unsloth/Qwen2.5-32B", 4, 152064),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 1, 128256),
    ("--tokenizer-type TikTokenizer --tokenizer-model /t/multiMixV8.gpt4o_nc_sd.500000.128k.vocab.json", 8, 131072),
])
def test_well_known_tokenizers_are_padded_as_megatron_pads(tokenizer, tp, rows):
    args = (f"--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 512 --global-batch-size 8 "
            f"--tensor-model-parallel-size {tp} {tokenizer}")
    assert from_megatron_args(args).model.vocab_size == rows


def test_unknown_tokenizers_are_asked_for():
    args = "--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 512 --global-batch-size 8 "
    with pytest.raises(InputError, match="--set vocab_size=N"):
        from_megatron_args(args + "--tokenizer-type HuggingFaceTokenizer --tokenizer-model my-org/my-model")
    assert "vocab_size" not in HF_TOKENIZER_VOCAB  # the table is keyed by model names only


def test_quotes_inside_an_evald_command_are_read_as_bash_reads_them():
    # examples/deepseek_v3/train_deepseekv3.sh: --moe-layer-freq '${MOE_LAYER_FREQ}' inside run_cmd="...", then
    # `eval ${run_cmd}`; bash's second read removes the quotes.
    imp = from_megatron_args(DATA / "deepseek_v3__train_deepseekv3.sh", global_batch_size=256)
    assert (imp.model.num_layers, imp.model.num_experts, imp.model.vocab_size) == (27, 64, 129280)
    script = """NUM_LAYERS=61
MOE_LAYER_FREQ='([0]*3+[1]*58)'
opts=" --num-layers ${NUM_LAYERS} --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 \\
  --global-batch-size 8 --vocab-size 1000 --num-experts 8 --moe-router-topk 2 --moe-layer-freq '${MOE_LAYER_FREQ}'"
run_cmd="torchrun --nproc_per_node 8 pretrain_gpt.py ${opts}"
run_cmd="$run_cmd | tee log.txt"
eval ${run_cmd}
"""
    m = from_megatron_args(script).model
    assert (m.first_k_dense_layers, m.moe_layer_freq) == (3, 1)
    # Without eval the quotes reach Megatron, whose _eval_pattern refuses them: so is the value here.
    with pytest.raises(InputError, match="not a list pattern"):
        from_megatron_args(script.replace("eval ${run_cmd}", "${run_cmd}"))


def test_angle_bracket_placeholders_keep_their_argument():
    # examples/pretrain_gpt3_175B.sh (older Megatron-LM): `--vocab-file <PATH TO gpt-vocab.json>`, a placeholder the
    # user fills in, not two redirections; the GPT-2 BPE files it names give the vocabulary.
    imp = from_megatron_args(DATA / "pretrain_gpt3_175B.sh")
    assert (imp.model.num_layers, imp.model.vocab_size) == (96, 51200)  # 50257 padded to 128 x tp 8
    assert (imp.workload.seq_len, imp.workload.global_batch_size) == (2048, 1536)


def test_plan_baseline_from_a_fragment_takes_the_plans_job(capsys):
    from conftest import run_cli

    code, out, err = run_cli(["plan", "--model", "llama3.1-8b", "--gpus", "16", "--seq", "4096", "--gbs", "64",
                              "--baseline-from-megatron",
                              str(DATA / "post_training__modelopt__conf__meta-llama__Llama-3.1-8B-Instruct.sh"),
                              "--top", "1", "--json"], capsys)
    assert code == 0, err
    baseline = json.loads(out)["baseline"]
    assert baseline["strategy"]["mbs"] == 1  # the fragment's --micro-batch-size; the rest completed for the job
