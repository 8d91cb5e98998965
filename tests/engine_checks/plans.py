"""Plans for the emitter tests, built directly from the specs. The estimate is a minimal valid one: the emitted
files do not depend on it beyond the header comment."""
from __future__ import annotations

from autoplan.cluster import ClusterSpec, GpuSpec
from autoplan.model import ModelSpec
from autoplan.results import Estimate, Plan
from autoplan.strategy import Strategy
from autoplan.workload import Workload

H100 = GpuSpec(id="h100", name="H100 SXM", peak_tflops={"bf16": 989.0, "fp8": 1979.0},
               gemm_efficiency={"bf16": 0.8, "fp8": 0.71}, hbm_gib=79.6, hbm_bandwidth_tbps=3.35,
               nvlink_bandwidth_gbytes_per_s=450.0, nvlink_domain_size=8, gpus_per_node=8, nics_per_node=8,
               nic_gbit_per_s=400.0, source="datasheet")
B200 = H100.model_copy(update={"id": "b200", "name": "B200", "hbm_gib": 178.4})

LLAMA_70B = ModelSpec(name="llama3-70b", num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
                      num_attention_heads=64, num_query_groups=8, kv_channels=128, vocab_size=128256,
                      max_position_embeddings=8192, rotary_base=500000.0)
LLAMA_8B = ModelSpec(name="llama3-8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
                     num_attention_heads=32, num_query_groups=8, kv_channels=128, vocab_size=128256,
                     max_position_embeddings=131072, rotary_base=500000.0)
DEEPSEEK_V2_LITE = ModelSpec(name="deepseek-v2-lite", num_layers=27, hidden_size=2048, ffn_hidden_size=10944,
                             num_attention_heads=16, num_query_groups=16, kv_channels=128, vocab_size=102400,
                             max_position_embeddings=163840, multi_latent_attention=True, kv_lora_rank=512,
                             qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, num_experts=64,
                             moe_router_topk=6, moe_ffn_hidden_size=1408, shared_expert_ffn_hidden_size=2816,
                             first_k_dense_layers=1)
MIXTRAL = ModelSpec(name="mixtral-8x7b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
                    num_attention_heads=32, num_query_groups=8, kv_channels=128, vocab_size=32000,
                    max_position_embeddings=32768, rotary_base=1000000.0, num_experts=8, moe_router_topk=2,
                    moe_ffn_hidden_size=14336)
GPT2_SMALL = ModelSpec(name="gpt2-small", num_layers=12, hidden_size=768, ffn_hidden_size=3072,
                       num_attention_heads=12, num_query_groups=12, kv_channels=64, vocab_size=50257,
                       max_position_embeddings=1024, activation="gelu", normalization="layernorm",
                       position_embedding="learned", tie_embeddings=True, add_bias_linear=True)
TINY = ModelSpec(name="tiny", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                 num_query_groups=2, kv_channels=16, vocab_size=512, max_position_embeddings=256)
TINY_MOE = TINY.model_copy(update={"name": "tiny-moe", "num_experts": 4, "moe_router_topk": 2,
                                   "moe_ffn_hidden_size": 64, "shared_expert_ffn_hidden_size": 64,
                                   "first_k_dense_layers": 1})


def estimate() -> Estimate:
    return Estimate(step_time_s=1.0, tokens_per_s=1000.0, tokens_per_s_per_gpu=125.0, model_tflops_per_gpu=100.0,
                    mfu=0.1, peak_mem_gib=10.0, fits=True, time_breakdown={"compute": 1.0},
                    memory_breakdown={"weights": 10.0})


def make_plan(model: ModelSpec, num_gpus: int, seq_len: int, global_batch: int, gpu: GpuSpec = H100,
              **strategy) -> Plan:
    return Plan(model=model, cluster=ClusterSpec(gpu=gpu, num_gpus=num_gpus),
                workload=Workload(seq_len=seq_len, global_batch_size=global_batch),
                strategy=Strategy(**strategy), estimate=estimate())


# The golden plans: name -> (plan, engine).
def golden_plans():
    return {
        "megatron_dense_tp_pp_vpp_sp": (make_plan(LLAMA_70B, 64, 8192, 128, tp=8, pp=4, vpp=5, sp=True, mbs=1,
                                                  recompute="selective"), "megatron"),
        "megatron_moe_ep_etp": (make_plan(DEEPSEEK_V2_LITE, 32, 4096, 256, tp=2, pp=1, ep=8, etp=1, sp=True,
                                          mbs=1, recompute="full", recompute_method="uniform",
                                          recompute_layers=1), "megatron"),
        "megatron_long_context_cp": (make_plan(LLAMA_8B, 32, 131072, 16, tp=4, cp=8, sp=True, mbs=1,
                                               fp8="hybrid", fp8_recipe="tensorwise"), "megatron"),
        "deepspeed_zero3": (make_plan(LLAMA_8B, 16, 4096, 64, zero=3, mbs=2, recompute="full"), "deepspeed"),
        "deepspeed_pipeline": (make_plan(GPT2_SMALL, 8, 1024, 32, pp=2, zero=1, mbs=4), "deepspeed"),
    }


def mixer_plans():
    """Plans of the recent families whose attention variants the Megatron-LM files carry (integrations/megatron.py
    _mixer_args): Qwen3-Next (Gated DeltaNet every layer but each 4th, gated attention, gated shared expert,
    zero-centred norms) and DeepSeek-V3.2 (DSA), both read from their released config.json (tests/data/hf_configs)."""
    from pathlib import Path

    from autoplan.modelio import load_model

    hf = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
    qwen = load_model(str(hf / "qwen3_next_80b_a3b.json"))
    v32 = load_model(str(hf / "deepseek_v3_2.json"), ["dsa_indexer_loss_coeff=0.01"])
    return {
        "megatron_qwen3_next_gdn": make_plan(qwen, 64, 4096, 256, tp=2, pp=4, ep=8, etp=1, sp=True, zero=1),
        "megatron_deepseek_v32_dsa": make_plan(v32, 64, 4096, 256, tp=2, ep=32, etp=1, sp=True, zero=1),
    }
