"""Search policy lives in solvers/policy.py, apart from the command line that prints it: why a search returned no
plan, and the fixed FP8 labels' check on the winner."""
import pytest

from autoplan.errors import InputError
from autoplan.solvers.api import SolveResult
from autoplan.solvers.policy import no_plan_reason
from autoplan.solvers.space import Problem
from conftest import cluster, make_dense, workload


def _result(space_size, smallest):
    return SolveResult(plans=[], solver="enumerate", space_size=space_size, evaluated=space_size, feasible=0,
                       wall_s=0.0, infeasible={}, smallest_peak_gib=smallest)


def test_no_plan_reason_scales_the_gpu_count_to_the_memory_the_smallest_candidate_needs():
    problem = Problem(make_dense(), cluster(8), workload())
    # 8 GPUs of 79.1 GiB and a candidate needing 300 GiB: 8 * 300 / 79.1 = 30.3 GPUs, the next power-of-two step 32.
    msg = no_plan_reason(_result(10, 300.0), problem)
    assert msg.startswith("no strategy fits: the smallest needs 300.0 GiB per GPU on 8 GPUs") and ">= 32 GPUs" in msg


def test_no_plan_reason_names_the_rule_a_fixed_key_breaks():
    problem = Problem(make_dense(), cluster(8), workload(), fixed={"moe_a2a_overlap": [True]})
    with pytest.raises(InputError, match="moe_a2a_overlap=true needs an MoE model"):
        no_plan_reason(_result(0, None), problem)
