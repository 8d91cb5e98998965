"""Multi-token prediction on a GPT (non-hybrid) model: one decoder layer of the model's kind per depth
(megatron/core/transformer/multi_token_prediction.py), priced on the last pipeline stage, read from HF
num_nextn_predict_layers and Megatron --mtp-num-layers, written back by the emitter, refused by DeepSpeed."""
from __future__ import annotations

import pytest

from autoplan.cluster import ClusterSpec
from autoplan.clusterio import load_gpu
from autoplan.complete import complete_strategy
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.flops import model_flops_per_token
from autoplan.costmodel.params import count_parameters, mtp_params
from autoplan.integrations.engines import deepspeed_unsupported
from autoplan.integrations.importers import from_megatron_args
from autoplan.integrations.megatron import emit_megatron
from autoplan.modelio import load_model
from autoplan.strategy import Strategy
from autoplan.workload import Workload
from engine_checks.plans import DEEPSEEK_V2_LITE, make_plan

GIB = 2**30


def test_deepseek_v3_total_is_the_model_cards_685b():
    # HF deepseek-ai/DeepSeek-V3 model card: 685B = 671B main model + 14B MTP module; the module stores its own
    # embedding and head (2 x 129280 x 7168 = 1.85B), which Megatron's MTP depth shares with the main model.
    m = load_model("deepseek-v3")
    assert m.mtp_num_layers == 1
    total, _ = count_parameters(m)
    shared_copies = 2 * m.vocab_size * m.hidden_size
    assert abs(total + shared_copies - 685e9) / 685e9 < 0.005, total
    main, active = count_parameters(m.model_copy(update={"mtp_num_layers": 0}))
    assert abs(main - 671e9) / 671e9 < 0.005 and abs(active - 37e9) / 37e9 < 0.02  # model card: 37B activated
    assert abs(sum(mtp_params(m)) + shared_copies - 14e9) / 14e9 < 0.05  # "14B of the MTP module"


def test_flops_add_one_layer_eh_proj_and_head_per_depth():
    # Megatron-LM training.py transformer_flops: mtp layers of the last layer's kind, 3*2*mtp*(3h + 2h^2) and
    # the logits term x (mtp_num_layers + 1).
    m = load_model("deepseek-v3")
    base = model_flops_per_token(m.model_copy(update={"mtp_num_layers": 0}), 4096)
    two = model_flops_per_token(m.model_copy(update={"mtp_num_layers": 2}), 4096)
    one = model_flops_per_token(m, 4096)
    h, v = m.hidden_size, m.vocab_size
    assert two - one == pytest.approx(one - base)
    assert one - base > 3 * 2 * (3 * h + 2 * h * h + h * v)


def _estimate(mtp: int):
    m = DEEPSEEK_V2_LITE.model_copy(update={"mtp_num_layers": mtp})
    c, wl = ClusterSpec(gpu=load_gpu("h100"), num_gpus=48), Workload(seq_len=4096, global_batch_size=256)
    s, _ = complete_strategy(m, c, wl, Strategy(tp=1, pp=3, ep=8))
    return m, s, estimate(m, c, s, wl)


def test_last_stage_holds_the_mtp_weights_states_and_activations():
    _, _, base = _estimate(0)
    m, s, with_mtp = _estimate(1)
    sharded, replicated, expert = mtp_params(m)
    held = (sharded + replicated) / s.tp + expert / (s.ep * s.etp)
    first0, last0 = base.stage_memory[0], base.stage_memory[-1]
    first1, last1 = with_mtp.stage_memory[0], with_mtp.stage_memory[-1]
    assert first1.total_gib == pytest.approx(first0.total_gib)  # the depth sits on the last stage only
    rise = {k: last1.breakdown_gib[k] - last0.breakdown_gib[k] for k in last0.breakdown_gib}
    assert rise["weights"] == pytest.approx(2 * held / GIB, rel=1e-3)  # bf16 weights
    assert rise["grads"] > 0 and rise["optimizer"] > 0
    assert rise["logits"] > last0.breakdown_gib["logits"]  # one more logits set plus the depth's layer
    assert last1.total_gib > last0.total_gib + sum(rise[k] for k in ("weights", "grads", "optimizer")) - 1e-9
    assert with_mtp.step_time_s > base.step_time_s


def test_megatron_round_trip(tmp_path):
    m = DEEPSEEK_V2_LITE.model_copy(update={"mtp_num_layers": 2})
    args = emit_megatron(make_plan(m, 32, 4096, 256, tp=2, ep=8, sp=True))["megatron_args.txt"]
    assert "--mtp-num-layers 2" in " ".join(args.split())
    (tmp_path / "args.txt").write_text(args)
    assert from_megatron_args(str(tmp_path / "args.txt")).model.mtp_num_layers == 2
    plain = emit_megatron(make_plan(DEEPSEEK_V2_LITE, 32, 4096, 256, tp=2, ep=8, sp=True))["megatron_args.txt"]
    assert "--mtp-num-layers" not in plain


def test_deepspeed_refuses_mtp():
    m = DEEPSEEK_V2_LITE.model_copy(update={"mtp_num_layers": 1})
    msg = deepspeed_unsupported(Strategy(tp=1, pp=1, dp=8), m)
    assert msg and "mtp_num_layers=1" in msg and "\n" not in msg
