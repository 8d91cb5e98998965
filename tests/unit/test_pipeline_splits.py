"""Pipeline splits NVIDIA runs: account_for_embedding/loss and --pipeline-model-parallel-layout are validated with
Megatron's rules, priced, chosen as Megatron-Bridge chooses them, reached by the search, and agree with
megatron-core's own layer placement (TransformerConfig, get_num_layers_to_build, PipelineParallelLayerLayout)."""
from __future__ import annotations

import warnings

import pytest

from autoplan.cluster import ClusterSpec
from autoplan.clusterio import load_gpu
from autoplan.complete import complete_strategy
from autoplan.costmodel.estimate import estimate
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.modelio import load_model
from autoplan import pipeline_split as PS
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem, enumerate_grid, legal_strategies
from autoplan.strategy import Strategy, parse_strategy_text
from autoplan.validate import first_broken_rule, validate
from autoplan.workload import Workload


def _setup(model: str, gpus: int, gbs: int = 1536, seq: int = 8192, gpu: str = "h100"):
    return load_model(model), ClusterSpec(gpu=load_gpu(gpu), num_gpus=gpus), Workload(seq_len=seq,
                                                                                       global_batch_size=gbs)


# ---- the layouts are priced, with Megatron-Bridge's split -------------------------------------------

@pytest.mark.parametrize("model,gpus,keys,want", [
    ("llama3.1-405b", 1024, "tp=8,pp=8,cp=2", "account_for_embedding"),
    ("llama3.1-405b", 1024, "tp=8,pp=8,vpp=8,cp=2", "account_for_embedding"),
    ("llama3.1-405b", 1024, "tp=8,pp=16", "account_for_embedding"),
    ("llama3.1-405b", 1024, "tp=8,pp=16,vpp=8", "account_for_embedding"),
    ("qwen3-235b-a22b", 256, "tp=4,pp=4,vpp=1,ep=8", "account_for_embedding"),
    ("qwen3-235b-a22b", 256, "tp=4,pp=8,vpp=4,ep=8", "account_for_embedding"),
    ("deepseek-v3", 1024, "tp=2,pp=16,vpp=1,ep=64", "pipeline_layout=Et*4|(t*4|)*14tmL"),
    ("deepseek-v3", 1024, "tp=2,pp=8,vpp=4,ep=64", "pipeline_layout=Et|(t*2|)*30mL"),
    ("deepseek-v3", 1024, "tp=2,pp=2,vpp=1,ep=64", "pipeline_layout=Et*31|t*30mL"),
    ("deepseek-v3", 1024, "tp=2,pp=16,vpp=2,ep=64", "pipeline_layout="),
])
def test_published_layouts_are_priced_with_bridge_split(model, gpus, keys, want):
    m, c, wl = _setup(model, gpus, gbs=2048, seq=4096)
    s, notes = complete_strategy(m, c, wl, parse_strategy_text(keys))
    assert any("Megatron-Bridge" in n and want in n for n in notes), notes
    assert first_broken_rule(m, c, wl, s) is None
    est = estimate(m, c, s, wl)
    layers = [st.num_layers for st in est.stage_memory]
    assert sum(layers) == m.num_layers and layers == PS.rank_layer_counts(s, m.num_layers)
    assert est.step_time_s > 0


def test_llama405b_bridge_split_is_megatrons():
    """pp8 vp8 with the embedding and loss counted: 128 = 8 ranks x 8 chunks x 2, the end ranks one layer fewer."""
    m = load_model("llama3.1-405b")
    keys, note = PS.bridge_split(m, 8, 8)
    assert keys == {"account_for_embedding": True, "account_for_loss": True}
    assert "llama31_405b_pretrain_256gpu_h100_bf16_config" in note
    s = Strategy(pp=8, vpp=8, **keys)
    assert PS.rank_layer_counts(s, 126) == [15] + [16] * 6 + [15]
    assert PS.bridge_split(load_model("llama3.1-70b"), 8, 2) is None  # 80 layers split evenly


def test_bridge_deepseek_layout_map():
    m = load_model("deepseek-v3")
    assert PS.bridge_split(m, 4, 1)[0] == {"pipeline_layout": "Et*16|t*16|t*16|t*13mL"}
    assert PS.bridge_split(m, 8, 2)[0] == {"pipeline_layout": "Et*4|(t*4|)*14tmL"}


# ---- Megatron's rules --------------------------------------------------------------------------------------

def test_account_rules():
    m, c, wl = _setup("llama3.1-405b", 1024)
    base = dict(tp=8, pp=8, cp=2, sp=True)
    assert validate(m, c, wl, Strategy(**base, vpp=8, account_for_embedding=True, account_for_loss=True))
    msg = first_broken_rule(m, c, wl, Strategy(**base, vpp=8, account_for_embedding=True))
    assert "127 must be divisible by pp=8" in msg and "account_for_loss=true" in msg
    msg = first_broken_rule(m, c, wl, Strategy(**base, vpp=3, account_for_embedding=True, account_for_loss=True))
    assert "(16) must be divisible by vpp=3" in msg
    msg = first_broken_rule(m, c, wl, Strategy(**base, account_for_loss=True, first_stage_layers=15))
    assert "cannot be combined" in msg


def test_layout_rules():
    m, c, wl = _setup("deepseek-v3", 1024, gbs=2048, seq=4096)
    m = m.model_copy(update={"mtp_num_layers": 0})  # the catalogue's one MTP depth is covered by the next case
    base = dict(tp=2, pp=8, ep=64, sp=True)
    assert validate(m, c, wl, Strategy(**base, vpp=4, pipeline_layout="Et|(tt|)*30L"))
    cases = {
        "E|(tt|)*29t|L": "holds 59 decoder layers",
        "t|(tt|)*30EL": "must start with the embedding E",
        "Et|(tt|)*30mL": "MTP layers m, the model has 0",
        "Et|(tt|)*30Lx": "symbol 'x' is not a layer",
    }
    for layout, words in cases.items():
        msg = first_broken_rule(m, c, wl, Strategy(**base, vpp=4, pipeline_layout=layout))
        assert msg and words in msg and "\n" not in msg, (layout, msg)
    for layout, words in {"Et|(tt|)*30L": "but vpp=3; use vpp=4", "Et|(tt|)*29L": "31 virtual stages"}.items():
        msg = first_broken_rule(m, c, wl, Strategy(**base, vpp=3, pipeline_layout=layout))
        assert msg and words in msg and "\n" not in msg, (layout, msg)
    uneven_middle = "Et*7|t*9|t*7|t*8|t*8|t*8|t*8|t*6L"
    assert "middle ranks" in first_broken_rule(m, c, wl, Strategy(**base, pipeline_layout=uneven_middle))
    with_mtp = m.model_copy(update={"mtp_num_layers": 1})
    assert validate(with_mtp, c, wl, Strategy(**base, vpp=4, pipeline_layout="Et|(tt|)*30mL"))
    assert "MTP layers m, the model has 1" in first_broken_rule(with_mtp, c, wl,
                                                                Strategy(**base, vpp=4, pipeline_layout="Et|(tt|)*30L"))


def test_parse_matches_megatron_core():
    warnings.filterwarnings("ignore")
    layout_mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    parse = layout_mod.PipelineParallelLayerLayout.parse_str_to_list
    names = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
    for text in ("Et|(tt|)*30mL", "Et*4|(t*4|)*14tmL", "Ettt|(tt|)*29,m|L", PS.balanced_layout(61, 2, 1, 1, 2)):
        ours = [[names[ch] for ch in stage] for stage in PS.parse_layout(text)]
        theirs = [[t.name for t in stage] for stage in parse(text)]
        assert ours == theirs, text


def _megatron_config(num_layers: int, pp: int, vpp: int, **split):
    torch = pytest.importorskip("torch")
    warnings.filterwarnings("ignore")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    return tc.TransformerConfig(num_layers=num_layers, hidden_size=128, num_attention_heads=8,
                                pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
                                virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, **split)


@pytest.mark.parametrize("layers,pp,vpp,emb,loss", [(126, 8, 8, 1, 1), (126, 16, 4, 1, 1), (94, 8, 4, 1, 1),
                                                    (94, 4, 1, 1, 1), (61, 2, 1, 1, 0), (63, 8, 4, 0, 1)])
def test_account_counts_match_megatron_core(layers, pp, vpp, emb, loss):
    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    cfg = _megatron_config(layers, pp, vpp, account_for_embedding_in_pipeline_split=bool(emb),
                           account_for_loss_in_pipeline_split=bool(loss))
    theirs = [sum(block.get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=r)
                  for v in range(vpp)) for r in range(pp)]
    s = Strategy(pp=pp, vpp=vpp, account_for_embedding=bool(emb), account_for_loss=bool(loss))
    assert PS.account_problem(layers, pp, vpp, emb, loss) is None
    assert PS.rank_layer_counts(s, layers) == theirs


@pytest.mark.parametrize("layers,pp,vpp", [(61, 2, 1), (61, 8, 4), (61, 16, 2), (61, 4, 4), (126, 8, 4), (30, 4, 2)])
def test_balanced_layouts_are_accepted_by_megatron_core(layers, pp, vpp):
    for emb, loss in PS._unit_pairs(layers, pp, vpp)[:2]:
        text = PS.balanced_layout(layers, pp, vpp, emb, loss)
        assert PS.layout_problem(text, pp, vpp, layers, 0) is None
        cfg = _megatron_config(layers, pp, vpp, pipeline_model_parallel_layout=text)
        theirs = [sum(stage.count(type(stage[0]).decoder) if stage else 0
                      for stage in cfg.pipeline_model_parallel_layout.layout[r]) for r in range(pp)]
        assert PS.rank_layer_counts(Strategy(pp=pp, vpp=vpp, pipeline_layout=text), layers) == theirs


def test_megatron_core_refuses_what_validate_refuses():
    with pytest.raises(Exception):
        _megatron_config(126, 8, 4, account_for_embedding_in_pipeline_split=True)
    assert PS.account_problem(126, 8, 4, 1, 0)


# ---- the search ----------------------------------------------------------------------------------------------

def test_search_reaches_llama405b_split_layouts():
    m, c, wl = _setup("llama3.1-405b", 16384, gbs=2048)
    lay = enumerate_grid(Problem(m, c, wl, fixed={"tp": 8, "cp": 2})).layouts
    have = {(int(p), int(v), int(a)) for p, v, a in zip(lay.pp, lay.vpp, lay.account)}
    assert (8, 8, 3) in have and (16, 8, 3) in have and (16, 1, 3) in have
    plans = solve(Problem(m, c, wl), "enumerate", top_k=5).plans
    assert plans and all(p.strategy.pp in (8, 16, 32) and p.strategy.account_for_embedding for p in plans[:3])


def test_search_reaches_deepseek_layouts():
    m, c, wl = _setup("deepseek-v3", 1024, gbs=8192, seq=4096)
    lay = enumerate_grid(Problem(m, c, wl, fixed={"tp": 2, "pp": 8, "vpp": 4, "ep": 64})).layouts
    assert "Et|(t*2|)*30mL" in set(lay.layout)


def test_every_split_of_a_small_odd_model_is_legal():
    odd = ModelSpec(name="odd-13", num_layers=13, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                    num_query_groups=16, kv_channels=64, vocab_size=32000, max_position_embeddings=4096)
    problem = Problem(odd, ClusterSpec(gpu=load_gpu("h100"), num_gpus=8), Workload(seq_len=2048,
                                                                                    global_batch_size=32))
    strategies = legal_strategies(problem)
    kinds = {("layout" if s.pipeline_layout else "account" if s.account_for_embedding or s.account_for_loss
              else "ends" if s.first_stage_layers is not None else "even") for s in strategies}
    assert {"account", "ends", "even"} <= kinds and "layout" not in kinds  # layouts: Bridge's layout models only
    for s in strategies[::7]:
        assert first_broken_rule(problem.model, problem.cluster, problem.workload, s) is None, s.label()
        counts = PS.rank_layer_counts(s, 13)
        assert sum(counts) == 13 and min(counts) >= 0


def test_every_searched_deepseek_layout_is_legal():
    m, c, wl = _setup("deepseek-v3", 1024, gbs=8192, seq=4096)
    problem = Problem(m, c, wl, fixed={"tp": 2, "ep": 64, "cp": 1, "mbs": 1, "fp8": "hybrid", "zero": 1,
                                       "recompute": "selective"})
    layouts = [s for s in legal_strategies(problem) if s.pipeline_layout]
    assert len({(s.pp, s.vpp) for s in layouts}) >= 6
    for s in layouts:
        assert first_broken_rule(m, c, wl, s) is None, s.label()
        assert sum(PS.rank_layer_counts(s, 61)) == 61


def test_deepspeed_takes_no_megatron_split():
    m, c, wl = _setup("llama3.1-405b", 1024)
    s = Strategy(tp=8, pp=8, account_for_embedding=True, account_for_loss=True)
    msg = first_broken_rule(m, c, wl, s, engine="deepspeed")
    assert msg and "Megatron-LM pipeline split" in msg
    with pytest.raises(InputError):
        validate(m, c, wl, s, engine="deepspeed")


def test_layout_strings_survive_the_command_line():
    from autoplan.solvers.space import parse_constraints

    keys = parse_strategy_text("tp=2,pipeline_layout=Ettt|(tt|)*29,m|L,pp=16")
    assert keys == {"tp": 2, "pipeline_layout": "Ettt|(tt|)*29,m|L", "pp": 16}
    fixed = parse_constraints(["pp=8|16,pipeline_layout=Et|(tt|)*30,L"], "--fix")
    assert fixed == {"pp": [8, 16], "pipeline_layout": ["Et|(tt|)*30,L"]}


def test_vpp_is_read_from_a_layout_string():
    m, c, wl = _setup("deepseek-v3", 1024, gbs=8192, seq=4096)
    m = m.model_copy(update={"mtp_num_layers": 0})
    s, _ = complete_strategy(m, c, wl, parse_strategy_text("tp=2,pp=8,ep=64,pipeline_layout=Et|(tt|)*30,L"))
    assert (s.pp, s.vpp, s.pipeline_layout) == (8, 4, "Et|(tt|)*30,L")
    assert s.first_stage_layers is None and not s.account_for_embedding


def test_a_layout_string_sets_vpp_when_vpp_is_left_out():
    """vpp = the layout's stages / pp, derived in one place (layout_string.layout_vpp) by Strategy itself; a vpp
    written beside the layout is kept as written, for the layout's rule to check."""
    from autoplan.strategy import Strategy

    assert Strategy(pp=2, pipeline_layout="Et|t|t|tL").vpp == 2
    assert Strategy(pp=2, vpp=3, pipeline_layout="Et|t|t|tL").vpp == 3
    assert Strategy(pp=3, pipeline_layout="Et|t|t|tL").vpp == 1  # 4 stages over pp=3: the layout's rule refuses it
