"""Layouts NVIDIA published (Megatron-LM accepts each) priced as given: a vpp, mbs or cp past the search's own
range, and DeepSeek-V3 / Kimi-K2 read from their Hugging Face config.json at the virtual-pipeline layouts that
Megatron-Bridge's recipes use; and the rule a 'no legal strategy' names."""
from pathlib import Path

import pytest

from autoplan.clusterio import load_cluster
from autoplan.complete import complete_strategy
from autoplan.modelio import load_model
from autoplan.solvers.policy import why_nothing_is_legal
from autoplan.solvers.space import Problem
from autoplan.workload import Workload

from conftest import cluster, make_dense, workload

HF = Path(__file__).parents[1] / "data" / "hf_configs"


@pytest.mark.parametrize("model, gpus, seq, gbs, given", [
    # NeMo 24.07 Llama-2-70B: tp4 pp4 vpp20, 80 layers, one layer per virtual stage.
    ("llama2-70b", 64, 4096, 128, dict(tp=4, pp=4, vpp=20)),
    # Qwen3-30B-A3B pp2 vpp24: 48 layers, one per virtual stage.
    ("qwen3-30b-a3b", 64, 4096, 128, dict(pp=2, vpp=24)),
    # DeepSeek-V3 and Kimi-K2 from their HF config.json (61 layers): Bridge's layout strings at these vpp.
    (str(HF / "deepseek_v3.json"), 1024, 4096, 1024, dict(pp=4, vpp=4)),
    (str(HF / "deepseek_v3.json"), 512, 4096, 1024, dict(pp=2, vpp=4)),
    (str(HF / "deepseek_v3.json"), 512, 4096, 1024, dict(pp=2, vpp=8)),
    (str(HF / "kimi_k2.json"), 1024, 4096, 1024, dict(pp=4, vpp=4)),
    (str(HF / "kimi_k2.json"), 512, 4096, 1024, dict(pp=2, vpp=4)),
    (str(HF / "kimi_k2.json"), 512, 4096, 1024, dict(pp=2, vpp=8)),
    # an mbs above 16 and a cp that is not a power of two, where the batch and the sequence divide
    ("llama3-8b", 48, 6144, 768, dict(mbs=32)),
    ("llama3-8b", 48, 6144, 768, dict(cp=3)),
])
def test_published_layouts_are_priced_as_given(model, gpus, seq, gbs, given):
    m = load_model(model, ())
    s, notes = complete_strategy(m, load_cluster("h100", gpus), Workload(seq_len=seq, global_batch_size=gbs), given)
    assert {k: getattr(s, k) for k in given} == given
    if m.num_layers % s.pp or (m.num_layers // s.pp) % s.vpp:
        assert s.pipeline_layout  # the 61 layers are placed by a layout string, named in the notes
        assert any(s.pipeline_layout in n for n in notes)


def test_no_legal_candidate_names_the_key_and_its_nearest_legal_values():
    # tp=2 is legal by every rule but left out of this search (excluded): the message names the key and the values
    # the other keys as given allow, nearest first.
    problem = Problem(make_dense(), cluster(8), workload(), fixed={"tp": 2, "pp": 1}, excluded={"tp": (2,)})
    why = why_nothing_is_legal(problem)
    assert why.startswith("--fix tp=2: no legal candidate of this layout space can carry it (with megatron), "
                          "legal tp with the other keys as given: 1, 4")


def test_no_legal_strategy_from_estimate_names_the_rule(monkeypatch):
    # A search-only narrowing (here: tp=2 taken out of the search's tp choices) that the plain defaults do not
    # break: estimate's completion answers with the fixed key, the reason and the legal values, not a bare list.
    import autoplan.solvers.space as space

    original = space.tp_choices
    monkeypatch.setattr(space, "tp_choices", lambda problem: [t for t in original(problem) if t != 2])
    from autoplan.errors import InputError

    with pytest.raises(InputError) as e:
        complete_strategy(make_dense(), cluster(8), workload(), {"tp": 2})
    message = str(e.value)
    assert message.startswith("no legal strategy has tp=2")
    assert "tp=2: no legal candidate of this layout space can carry it (with megatron), legal tp with the other " \
           "keys as given: 1, 4" in message
