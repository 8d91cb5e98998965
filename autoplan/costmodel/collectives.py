"""One alpha-beta collective cost function (Hockney model; Thakur, Rabenseifner & Gropp 2005, "Optimization of
collective communication operations in MPICH", ring algorithms), vectorised over candidates.

Bus-bandwidth factors follow nccl-tests' PERFORMANCE.md: all-reduce moves 2(n-1)/n of the buffer over the
slowest link, all-gather / reduce-scatter / all-to-all (n-1)/n, send/recv 1."""
from __future__ import annotations

import numpy as np

from autoplan.costmodel.hardware import Hardware

# All-to-all runs at the ring-collective bus rate (`*_bus_efficiency`): DeepEP V1 on H800 reaches 153-158 of
# 200 GB/s over NVLink (0.78 of the link; ring collectives 0.76-0.82) and 43-58 of 50 GB/s over RDMA (0.86-1.16
# of the link; ring ~0.80) (../reference gpus.md S3).

_BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: np.ones_like(n, dtype=float),
}
# Latency steps: ring all-reduce 2(n-1), ring all-gather / reduce-scatter (n-1), pairwise all-to-all (n-1).
_STEPS = {
    "all_reduce": lambda n: 2.0 * (n - 1),
    "all_gather": lambda n: (n - 1.0),
    "reduce_scatter": lambda n: (n - 1.0),
    "all_to_all": lambda n: (n - 1.0),
    "send_recv": lambda n: np.ones_like(n, dtype=float),
}


def collective_time(kind: str, size_bytes, group_size, spans_network, hw: Hardware, *, inter_fraction=None,
                    ranks_per_domain=None):
    """Seconds for one collective of `size_bytes` (the full buffer, per rank) over `group_size` ranks.

    `spans_network`: the group crosses NVLink domains, so the slowest link is the NIC (rail-optimised: one NIC per
    GPU). `inter_fraction` (all-to-all only): share of the traffic that leaves the domain; the two kinds of link
    work in parallel and the slower one decides.

    `ranks_per_domain` (ring collectives): members of the group inside each NVLink domain, g. NCCL's rings cross
    each domain boundary once per channel and run g channels over the domain's g NICs, so each NIC carries 1/g of
    the bus bytes while NVLink carries all of them. Check: 4 nodes x 8 B200 with 8x 400G NICs reach an all-reduce
    busbw of 381.8 GB/s, i.e. 381.8 / 8 = 47.7 GB/s per 50 GB/s NIC (../reference gpus.md S3, S1). None = 1.
    """
    n = np.asarray(group_size, dtype=float)
    size = np.asarray(size_bytes, dtype=float)
    single = n <= 1
    n_safe = np.where(single, 2.0, n)
    bus = _BUS_FACTOR[kind](n_safe) * size
    nv_bw = hw.nvlink_bytes_per_s * hw.nvlink_bus_eff
    net_bw = hw.network_bytes_per_s * hw.network_bus_eff
    spans = np.asarray(spans_network, dtype=bool)
    latency = np.where(spans, hw.network_latency_s, hw.nvlink_latency_s) * _STEPS[kind](n_safe)
    if kind == "all_to_all":
        frac = np.where(spans, 1.0 if inter_fraction is None else inter_fraction, 0.0)
        beta = np.maximum(bus * (1 - frac) / nv_bw, bus * frac / net_bw)
    else:
        g = np.ones_like(n) if ranks_per_domain is None else np.maximum(np.asarray(ranks_per_domain, float), 1.0)
        beta = np.where(spans, np.maximum(bus / (g * net_bw), bus / nv_bw), bus / nv_bw)
        # A ring with g members per domain crosses the network on one hop in g; the other hops are NVLink hops.
        hop = np.where(spans, hw.network_latency_s / g + hw.nvlink_latency_s * (1.0 - 1.0 / g), hw.nvlink_latency_s)
        latency = hop * _STEPS[kind](n_safe)
    return np.where(single, 0.0, latency + beta)


def expected_remote_nodes(n_nodes, topk):
    """Expected number of other nodes among those hosting a token's `topk` experts, the experts drawn uniformly
    (balanced routing) from ranks spread evenly over `n_nodes` nodes. A node hosts none of them with probability
    (1 - 1/N)^k, so by linearity of expectation over the N node indicators the token reaches N (1 - (1 - 1/N)^k)
    distinct nodes (the occupancy / coupon-collector expectation), its own node among them with the same
    probability: (N - 1) (1 - (1 - 1/N)^k) others. Drawing with replacement slightly overcounts repeats."""
    nodes = np.maximum(np.asarray(n_nodes, dtype=float), 1.0)
    return (nodes - 1.0) * (1.0 - (1.0 - 1.0 / nodes) ** topk)


def distinct_destinations(members, topk):
    """Expected number of distinct members (nodes, or GPUs) among those hosting a token's `topk` experts, its own
    included, the experts drawn uniformly from `members` equal members: members (1 - (1 - 1/members)^k)
    (`expected_remote_nodes` plus the own member's share)."""
    m = np.maximum(np.asarray(members, dtype=float), 1.0)
    return m * (1.0 - (1.0 - 1.0 / m) ** topk)


def flex_all_to_all_time(token_bytes, topk, group_size, ranks_per_domain, hw: Hardware, nvlink_eff, network_eff):
    """Seconds for one dispatch (or combine) of the flex token dispatcher (DeepEP / HybridEP) over `group_size`
    expert-parallel ranks, `ranks_per_domain` of them per NVLink domain; `token_bytes` = bytes of the rank's
    routed tokens (one copy each), `topk` experts per token.

    DeepEP's normal kernels send a token once per destination node over RDMA and forward it to that node's experts
    over NVLink (deepseek-ai/DeepEP README, "asymmetric-domain bandwidth forwarding"; DeepSeek-V3 report
    arXiv:2412.19437 sec. 3.2.2: each token reaches at most M nodes over IB, then NVLink), once per destination GPU
    however many of its experts sit there; HybridEP does the same across an NVLink domain (Megatron
    megatron/core/transformer/moe/token_dispatcher.py `_HybridEPManager`).

    Bytes and rates are counted the way DeepEP's published figures count them (profiles/gpu_reference.md S3,
    deepseek-ai/DeepEP docs/legacy.md; its tests divide `num_rdma_token_sent` = tokens x distinct destination
    nodes, its own node included, and `recv_x` = tokens x distinct destination GPUs, by the kernel time): the
    network carries token_bytes x `distinct_destinations(nodes, k)` at `network_eff` of the NIC rate, NVLink
    token_bytes x `distinct_destinations(group_size, k)` at `nvlink_eff` of the NVLink rate (per direction);
    the two links work in parallel and the slower decides. With those counts the efficiencies are DeepEP's
    measured bottleneck bandwidths over the link rates (Calibration.flex_*_eff).

    Latency: one per-step latency per peer, as for the pairwise all-to-all (`_STEPS`); DeepEP publishes no
    fixed cost of its normal kernels (its low-latency table, 77 us at EP8 to 194 us at EP256, is bandwidth-bound:
    docs/legacy.md gives 39-98 GB/s beside it), so none other is assumed."""
    n = np.asarray(group_size, dtype=float)
    g = np.maximum(np.minimum(np.asarray(ranks_per_domain, dtype=float), n), 1.0)
    nodes = np.ceil(n / g)
    size = np.asarray(token_bytes, dtype=float)
    net = size * distinct_destinations(nodes, topk)
    nv = size * distinct_destinations(n, topk)
    nv_bw = hw.nvlink_bytes_per_s * nvlink_eff
    net_bw = hw.network_bytes_per_s * network_eff
    spans = nodes > 1
    latency = np.where(spans, hw.network_latency_s, hw.nvlink_latency_s) * _STEPS["all_to_all"](np.maximum(n, 2.0))
    return np.where(n <= 1, 0.0, latency + np.maximum(nv / nv_bw, np.where(spans, net / net_bw, 0.0)))
