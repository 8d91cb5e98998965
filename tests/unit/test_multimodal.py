"""Vision-language models: parameter counts of five released configs, the stage-0 split as image load rises, the
inherit/disjoint choice, and the emitted Bridge overrides and MIMO arguments against their parsers' checks."""
from pathlib import Path

import pytest

from autoplan.clusterio import load_cluster
from autoplan.errors import InputError
from autoplan.multimodal.emit_bridge import bridge_overrides, check_transformer_config
from autoplan.multimodal.emit_mimo import check_mimo, mimo_args
from autoplan.multimodal.params import param_split
from autoplan.multimodal.placement import Placement, price
from autoplan.multimodal.reader import load_multimodal, read_multimodal
from autoplan.multimodal.search import best_of, search
from autoplan.multimodal.spec import Freeze, ImageData, ImageLoad
from autoplan.strategy import Strategy
from autoplan.workload import Workload

DATA = Path(__file__).parents[1] / "data" / "vlm"

# Published totals as the model pages print them (tests/data/vlm/SOURCES): billions, to the digits shown.
PUBLISHED = {
    "qwen2_5_vl_72b_instruct.json": 73.4,
    "qwen3_vl_8b_instruct.json": 8.77,
    "internvl3_8b.json": 7.94,
    "llava_1_5_7b_hf.json": 7.06,
    "gemma_3_27b_it.json": 27.4,
}


def _digits(x: float) -> int:
    return len(str(x).split(".")[1])


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_published_total(name):
    split = param_split(load_multimodal(str(DATA / name)))
    assert split.vision > 0 and split.projector > 0 and split.language > 0
    assert round(split.total / 1e9, _digits(PUBLISHED[name])) == PUBLISHED[name]


def test_llava_count_equals_the_released_weight_index():
    # tests/data/vlm/SOURCES: the byte-exact copy's repository holds the release's model.safetensors.index.json,
    # "total_size": 14126854144 bytes of float16 weights.
    split = param_split(load_multimodal(str(DATA / "llava_1_5_7b_hf.json")))
    assert split.total * 2 == 14126854144


def test_gemma3_vision_tower_matches_the_technical_report():
    # Gemma 3 technical report (arXiv:2503.19786) Table 1: the SigLIP vision encoder has 417M parameters.
    split = param_split(load_multimodal(str(DATA / "gemma_3_27b_it.json")))
    assert round(split.vision / 1e6) == 417


def _data(images, tokens):
    load = ImageLoad(images_per_sample=images, tokens_per_image=tokens)
    return ImageData(mean=load, tail=load, tail_percentile=95)


@pytest.fixture(scope="module")
def qwen72():
    return load_multimodal(str(DATA / "qwen2_5_vl_72b_instruct.json"))


def test_stage0_layers_fall_as_image_tokens_rise(qwen72):
    cluster = load_cluster("h100", 64)
    wl = Workload(seq_len=8192, global_batch_size=128)
    firsts = []
    for tokens in (256, 1024, 2048, 4096):
        priced = search(qwen72, cluster, wl, _data(1, tokens), Freeze(), kinds=("inherit",))
        pp4 = [p for p in priced if p.fits and p.placement.llm.pp == 4 and p.placement.llm.tp == 8
               and p.placement.llm.mbs == 1]
        best = pp4[0]
        first = best.placement.llm.first_stage_layers
        firsts.append(first if first is not None else 20)
        assert best.imbalance <= 0.10, (tokens, best.stage_s)
    assert firsts == sorted(firsts, reverse=True) and firsts[0] > firsts[-1], firsts


QWEN72_64_H100 = ["vlm", "--model", str(DATA / "qwen2_5_vl_72b_instruct.json"), "--cluster", "h100", "--gpus", "64",
                  "--seq", "8192", "--gbs", "128", "--explain"]


def _explain(capsys, images, tokens):
    from conftest import run_cli

    code, out, err = run_cli(QWEN72_64_H100 + ["--images-per-sample", images, "--tokens-per-image", tokens], capsys)
    assert code == 0, err
    lines = {line.split(":")[0].split(" ")[0]: line for line in out.splitlines()}
    return lines["choice"].split()[1], lines["stage"]


def test_placement_choice_flips_where_stage0_stops_absorbing_the_encoder(capsys):
    """Light images: stage 0 absorbs the encoder and inherit wins; heavy images: the encoder outweighs what stage 0
    can shed and the disjoint grid wins."""
    light_choice, light_absorb = _explain(capsys, "mean=1,p95=2", "mean=1024,p95=2048")
    heavy_choice, heavy_absorb = _explain(capsys, "mean=6,p95=8", "mean=1024,p95=1024")
    assert light_absorb.endswith(": absorbable") and light_choice == "inherit"
    assert heavy_absorb.endswith(": not absorbable") and heavy_choice == "disjoint"


def test_bridge_overrides_pass_transformer_config_checks(qwen72):
    s = Strategy(tp=8, pp=4, mbs=1, sp=True, zero=1, recompute="selective", first_stage_layers=14,
                 last_stage_layers=20)
    over = bridge_overrides(qwen72, Placement("inherit", s, 64), Freeze(vision_model=True), 8192, 128)
    model = over["model"]
    check_transformer_config(80, 64, 8, model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"],
                             model["num_layers_in_first_pipeline_stage"], model["num_layers_in_last_pipeline_stage"])
    assert model["freeze_vision_model"] is True and model["num_layers_in_first_pipeline_stage"] == 14


def test_bridge_refuses_what_v031_cannot_express(qwen72):
    s = Strategy(tp=8, pp=4, mbs=1, sp=True, zero=1, recompute="selective", first_stage_layers=13,
                 last_stage_layers=20)
    with pytest.raises(InputError, match="middle stage"):
        bridge_overrides(qwen72, Placement("inherit", s, 64), Freeze(), 8192, 128)
    even = Strategy(tp=8, pp=4, mbs=1, sp=True, zero=1, recompute="selective")
    with pytest.raises(InputError, match="disjoint"):
        bridge_overrides(qwen72, Placement("disjoint", even, 48, 8, 2), Freeze(), 8192, 128)
    llava = load_multimodal(str(DATA / "llava_1_5_7b_hf.json"))
    with pytest.raises(InputError, match="llava"):
        bridge_overrides(llava, Placement("inherit", even, 64), Freeze(), 4096, 128)


def test_mimo_args_pass_the_hetero_grid_checks(qwen72):
    s = Strategy(tp=4, pp=5, mbs=1, sp=True, zero=1, recompute="selective")
    p = Placement("disjoint", s, 40, 4, 2)  # 8 encoder ranks, 40 language ranks: llm_dp 2
    args = mimo_args(qwen72, p, 48, 8192, 128)
    assert args[args.index("--llm-offset") + 1] == "8" and args[args.index("--llm-dp") + 1] == "2"
    assert not any(a.startswith("--encoder-tensor") or a.startswith("--encoder-pipeline") for a in args)
    check_mimo(qwen72, p, 48)
    with pytest.raises(InputError, match="divisible by --encoder-dp"):
        check_mimo(qwen72, Placement("disjoint", s, 40, 2, 4), 48)  # 1 * 2 % 4 != 0
    with pytest.raises(InputError, match="every rank"):
        check_mimo(qwen72, p, 64)


def test_bridge_model_keys_are_accepted_by_megatron_core_transformer_config(qwen72):
    """The emitted model section builds a megatron-core 0.16.1 TransformerConfig (the provider's base class), and
    the emitter's replicated pipeline-split checks agree with TransformerConfig's on every (first, last) pair."""
    pytest.importorskip("megatron.core")
    import dataclasses

    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    from autoplan.multimodal.emit_bridge import PROVIDER_FIELDS

    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    s = Strategy(tp=8, pp=4, mbs=1, sp=True, zero=1, recompute="selective", first_stage_layers=14,
                 last_stage_layers=20)
    model = bridge_overrides(qwen72, Placement("inherit", s, 64), Freeze(), 8192, 128)["model"]
    assert all(k in names or k in PROVIDER_FIELDS for k in model)
    fields = {k: v for k, v in model.items() if k in names}
    fields["pipeline_dtype"] = getattr(torch, fields["pipeline_dtype"])
    TransformerConfig(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8, **fields)
    for first in (None, 1, 6, 13, 14):
        for last in (None, 1, 20, 21):
            try:
                TransformerConfig(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                                  tensor_model_parallel_size=8, pipeline_model_parallel_size=4,
                                  num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                                  pipeline_dtype=torch.bfloat16)
                real = True
            except ValueError:
                real = False
            try:
                check_transformer_config(80, 64, 8, 8, 4, first, last)
                ours = True
            except InputError:
                ours = False
            assert ours == real, (first, last)


def test_drawn_micro_batches_price_between_mean_and_tail(qwen72):
    """With one load for every micro batch the 1F1B simulation of drawn micro batches agrees with the closed-form
    step (within 1%); with a tail, an inherit plan's drawn step lies between the mean and the all-tail step."""
    from autoplan.multimodal.placement import drawn_loads, drawn_step

    cluster = load_cluster("h100", 64)
    wl = Workload(seq_len=8192, global_batch_size=128)
    s = Strategy(tp=8, pp=4, mbs=1, sp=True, zero=1, recompute="selective", first_stage_layers=14,
                 last_stage_layers=20)
    d = Strategy(tp=4, pp=7, mbs=1, sp=True, zero=1, recompute="selective", first_stage_layers=10,
                 last_stage_layers=10)
    flat = _data(2, 1024)
    for placement in (Placement("inherit", s, 64), Placement("disjoint", d, 56, 4, 2)):
        (priced,) = price(qwen72, cluster, wl, flat, Freeze(), [placement])
        assert drawn_step(qwen72, cluster, flat, Freeze(), priced) == pytest.approx(priced.step_s, rel=0.01)
    tailed = ImageData(mean=ImageLoad(images_per_sample=2, tokens_per_image=1024),
                       tail=ImageLoad(images_per_sample=6, tokens_per_image=1024), tail_percentile=95)
    loads = drawn_loads(tailed, 128)
    assert sum(x.image_tokens for x in loads) / 128 == pytest.approx(tailed.mean.image_tokens)
    assert sum(x == tailed.tail for x in loads) == round(0.05 * 128)
    (priced,) = price(qwen72, cluster, wl, tailed, Freeze(), [Placement("inherit", s, 64)])
    drawn = drawn_step(qwen72, cluster, tailed, Freeze(), priced)
    assert priced.step_s < drawn < priced.tail_step_s


@pytest.mark.parametrize("extra, rule", [
    (["--freeze", "vision,eyes", "--images-per-sample", "mean=1,p95=1", "--tokens-per-image", "mean=576,p95=576"],
     "--freeze"),
    (["--images-per-sample", "2", "--tokens-per-image", "mean=256,p95=512"], "mean=M,pNN=T"),
    (["--images-per-sample", "mean=2,p90=4", "--tokens-per-image", "mean=256,p95=512"], "same percentile"),
    (["--images-per-sample", "mean=4,p95=2", "--tokens-per-image", "mean=256,p95=512"], "tail be >= the mean"),
    (["--images-per-sample", "mean=8,p95=16", "--tokens-per-image", "mean=1024,p95=1024"], "more than --seq"),
    (["--images-per-sample", "mean=1,p95=1", "--tokens-per-image", "mean=256,p95=256", "--placement", "both"],
     "--placement"),
])
def test_bad_input_is_one_line_exit_2(capsys, extra, rule):
    from conftest import run_cli

    code, out, err = run_cli(["vlm", "--model", str(DATA / "llava_1_5_7b_hf.json"), "--gpus", "8", "--seq", "4096",
                              "--gbs", "64", *extra], capsys)
    assert code == 2 and rule in err and len(err.strip().splitlines()) == 1, err


def test_text_model_paths_point_vision_configs_to_vlm(tmp_path, capsys):
    from conftest import run_cli

    code, _, err = run_cli(["estimate", "--model", str(DATA / "qwen2_5_vl_72b_instruct.json"), "--gpus", "64",
                            "--strategy", "tp=8,pp=4"], capsys)
    assert code == 2 and "autoplan vlm" in err
    code, _, err = run_cli(["vlm", "--model", str(DATA / "llava_1_5_7b_hf.json").replace("llava_1_5_7b_hf", "x"),
                            "--images-per-sample", "mean=1,p95=1", "--tokens-per-image", "mean=1,p95=1"], capsys)
    assert code == 2 and "no such file" in err


def test_llama4_is_refused_by_name(tmp_path, capsys):
    import json

    from conftest import run_cli

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama4", "vision_config": {}, "text_config": {}}))
    code, _, err = run_cli(["vlm", "--model", str(cfg), "--images-per-sample", "mean=1,p95=1",
                            "--tokens-per-image", "mean=1,p95=1"], capsys)
    assert code == 2 and "llama4" in err and "not read" in err


def test_image_histogram_gives_mean_and_tail(tmp_path):
    from autoplan.multimodal.data import from_histogram

    hist = tmp_path / "images.csv"
    hist.write_text("images,tokens_per_image,count\n1,256,70\n2,1024,25\n8,1024,5\n")
    data = from_histogram(str(hist), 95)
    assert data.mean.images_per_sample == pytest.approx((70 + 50 + 40) / 100)
    assert data.mean.image_tokens == pytest.approx((70 * 256 + 25 * 2048 + 5 * 8192) / 100)
    assert (data.tail.images_per_sample, data.tail.tokens_per_image) == (2, 1024)  # 95% of samples at or below
    assert from_histogram(str(hist), 96).tail.images_per_sample == 8


def test_frozen_parts_carry_no_gradients_or_optimizer_state(qwen72):
    from autoplan.multimodal.encoder_cost import encoder_memory, encoder_time
    from autoplan.multimodal.params import projector_params

    load = ImageLoad(images_per_sample=2, tokens_per_image=1024)
    kw = dict(tp=1, dp=8, distributed_optimizer=True, in_flight=4, recompute=False)
    trained = encoder_memory(qwen72, load, 1, Freeze(), **kw)
    vision_frozen = encoder_memory(qwen72, load, 1, Freeze(vision_model=True), **kw)
    assert vision_frozen.weights == trained.weights
    assert vision_frozen.grads == projector_params(qwen72.projector) * 4  # only the projector's fp32 gradients
    assert vision_frozen.activations == 0.0  # nothing in front of the projector needs a backward pass
    cluster = load_cluster("h100", 64)
    assert encoder_time(qwen72, cluster, load, 1, Freeze(vision_model=True, vision_projection=True)).bwd == 0.0
    wl = Workload(seq_len=8192, global_batch_size=128)
    s = Strategy(tp=8, pp=4, mbs=1, sp=True, zero=1, recompute="selective")
    (train,) = price(qwen72, cluster, wl, _data(1, 1024), Freeze(), [Placement("inherit", s, 64)])
    (frozen,) = price(qwen72, cluster, wl, _data(1, 1024), Freeze(language_model=True), [Placement("inherit", s, 64)])
    assert frozen.after_s < train.after_s  # no gradient reduction or optimizer step for a frozen LLM
    (none,) = price(qwen72, cluster, wl, _data(1, 1024), Freeze(vision_model=True, vision_projection=True,
                                                                 language_model=True), [Placement("inherit", s, 64)])
    assert none.after_s == 0.0
    assert frozen.step_s < train.step_s and frozen.peak_mem_gib < train.peak_mem_gib


def test_emit_searches_only_the_placements_its_files_express(tmp_path, capsys):
    """--emit bridge writes inherit placements and --emit mimo disjoint ones, so each searches only those (the best
    plan of the light-image 72B case is disjoint once encoder recompute, which neither file expresses, is left out:
    --emit bridge used to pick it and then refuse to write it); when nothing the files express fits, the message
    names the plan that fits with encoder recompute; asking for both formats is one line, exit 2."""
    from conftest import run_cli

    light = QWEN72_64_H100[:-1] + ["--images-per-sample", "mean=1,p95=2", "--tokens-per-image", "mean=1024,p95=2048"]
    code, out, err = run_cli(light + ["--emit", "bridge", "--out", str(tmp_path / "b")], capsys)
    assert code == 1 and "without encoder recompute" in err and "enc-rc fits" in err, err
    assert not (tmp_path / "b").exists()
    code, out, err = run_cli(light + ["--emit", "mimo", "--out", str(tmp_path / "m")], capsys)
    assert code == 0 and "best: disjoint" in out, err
    assert (tmp_path / "m" / "mimo_args.txt").is_file()
    code, _, err = run_cli(light + ["--emit", "bridge,mimo", "--out", str(tmp_path / "bm")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "emit one format" in err, err


# Released configs copied byte for byte (tests/data/vlm/SOURCES): the vision tower, projector and language model read
# here against the model transformers builds on the meta device.
BUILT = ["qwen3_5_35b_a3b.json", "qwen3_5_27b.json", "qwen3_vl_30b_a3b_instruct.json", "qwen3_vl_8b_instruct.json",
         "kimi_k2_5.json"]
# Module names of the vision tower and projector in the built models (modeling_qwen3_vl.py `visual`, whose merger
# sits inside it; modeling_kimi_k25.py `vision_tower` and `mm_projector`).
VISUAL = (".visual.", ".vision_tower.", ".mm_projector.")


@pytest.mark.parametrize("name", BUILT)
def test_parameter_count_equals_the_model_transformers_builds(name):
    import json
    import logging
    import warnings

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    cfg = json.loads((DATA / name).read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items()
                                                                         if k != "model_type"})
        with torch.device("meta"):
            model = transformers.AutoModelForImageTextToText.from_config(config)
    split = param_split(load_multimodal(str(DATA / name)))
    visual = sum(p.numel() for n, p in model.named_parameters() if any(part in n for part in VISUAL))
    assert (split.total, split.vision + split.projector) == (sum(p.numel() for p in model.parameters()), visual)


def test_moe_language_model_is_searched_with_expert_parallelism():
    """Qwen3-VL-30B-A3B (128 experts): the search prices expert-parallel layouts, and its best is one of them and no
    slower than the best without experts spread."""
    spec = load_multimodal(str(DATA / "qwen3_vl_30b_a3b_instruct.json"))
    priced = search(spec, load_cluster("h100", 32), Workload(seq_len=8192, global_batch_size=64),
                    _data(2, 1024), Freeze(), kinds=("inherit",))
    fits = [p for p in priced if p.fits]
    no_ep = [p for p in fits if p.placement.llm.ep == 1]
    assert fits[0].placement.llm.ep > 1 and fits[0].step_s <= no_ep[0].step_s
    assert " ep" in fits[0].placement.label()


def test_qwen3_5_language_model_keeps_its_gated_deltanet_layers():
    spec = load_multimodal(str(DATA / "qwen3_5_35b_a3b.json"))
    m = spec.llm
    assert (m.num_layers, m.linear_attention_layers, m.linear_attention_freq, m.num_experts, m.moe_router_topk) == \
        (40, 30, 4, 256, 8)
    assert (m.shared_expert_gate, m.attention_output_gate, m.moe_router_norm_topk_prob) == (True, True, True)
    assert (m.rotary_base, m.rotary_percent) == (1e7, 0.25)  # from rope_parameters


@pytest.mark.parametrize("name", ["qwen3_5_35b_a3b.json", "qwen3_5_27b.json", "qwen3_vl_30b_a3b_instruct.json",
                                  "kimi_k2_5.json"])
def test_byte_copies_are_unchanged_since_copied(name):
    """tests/data/vlm/SOURCES names each copy's source and the SHA-256 of the bytes copied; an edit shows here."""
    import hashlib

    entry = (DATA / "SOURCES").read_text().split(f"\n{name}\n")[1].split("\n\n")[0]
    assert f"SHA-256 {hashlib.sha256((DATA / name).read_bytes()).hexdigest()}" in entry


def test_unpriced_placements_change_neither_the_plans_nor_the_least_memory_named(qwen72):
    """search() leaves unpriced the placements whose language model alone exceeds memory (the encoder only adds to
    it): the fitting plans are those of pricing every placement, in the same order; when nothing fits, the least
    memory needed, with and without encoder recompute, is that of pricing every placement."""
    from autoplan.multimodal import search as S

    wl, data = Workload(seq_len=8192, global_batch_size=128), _data(1, 1024)

    def every_placement(cluster):  # search()'s placements, priced as before any was left out
        captured = []
        real = S.price

        def capture(spec, cluster_, wl_, data_, freeze, placements, *args, **kw):
            captured.append(placements)
            return real(spec, cluster_, wl_, data_, freeze, placements, *args, **kw)

        S.price = capture
        try:
            found = search(qwen72, cluster, wl, data, Freeze())
        finally:
            S.price = real
        return found, price(qwen72, cluster, wl, data, Freeze(), captured[0])

    found, every = every_placement(load_cluster("h100", 32))
    assert [p.placement for p in found if p.fits] == \
        [p.placement for p in sorted(every, key=lambda p: (not p.fits, p.step_s)) if p.fits]
    found, every = every_placement(load_cluster("h100", 8))  # 72B on one node: nothing fits
    assert not any(p.fits for p in every) and len(found) < len(every)
    for rc in (False, True):
        assert min(p.peak_mem_gib for p in found if p.placement.encoder_recompute == rc) == \
            min(p.peak_mem_gib for p in every if p.placement.encoder_recompute == rc)


@pytest.mark.parametrize("change, named", [
    ({"vision_config": {"patch_size": 0}}, "patch_size=0"),
    ({"vision_config": {"deepstack_visual_indexes": 3}}, "deepstack_visual_indexes=3"),
    ({"model_type": ["qwen3_5_moe"]}, "model_type ['qwen3_5_moe'] is not supported"),
])
def test_bad_vision_language_config_is_one_line(change, named):
    import json

    cfg = json.loads((DATA / "qwen3_5_35b_a3b.json").read_text())
    for key, value in change.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    with pytest.raises(InputError) as e:
        read_multimodal(cfg, "x", "config.json")
    assert named in str(e.value) and "\n" not in str(e.value)
