"""GPU counts that do not fill whole nodes (a 252-GPU A100 run: 31 full nodes and one with 4): accepted, priced, and
searched with every tensor-parallel group inside one node."""
from __future__ import annotations

from autoplan.clusterio import load_cluster
from autoplan.complete import complete_strategy
from autoplan.costmodel.estimate import estimate
from autoplan.model import ModelSpec
from autoplan.modelio import load_model
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem, tp_choices
from autoplan.validate import first_broken_rule
from autoplan.workload import Workload


def test_252_a100_is_estimated_and_planned():
    m, c = load_model("llama2-7b"), load_cluster("a100-80g", 252)
    wl = Workload(seq_len=4096, global_batch_size=1008)
    s, notes = complete_strategy(m, c, wl, {"tp": 4, "pp": 1})
    assert s.dp == 63 and first_broken_rule(m, c, wl, s) is None
    assert any("31 full nodes and one with 4 of its 8 GPUs" in n and "inside one node" in n for n in notes)
    assert estimate(m, c, s, wl).step_time_s > 0
    plans = solve(Problem(m, c, wl), "enumerate", top_k=10).plans
    assert plans
    for p in plans:
        assert 8 % p.strategy.tp == 0 and first_broken_rule(m, c, wl, p.strategy) is None


def test_tensor_parallel_groups_stay_inside_a_node():
    """48 heads on 24 GPUs: tp=3 and tp=6 would put groups across two nodes; they are searched only when asked."""
    m = ModelSpec(name="h48", num_layers=8, hidden_size=6144, ffn_hidden_size=16384, num_attention_heads=48,
                  num_query_groups=48, kv_channels=128, vocab_size=32000, max_position_embeddings=4096)
    problem = Problem(m, load_cluster("h100", 24), Workload(seq_len=4096, global_batch_size=48))
    assert tp_choices(problem) == [1, 2, 4, 8]
    wide = Problem(m, problem.cluster, problem.workload, allow=frozenset({"tp-outside-domain"}))
    assert {3, 6} <= set(tp_choices(wide))
