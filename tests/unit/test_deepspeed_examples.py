"""DeepSpeedExamples configs (tests/data/deepspeed_examples, sources in its SOURCES.md) read and completed under
DeepSpeed's rules as `autoplan estimate --from-deepspeed` does, or refused by name: bf16 master weights and Adam
states are read as written and priced so, ZeRO-0 configs are legal, keys DeepSpeed ignores are notes."""
from pathlib import Path

import pytest

from autoplan.clusterio import load_cluster
from autoplan.complete import complete_strategy
from autoplan.errors import InputError
from autoplan.integrations.importers import from_deepspeed_config
from autoplan.modelio import load_model
from autoplan.workload import Workload

DATA = Path(__file__).parents[1] / "data" / "deepspeed_examples"
MODEL = load_model(str(Path(__file__).parents[1] / "data" / "hf_configs" / "gpt2.json"), ())

# file: (GPUs, batch options for "auto" fields, strategy keys read, global batch) or the refusal's words
CONFIGS = {
    "training__bf16_master_weight__configs__baseline.json": (8, {}, dict(zero=3, mbs=4), 32),
    "training__bf16_master_weight__configs__bf16_full.json": (
        8, {}, dict(zero=3, mbs=4, bf16_master_weights=True, adam_bf16_states=True), 32),
    "training__BingBertSquad__deepspeed_bsz24_config.json": (8, {}, dict(zero=0, mbs=3),
                                                              24),
    "training__BingBertSquad__1-bit_adam__nccl__deepspeed_onebitadam_bsz96_config.json": (
        8, {}, dict(zero=0, mbs=3), 96),
    "training__BingBertGlue__glue_bert_base.json": (8, {}, dict(zero=0, mbs=1), 32),
    "training__bing_bert__deepspeed_bsz64k_lamb_config_seq128.json": (64, {}, dict(zero=0, mbs=64), 65536),
    "training__bing_bert__bert_large.json": "holds no DeepSpeed setting",
    "training__imagenet__config__ds_config.json": (8, {}, dict(zero=0, mbs=32), 256),
    "training__imagenet__config__ds_fp16_z1_config.json": (8, {}, dict(zero=1, mbs=32, overlap_grad_reduce=False),
                                                            256),
    "training__gan__gan_deepspeed_config.json": (8, {}, dict(zero=0, mbs=8), 64),
    "training__autotuning__hf__dsconfigs__ds_config_z0.json": (8, dict(mbs=2, gbs=16), dict(zero=0, mbs=2), 16),
    "training__autotuning__hf__dsconfigs__ds_config_z2.json": (8, dict(mbs=2, gbs=16), dict(zero=2, mbs=2), 16),
    "training__data_efficiency__gpt_finetuning__config__ds_config_gpt_base_random_ltd.json": (
        2, {}, dict(zero=0, mbs=2), 4),
    "training__data_efficiency__vit_finetuning__config__ds_config_imagenet_random_ltd.json": (
        16, {}, dict(zero=0, mbs=16), 256),
    "benchmarks__autosp__configs__torchcompile_config.json": (8, dict(mbs=1, gbs=8), dict(zero=0, mbs=1), 8),
    "compression__bert__config__ds_config.json": (1, {}, dict(zero=0, mbs=32), 32),
}


def test_every_copied_config_is_checked():
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_deepspeed_examples_are_priced_or_refused_by_name(name):
    expect = CONFIGS[name]
    if isinstance(expect, str):
        with pytest.raises(InputError) as e:
            from_deepspeed_config(DATA / name, MODEL, 8, seq_len=512)
        assert expect in str(e.value) and "\n" not in str(e.value)
        return
    gpus, batch, keys, gbs = expect
    imp = from_deepspeed_config(DATA / name, MODEL, gpus, seq_len=512, **batch)
    assert {k: imp.strategy.get(k) for k in keys} == keys
    assert imp.global_batch_size == gbs
    # completed under DeepSpeed's rules as estimate does: the keys the config gives are kept and legal
    s, _ = complete_strategy(MODEL, load_cluster("h100", gpus), Workload(seq_len=512, global_batch_size=gbs),
                             dict(imp.strategy), engine="deepspeed")
    assert {k: getattr(s, k) for k in keys} == keys


def test_keys_deepspeed_ignores_are_notes_and_near_misses_are_refused(tmp_path):
    imp = from_deepspeed_config(DATA / "training__imagenet__config__ds_config.json", MODEL, 8, seq_len=512)
    assert any("'cuda_visible_devices' is not a DeepSpeed setting" in n for n in imp.notes)
    typo = tmp_path / "ds.json"
    typo.write_text('{"train_batch_size": 8, "zero_optimisation": {"stage": 2}}')
    with pytest.raises(InputError, match="did you mean 'zero_optimization'"):
        from_deepspeed_config(typo, MODEL, 8, seq_len=512)


def test_a_zero0_config_that_does_not_fit_is_shown_not_refused_for_a_key_it_never_set():
    # BingBertSquad (ZeRO 0, no overlap_comm) with a model too large for 8 GPUs: the defaults shown for the keys
    # left open must not bring in overlap_param_gather, which needs the distributed optimizer.
    model = load_model("llama3-8b", ())
    imp = from_deepspeed_config(DATA / "training__BingBertSquad__deepspeed_bsz24_config.json", model, 8, seq_len=2048)
    s, notes = complete_strategy(model, load_cluster("h100", 8), imp.workload, dict(imp.strategy), engine="deepspeed")
    assert s.zero == 0 and s.mbs == 3
    assert any("no completion of the given keys fits" in n for n in notes)


def test_bf16_master_weights_and_adam_states_are_priced_as_written():
    """DeepSpeedExamples' bf16_full config (bf16 master weights, gradients and Adam states) against its baseline: the
    optimizer state is 2 + 2 + 2 bytes per parameter instead of 4 + 4 + 4 (memory.optimizer_bytes_per_param) and the
    ZeRO-3 gradient partition is bf16; the rest is the same run."""
    from autoplan.costmodel.estimate import estimate

    model, cluster, workload = load_model("llama3-8b", ()), load_cluster("h100", 8), Workload(seq_len=2048,
                                                                                            global_batch_size=32)
    mem = {}
    for name in ("baseline", "bf16_full"):
        imp = from_deepspeed_config(DATA / f"training__bf16_master_weight__configs__{name}.json", model, 8,
                                    seq_len=2048)
        s, _ = complete_strategy(model, cluster, workload, dict(imp.strategy), engine="deepspeed")
        mem[name] = estimate(model, cluster, s, workload, engine="deepspeed").memory_breakdown
    assert mem["bf16_full"]["optimizer"] == pytest.approx(mem["baseline"]["optimizer"] / 2)
    assert mem["bf16_full"]["grads"] < mem["baseline"]["grads"]
    assert mem["bf16_full"]["weights"] == mem["baseline"]["weights"]


@pytest.mark.parametrize("keys, message", [
    (dict(zero=2, bf16_master_weights=True), "needs DeepSpeed's ZeRO-Offload"),
    (dict(zero=0, bf16_master_weights=True), "needs ZeRO stage 1, 2 or 3"),
    (dict(zero=2, adam_bf16_states=True), "bf16_master_weights=false"),
])
def test_bf16_master_weights_deepspeed_would_refuse_are_refused_by_name(keys, message):
    from autoplan.strategy import Strategy
    from autoplan.validate import validate

    with pytest.raises(InputError) as e:
        validate(MODEL, load_cluster("h100", 8), Workload(seq_len=512, global_batch_size=32), Strategy(**keys),
                 engine="deepspeed")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_fp16_master_weights_are_refused_by_name(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text('{"train_batch_size": 8, "fp16": {"enabled": true, "fp16_master_weights_and_grads": true}, '
                      '"zero_optimization": {"stage": 2}}')
    with pytest.raises(InputError, match="fp16.fp16_master_weights_and_grads=true"):
        from_deepspeed_config(config, MODEL, 8, seq_len=512)
