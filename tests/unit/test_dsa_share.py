"""DSA top-k shared between layers (GLM-5.2): which layers hold an indexer, the pipeline rule Megatron imposes on
such a model, the search's splits, and the per-rank indexer counts the memory is priced from."""
from pathlib import Path

import numpy as np
import pytest

from autoplan import pipeline_split as PS
from autoplan.clusterio import load_cluster
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.costmodel.params import count_parameters, dsa_indexer_params
from autoplan.costmodel.stages import stage_layers
from autoplan.modelio import load_model
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem
from autoplan.strategy import Strategy
from autoplan.validate import first_broken_rule
from autoplan.workload import Workload
from tests.conftest import run_cli

HF = Path(__file__).parents[1] / "data" / "hf_configs"
GLM52 = load_model(str(HF / "glm5_2.json"))
WL = Workload(seq_len=4096, global_batch_size=2048)


def _megatron_is_skip(layer_number: int, offset: int, freq: int) -> bool:
    """megatron/core/transformer/experimental_attention_variant/dsa.py is_dsa_skip_topk_layer (core_v0.19.0), as
    written there (1-indexed layer numbers)."""
    offset = max(offset, 1)
    return (max(layer_number - offset, 0) % freq) != 0


def test_indexer_layers_follow_megatrons_rule():
    m = GLM52
    assert [m.dsa_computes_topk(i) for i in range(m.num_layers)] == \
        [not _megatron_is_skip(i + 1, m.dsa_indexer_skip_topk_offset, m.dsa_indexer_topk_freq)
         for i in range(m.num_layers)]
    # the shared layers hold no indexer: 57 fewer than GLM-5's layout at the same sizes
    every = GLM52.model_copy(update={"dsa_indexer_topk_freq": 1, "dsa_indexer_skip_topk_offset": 0})
    assert count_parameters(every)[0] - count_parameters(m)[0] == 57 * dsa_indexer_params(m)


@pytest.mark.parametrize("pp, vpp, first, last", [(4, 1, 18, 20), (4, 2, 18, 20), (6, 1, 14, 16), (3, 1, None, None)])
def test_chunks_follow_megatrons_layer_offsets(pp, vpp, first, last):
    """Virtual stage k = chunk k // pp of rank k % pp; with end-rank counts each rank's layers split over its vpp
    chunks (transformer_layer.py get_transformer_layer_offset)."""
    counts = PS.chunk_layer_counts(78, pp, vpp, first, last)
    assert sum(counts) == 78 and len(counts) == pp * vpp
    ranks = [sum(counts[r::pp]) for r in range(pp)]
    assert ranks == PS.rank_layer_counts(Strategy(pp=pp, vpp=vpp, first_stage_layers=first,
                                                  last_stage_layers=last), 78)


def _check(**keys):
    s = Strategy(tp=2, ep=32, etp=1, sp=True, zero=1, recompute="full", **keys)
    return first_broken_rule(GLM52, load_cluster("h100", 1024), WL, s)


def test_a_stage_that_starts_on_a_reusing_layer_is_refused_with_a_split_that_works():
    msg = _check(pp=2)
    assert "starts on layer 39 (from 0), which reuses an earlier layer's DSA top-k" in msg
    assert "first_stage_layers=38, last_stage_layers=40" in msg and "\n" not in msg
    assert _check(pp=2, first_stage_layers=38, last_stage_layers=40) is None
    assert _check(pp=4, first_stage_layers=18, last_stage_layers=20) is None
    assert "chunk 0" in _check(pp=4, vpp=2, first_stage_layers=18, last_stage_layers=20)
    # the model without sharing takes the even split
    every = GLM52.model_copy(update={"dsa_indexer_topk_freq": 1, "dsa_indexer_skip_topk_offset": 0})
    assert first_broken_rule(every, load_cluster("h100", 1024), WL,
                             Strategy(tp=2, pp=2, ep=32, etp=1, sp=True, zero=1, recompute="full")) is None


def test_estimate_refuses_it_in_one_line(capsys):
    code, out, err = run_cli(["estimate", "--model", str(HF / "glm5_2.json"), "--cluster", "h100", "--gpus", "1024",
                              "--seq", "4096", "--gbs", "2048", "--strategy",
                              "tp=2,pp=2,vpp=1,cp=1,ep=32,etp=1,mbs=1,sp=true,zero=1,recompute=full,fp8=none"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "DSA top-k" in err


@pytest.mark.parametrize("pp", [4, 8])
def test_the_search_places_every_stage_on_an_indexer_layer(pp):
    problem = Problem(GLM52, load_cluster("h100", 1024), WL, fixed={"pp": pp})
    result = solve(problem, "enumerate", top_k=5)
    assert result.plans
    for plan in result.plans:
        s = plan.strategy
        assert PS.dsa_share_problem(GLM52, s.pp, s.vpp, s.first_stage_layers, s.last_stage_layers,
                                    *PS.account_units(s), s.pipeline_layout) is None


@pytest.mark.parametrize("pp, vpp, first, last", [(4, 1, 18, 20), (6, 1, 14, 16), (4, 2, 22, 16), (2, 3, 36, 42),
                                                  (3, 2, 26, 28)])
def test_rank_indexer_counts_bound_the_layers_megatron_builds(pp, vpp, first, last):
    """Exact without interleaving; never below the rank's real count with it (memory is never under-counted)."""
    s = Strategy(pp=pp, vpp=vpp, first_stage_layers=first, last_stage_layers=last)
    counts = PS.chunk_layer_counts(78, pp, vpp, first, last)
    starts = np.concatenate([[0], np.cumsum(counts)])
    real = [0] * pp
    for k, n in enumerate(counts):
        real[k % pp] += sum(GLM52.dsa_computes_topk(i) for i in range(starts[k], starts[k] + n))
    lay = layouts_from_strategies([s], pp)
    priced = [float(stage_layers(GLM52, lay, np.array([r])).dsa[0]) for r in range(pp)]
    if vpp == 1:
        assert priced == real
    else:
        assert all(p >= r for p, r in zip(priced, real))
    assert sum(real) == 21


def test_a_copy_with_other_sharing_counts_its_own_indexers():
    assert GLM52.num_dsa_indexer_layers == 21
    assert GLM52.model_copy(update={"dsa_indexer_topk_freq": 1, "dsa_indexer_skip_topk_offset": 0}
                            ).num_dsa_indexer_layers == 78
    assert GLM52.model_copy(update={"num_layers": 40}).num_dsa_indexer_layers == 3 + len(range(6, 40, 4))


def test_rank_counts_bound_a_long_leading_run_of_indexer_layers():
    """With interleaving the first max(offset, 1) layers, all with an indexer, may sit in another rank's chunk than
    the contiguous range puts them (freq 4, offset 20, pp 2, vpp 2, 8 + 70 layers: Megatron builds 5 and 29)."""
    m = GLM52.model_copy(update={"dsa_indexer_skip_topk_offset": 20})
    pp, vpp, first, last = 2, 2, 8, 70
    counts = PS.chunk_layer_counts(78, pp, vpp, first, last)
    starts = np.concatenate([[0], np.cumsum(counts)])
    real = [0] * pp
    for k, n in enumerate(counts):
        real[k % pp] += sum(m.dsa_computes_topk(i) for i in range(starts[k], starts[k] + n))
    lay = layouts_from_strategies([Strategy(pp=pp, vpp=vpp, first_stage_layers=first, last_stage_layers=last)], pp)
    priced = [float(stage_layers(m, lay, np.array([r])).dsa[0]) for r in range(pp)]
    assert all(p >= r for p, r in zip(priced, real)), (priced, real)


def test_the_split_validate_suggests_is_one_the_search_takes_when_fixed():
    for pp in (2, 8):
        first, last = PS.dsa_share_splits(GLM52, pp, 1)[0]
        problem = Problem(GLM52, load_cluster("h100", 1024), WL,
                          fixed={"pp": pp, "vpp": 1, "first_stage_layers": first, "last_stage_layers": last})
        assert solve(problem, "enumerate", top_k=1).plans, (pp, first, last)


def test_the_bridge_split_offered_for_a_sharing_model_starts_stages_on_indexer_layers():
    """Megatron-Bridge's account flags would start GLM-5.2's stages on reusing layers at pp 4; the split offered
    (and the one `estimate` fills in) keeps to indexer layers."""
    keys, note = PS.bridge_split(GLM52, 4, 1)
    assert keys == {"first_stage_layers": 18, "last_stage_layers": 20} and "DSA indexer" in note
    every = GLM52.model_copy(update={"dsa_indexer_topk_freq": 1, "dsa_indexer_skip_topk_offset": 0})
    assert "account_for_embedding" in PS.bridge_split(every, 4, 1)[0]
