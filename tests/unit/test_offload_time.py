"""CPU activation offload costs time where the host link is slower than a layer's compute (evaluate._offload_exposed)."""
import numpy as np

from autoplan.costmodel import compute as C
from autoplan.costmodel import memory as M
from autoplan.costmodel.calibration import DEFAULT
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.hardware import hardware_of
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.strategy import Strategy

from conftest import cluster, workload


def test_offload_is_exposed_beyond_one_layers_compute_at_the_host_link_rate(dense):
    seq, wl = 4096, workload(4096, 8)
    slow_link = cluster(8, host_bandwidth_gbytes_per_s=1.0)
    strategy = Strategy(cpu_offload_layers=4)
    base = estimate(dense, cluster(8), Strategy(), wl)
    slow = estimate(dense, slow_link, strategy, wl)
    fast = estimate(dense, cluster(8, host_bandwidth_gbytes_per_s=1e5), strategy, wl)
    assert base.time_breakdown["offload"] == 0.0
    assert fast.time_breakdown["offload"] == 0.0  # a fast link hides under the next layer's compute
    # Each offloaded layer's saved tensors go out during the next layer's forward and come back during the
    # previous layer's backward; only the excess is exposed.
    lay = layouts_from_strategies([strategy], 8)
    sh = C.shard_of(dense, lay, seq)
    saved = float(M.layer_activation_bytes(dense, sh, lay, moe=False)[0][0])
    layer = C.layer_time(dense, sh, lay, seq, hardware_of(slow_link), DEFAULT, moe=False)
    copy = saved / 1e9
    expected = 4 * ((copy - float(layer.fwd[0])) + (copy - float(layer.bwd(DEFAULT)[0])))
    assert np.isclose(slow.time_breakdown["offload"], expected, rtol=1e-6)
    assert np.isclose(slow.step_time_s - fast.step_time_s, expected, rtol=1e-6)
