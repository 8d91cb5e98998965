"""Run the files `autoplan vlm --emit` writes through the configuration code of the releases they are for.

Megatron-Bridge v0.3.1 (autoplan/multimodal/emit_bridge.py): the override YAML goes through what the release's
example launcher (examples/models/vlm/qwen_vl/finetune_qwen_vl.py) does with --config-file: Bridge's own
create_omegaconf_dict_config, an OmegaConf merge, apply_overrides (training/utils/omegaconf_utils.py), then
ConfigContainer.validate() (training/config.py), which finalizes the Qwen25VLModelProvider: megatron-core 0.16.1's
TransformerConfig checks (heads and query groups against TP, first/last pipeline-stage layer counts) and the
container's own (world size against TP x PP x CP, batch sizes); then megatron-core's get_num_layers_to_build, which
the model build calls on every pipeline rank (an even split that does not divide fails only there). A key the provider or the container does not have is
skipped by apply_overrides with a warning; here it counts as a rejection.
  What cannot run and why (pip install --no-deps megatron-bridge==0.3.1, whose pyproject pins
  megatron-core >= 0.15, < 0.17, i.e. autoplan's megatron-core 0.16.1, and transformers < 5):
  - `import megatron.bridge` runs megatron/bridge/__init__.py -> models/__init__.py -> models/conversion (the
    Hugging Face checkpoint converter, AutoBridge) -> peft/lora_layers.py line 20 `import transformer_engine.pytorch`,
    a CUDA build that does not install on a machine without the CUDA toolkit. The configuration modules themselves
    (training/config.py, training/utils/omegaconf_utils.py, models/qwen_vl/qwen25_vl_provider.py, models/gpt_provider.py)
    import no transformer_engine: they are loaded here with their package __init__ files not run (load_bridge).
  - The recipe function (recipes/qwen_vl/qwen25_vl.py qwen25_vl_72b_finetune_config) imports AutoBridge and
    recipes/utils/finetune_utils.py -> peft/lora.py line 21 `import transformer_engine.pytorch`, so it is not called:
    the container is built from Bridge's own config classes with the values that recipe sets for full fine-tuning
    (TP 8, PP 4, pipeline_dtype bfloat16, its optimizer helper, DDP and checkpoint settings), and the provider's
    shape is the config's language model as autoplan reads it (AutoBridge's Hugging Face mapping is the part
    replaced).

Megatron-LM MIMO (autoplan/multimodal/emit_mimo.py): the argument list goes through examples/mimo/pretrain_mimo.py
`_parse_and_validate` at commit emit_mimo.MIMO_COMMIT: Megatron-LM's parse_args with the example's argument groups,
validate_hetero_grid_args (examples/mimo/training/args.py), validate_args (megatron/training/arguments.py) on the
language grid, and the example's --use-distributed-optimizer rule; then the language model's TransformerConfig is
built from the arguments (megatron/training/argument_utils.py core_transformer_config_from_args), whose checks
(pipeline split, heads against TP) run when the example builds its model. It runs in a child process with the Megatron-LM
checkout first on sys.path (its megatron/ package would hide the installed megatron-core and megatron.bridge).
  What is supplied and why: that commit's megatron/training needs Python >= 3.12 (`from typing import override`,
  megatron/training/models/hybrid.py line 5); on Python 3.11 typing.override is typing_extensions.override (the same
  marker decorator). validate_args asks the CUDA device for its architecture (arguments.py line 1423,
  get_device_arch_version); the child answers with the planned GPU's compute capability (H100: 9). The launch
  environment the emitted file names (CUDA_DEVICE_MAX_CONNECTIONS=1) is set as a launcher would set it.

Every case below is also run through autoplan's own checks (emit_bridge.check_transformer_config,
emit_mimo.check_mimo); the report shows the two verdicts side by side for layouts the emitters must refuse as well
as ones they write.

Needs: a Python with megatron-bridge 0.3.1, megatron-core 0.16.1, transformers < 5, omegaconf, hydra-core, datasets,
pillow and torch 2.13.0 (see benchmarks/README.md), and a Megatron-LM checkout at MIMO_COMMIT.
Run: python -m benchmarks.vlm_parser_check --megatron-lm DIR [--out FILE]"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "vlm"
BRIDGE_VERSION = "0.3.1"
H100_ARCH = 9  # compute capability major of the planned GPU (profiles/: H100 is sm_90)
# The Bridge packages whose __init__.py would import transformer_engine; their modules are loaded directly.
BARE_PACKAGES = ("megatron.bridge.models", "megatron.bridge.models.qwen_vl", "megatron.bridge.training.utils",
                 "megatron.bridge.recipes.utils", "megatron.bridge.data.vlm_datasets", "megatron.bridge.peft")


class Unavailable(Exception):
    """A parser that cannot be loaded here; the message names the import or the pin."""


def load_bridge() -> types.SimpleNamespace:
    """Bridge's configuration classes and override functions, without running the package __init__ files that
    import its checkpoint converter (and so transformer_engine)."""
    from importlib import metadata

    try:
        version = metadata.version("megatron-bridge")
    except metadata.PackageNotFoundError:
        raise Unavailable(f"megatron-bridge is not installed (pip install --no-deps megatron-bridge=={BRIDGE_VERSION} "
                          f"with transformers<5, omegaconf, hydra-core, datasets, pillow; benchmarks/README.md)")
    if version != BRIDGE_VERSION:
        raise Unavailable(f"megatron-bridge {version} is installed; the emitter writes for {BRIDGE_VERSION}")
    core = metadata.version("megatron-core")
    if not core.startswith("0.16."):
        raise Unavailable(f"megatron-core {core} is installed; megatron-bridge {BRIDGE_VERSION} pins >=0.15,<0.17 "
                          f"and autoplan pins 0.16.1")
    import megatron

    site = Path(next(iter(megatron.__path__)))
    for name in BARE_PACKAGES:
        parts = name.split(".")
        for i in range(2, len(parts) + 1):
            pkg = ".".join(parts[:i])
            if pkg not in sys.modules:
                module = types.ModuleType(pkg)
                module.__path__ = [str(site.joinpath(*parts[1:i]))]
                sys.modules[pkg] = module
    try:
        gpt = importlib.import_module("megatron.bridge.models.gpt_provider")
        t5 = importlib.import_module("megatron.bridge.models.t5_provider")
        # training/config.py reads these two names from the package (models/__init__.py re-exports them).
        sys.modules["megatron.bridge.models"].GPTModelProvider = gpt.GPTModelProvider
        sys.modules["megatron.bridge.models"].T5ModelProvider = t5.T5ModelProvider
        config = importlib.import_module("megatron.bridge.training.config")
        omegaconf_utils = importlib.import_module("megatron.bridge.training.utils.omegaconf_utils")
        optimizer_utils = importlib.import_module("megatron.bridge.recipes.utils.optimizer_utils")
        mock = importlib.import_module("megatron.bridge.data.vlm_datasets.mock_provider")
        qwen25 = importlib.import_module("megatron.bridge.models.qwen_vl.qwen25_vl_provider")
    except ImportError as e:
        raise Unavailable(f"a Megatron-Bridge {BRIDGE_VERSION} configuration module does not import: {e}")
    return types.SimpleNamespace(config=config, omegaconf_utils=omegaconf_utils, optimizer_utils=optimizer_utils,
                                 mock=mock, Qwen25VLModelProvider=qwen25.Qwen25VLModelProvider,
                                 VisionConfig=qwen25.Qwen2_5_VLVisionConfig)


def _container(B, hf: dict, llm, seq: int):
    """A ConfigContainer with the values qwen25_vl_72b_finetune_config sets for full fine-tuning."""
    import torch

    provider = B.Qwen25VLModelProvider(
        num_layers=llm.num_layers, hidden_size=llm.hidden_size, ffn_hidden_size=llm.ffn_hidden_size,
        num_attention_heads=llm.num_attention_heads, num_query_groups=llm.num_query_groups,
        kv_channels=llm.kv_channels, vocab_size=llm.vocab_size, seq_length=seq,
        vision_config=B.VisionConfig(**hf["vision_config"]))
    provider.tensor_model_parallel_size, provider.pipeline_model_parallel_size = 8, 4
    provider.pipeline_dtype = torch.bfloat16
    c = B.config
    opt, sched = B.optimizer_utils.distributed_fused_adam_with_cosine_annealing(
        lr_warmup_iters=500, lr_decay_iters=300000, max_lr=5e-6, min_lr=3e-5)
    return c.ConfigContainer(
        model=provider,
        train=c.TrainingConfig(train_iters=300000, eval_interval=500, eval_iters=32, global_batch_size=32,
                               micro_batch_size=2, manual_gc=True, manual_gc_interval=100, manual_gc_eval=100),
        optimizer=opt, scheduler=sched,
        ddp=c.DistributedDataParallelConfig(check_for_nan_in_grad=True, grad_reduce_in_fp32=True,
                                            overlap_grad_reduce=False, overlap_param_gather=False,
                                            average_in_collective=True,
                                            data_parallel_sharding_strategy="optim_grads_params",
                                            use_distributed_optimizer=True),
        dataset=B.mock.MockVLMConversationProvider(seq_length=seq, hf_processor_path="Qwen/Qwen2.5-VL-72B-Instruct",
                                                   prompt="Describe this image.", num_workers=1),
        logger=c.LoggerConfig(log_interval=10),
        tokenizer=c.TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=llm.vocab_size),
        checkpoint=c.CheckpointConfig(save_interval=500, ckpt_format="torch_dist", fully_parallel_save=True),
        rng=c.RNGConfig(seed=1234), mixed_precision="bf16_mixed")


class _Skipped(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def bridge_verdict(B, hf_config: Path, yaml_text: str, world: int) -> Tuple[bool, str]:
    """(accepted, what Bridge said) for one override file, as finetune_qwen_vl.py applies --config-file."""
    from omegaconf import OmegaConf

    from autoplan.multimodal.reader import load_multimodal

    spec = load_multimodal(str(hf_config))
    hf = json.loads(hf_config.read_text())
    seq = OmegaConf.create(yaml_text)["model"]["seq_length"]
    cfg = _container(B, hf, spec.llm, seq)
    merged, excluded = B.omegaconf_utils.create_omegaconf_dict_config(cfg)
    merged = OmegaConf.merge(merged, OmegaConf.create(yaml_text))
    final = OmegaConf.to_container(merged, resolve=True)
    handler = _Skipped()
    log = logging.getLogger(B.omegaconf_utils.__name__)
    log.addHandler(handler)
    try:
        B.omegaconf_utils.apply_overrides(cfg, final, excluded)
    finally:
        log.removeHandler(handler)
    if handler.messages:
        return False, "apply_overrides: " + "; ".join(handler.messages)
    old = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(world)
    try:
        cfg.validate()
    except (ValueError, AssertionError, TypeError) as e:
        return False, f"ConfigContainer.validate: {type(e).__name__}: {' '.join(str(e).split())}"
    finally:
        if old is None:
            os.environ.pop("WORLD_SIZE")
        else:
            os.environ["WORLD_SIZE"] = old
    m = cfg.model
    # What the model build asks of the split (megatron-core 0.16.1 transformer_block.py get_num_layers_to_build):
    # uneven middle stages or a layer count that does not divide over the stages fail there.
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    try:
        stages = [get_num_layers_to_build(m, pp_rank=r) for r in range(m.pipeline_model_parallel_size)]
    except AssertionError as e:
        return False, f"get_num_layers_to_build: AssertionError: {' '.join(str(e).split())}"
    if sum(stages) != m.num_layers:
        return False, f"get_num_layers_to_build: stages hold {stages}, {sum(stages)} of {m.num_layers} layers"
    return True, (f"accepted: layers per stage {stages}, tp {m.tensor_model_parallel_size} pp {m.pipeline_model_parallel_size} first "
                  f"{m.num_layers_in_first_pipeline_stage} last {m.num_layers_in_last_pipeline_stage} dp "
                  f"{cfg.data_parallel_size} freeze vision {m.freeze_vision_model} pipeline_dtype {m.pipeline_dtype}")


def mimo_verdict(megatron_lm: Path, args: Sequence[str], world: int, env: dict) -> Tuple[bool, str]:
    """(accepted, what the MIMO example said), run in a child process with the checkout first on sys.path."""
    child = {"root": str(megatron_lm), "argv": list(args), "world": world, "arch": H100_ARCH}
    r = subprocess.run([sys.executable, "-m", "benchmarks.vlm_parser_check", "--mimo-child"], input=json.dumps(child),
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=900)
    last = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not last:
        raise Unavailable(f"the MIMO check did not run (exit {r.returncode}): {r.stderr.strip()[-600:]}")
    out = json.loads(last[-1])
    if out.get("unavailable"):
        raise Unavailable(out["unavailable"])
    return out["accepted"], out["detail"]


def _mimo_child() -> None:
    """Child: parse and validate one argument list with examples/mimo/pretrain_mimo.py of the checkout."""
    req = json.loads(sys.stdin.read())
    root = req["root"]
    if not (Path(root) / "examples" / "mimo" / "pretrain_mimo.py").is_file():
        print(json.dumps({"unavailable": f"{root} has no examples/mimo/pretrain_mimo.py (a Megatron-LM checkout at "
                                         f"the emitter's commit is needed)"}))
        return
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    sys.path.insert(0, root)
    os.environ.update(WORLD_SIZE=str(req["world"]), RANK="0", LOCAL_RANK="0")
    try:
        import megatron.training.arguments as arguments
        pretrain_mimo = importlib.import_module("examples.mimo.pretrain_mimo")
    except ImportError as e:
        print(json.dumps({"unavailable": f"examples.mimo.pretrain_mimo does not import from {root}: {e}"}))
        return
    arguments.get_device_arch_version = lambda: req["arch"]
    sys.argv = ["pretrain_mimo.py", *req["argv"]]
    from megatron.training.argument_utils import core_transformer_config_from_args

    try:
        a = pretrain_mimo._parse_and_validate()
        # The language model's TransformerConfig, as the example's providers build theirs
        # (examples/mimo/model_providers/radio_encoder.py line 70): its __post_init__ checks the pipeline split.
        # apply_rope_fusion (on by default) needs transformer_engine's fused RoPE (transformer_config.py line
        # 2430), which is not installed here; it bears on no layout check.
        a.apply_rope_fusion = False
        core_transformer_config_from_args(a)
    except SystemExit as e:
        print(json.dumps({"accepted": False, "detail": f"argparse exit {e.code}"}))
        return
    except (ValueError, AssertionError, TypeError) as e:
        print(json.dumps({"accepted": False, "detail": f"{type(e).__name__}: {' '.join(str(e).split())}"}))
        return
    print(json.dumps({"accepted": True, "detail": (
        f"accepted: encoder tp {a.encoder_tp} dp {a.encoder_dp}, language tp {a.tensor_model_parallel_size} pp "
        f"{a.pipeline_model_parallel_size} dp {a.llm_dp} from rank {a.llm_offset}, first "
        f"{a.decoder_first_pipeline_num_layers} last {a.decoder_last_pipeline_num_layers}")}))


@dataclass(frozen=True)
class BridgeCase:
    name: str
    tp: int
    pp: int
    first: Optional[int]
    last: Optional[int]
    world: int = 64


@dataclass(frozen=True)
class MimoCase:
    name: str
    llm_tp: int
    llm_pp: int
    llm_gpus: int
    encoder_tp: int
    encoder_dp: int
    world: int
    first: Optional[int] = None
    last: Optional[int] = None


# Qwen2.5-VL-72B (80 layers, 64 heads, 8 query groups) on 64 H100: layouts the emitters write and ones they refuse.
BRIDGE_CASES = [
    BridgeCase("stage 0 carries 14 of 80 layers", 8, 4, 14, 20),
    BridgeCase("stage 0 carries 6, last stage 26", 8, 4, 6, 26),
    BridgeCase("even split", 8, 4, None, None),
    BridgeCase("first only", 8, 4, 17, None),
    BridgeCase("middle stages uneven (13 + 20 leaves 47 for 2)", 8, 4, 13, 20),
    BridgeCase("first stage empty", 8, 4, 0, 20),
    BridgeCase("80 layers over 3 stages, no split", 8, 3, None, None, 48),
    BridgeCase("TP 16 over 8 query groups", 16, 4, None, None),
    BridgeCase("TP x PP does not divide 64", 8, 3, 20, 20, 64),
]
MIMO_CASES = [
    MimoCase("encoder tp4 dp2, language tp4 pp5 dp2", 4, 5, 40, 4, 2, 48),
    MimoCase("as `autoplan vlm` picks for 6 images of 1,024 tokens", 8, 7, 56, 8, 1, 64, 10, 10),
    MimoCase("encoder dp 4 does not divide mbs x llm_dp = 2", 4, 5, 40, 2, 4, 48),
    MimoCase("grids leave 16 of 64 ranks idle", 4, 5, 40, 4, 2, 64),
    MimoCase("uneven middle stages (first 9, last 10)", 8, 7, 56, 8, 1, 64, 9, 10),
]


def _strategy(tp, pp, first, last):
    from autoplan.strategy import Strategy

    return Strategy(tp=tp, pp=pp, mbs=1, sp=True, zero=1, recompute="selective", first_stage_layers=first,
                    last_stage_layers=last)


def run_bridge(B, case: BridgeCase, config: Path, seq: int = 8192, gbs: int = 128) -> Tuple[str, bool, str]:
    """(autoplan's verdict, Bridge accepted, Bridge's words). autoplan's verdict is the emitted file or the refusal."""
    from autoplan.errors import InputError
    from autoplan.multimodal.emit_bridge import bridge_overrides, bridge_yaml
    from autoplan.multimodal.placement import Placement
    from autoplan.multimodal.reader import load_multimodal
    from autoplan.multimodal.spec import Freeze

    spec = load_multimodal(str(config))
    placement = Placement("inherit", _strategy(case.tp, case.pp, case.first, case.last), case.world)
    try:
        over = bridge_overrides(spec, placement, Freeze(vision_model=True), seq, gbs)
        ours = "emitted"
    except InputError as e:
        ours = f"refused: {e}"
        # The same layout written by hand, to ask Bridge whether the refusal was right.
        s = placement.llm
        model = {"tensor_model_parallel_size": s.tp, "pipeline_model_parallel_size": s.pp, "seq_length": seq}
        for key, value in (("num_layers_in_first_pipeline_stage", s.first_stage_layers),
                           ("num_layers_in_last_pipeline_stage", s.last_stage_layers)):
            if value is not None:
                model[key] = value
        over = {"model": model, "train": {"micro_batch_size": s.mbs, "global_batch_size": gbs},
                "dataset": {"seq_length": seq}}
    accepted, detail = bridge_verdict(B, config, bridge_yaml(over, []), case.world)
    return ours, accepted, detail


def run_mimo(megatron_lm: Path, case: MimoCase, config: Path, seq: int = 8192,
             gbs: int = 128) -> Tuple[str, bool, str]:
    from autoplan.errors import InputError
    from autoplan.multimodal.emit_mimo import LAUNCH_ENV, arg_list, mimo_args
    from autoplan.multimodal.placement import Placement
    from autoplan.multimodal.reader import load_multimodal

    spec = load_multimodal(str(config))
    placement = Placement("disjoint", _strategy(case.llm_tp, case.llm_pp, case.first, case.last), case.llm_gpus,
                          case.encoder_tp, case.encoder_dp)
    try:
        args = mimo_args(spec, placement, case.world, seq, gbs)
        ours = "emitted"
    except InputError as e:
        ours = f"refused: {e}"
        args = arg_list(spec, placement, case.world, seq, gbs)  # the same arguments, unchecked, for the parser
    accepted, detail = mimo_verdict(megatron_lm, args, case.world, dict(LAUNCH_ENV))
    return ours, accepted, detail



def _verdict(lines, case: str, parser: str, ours: str, accepted: bool, detail: str) -> bool:
    """Append one case's two verdicts to `lines`; whether they disagree (autoplan emitted it and the parser refused,
    or the reverse)."""
    disagree = ours.startswith("emitted") != accepted
    lines += [f"  {case}", f"    autoplan: {ours}", f"    {parser}: {detail}{'   <-- DISAGREE' if disagree else ''}"]
    return disagree

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron-lm", type=Path, help="Megatron-LM checkout at autoplan's MIMO commit")
    ap.add_argument("--out", type=Path, help="also write the report here")
    ap.add_argument("--mimo-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.mimo_child:
        _mimo_child()
        return 0
    from autoplan.multimodal.emit_mimo import MIMO_COMMIT

    config = DATA / "qwen2_5_vl_72b_instruct.json"
    lines = [f"python -m benchmarks.vlm_parser_check --megatron-lm <Megatron-LM@{MIMO_COMMIT[:12]}>",
             f"model: {config.relative_to(ROOT)}"]
    disagree = 0
    try:
        B = load_bridge()
        lines.append(f"Megatron-Bridge {BRIDGE_VERSION} (finetune_qwen_vl.py --config-file path: "
                     f"apply_overrides + ConfigContainer.validate)")
        for case in BRIDGE_CASES:
            disagree += _verdict(lines, f"{case.name} [tp{case.tp} pp{case.pp} first={case.first} "
                                        f"last={case.last} world {case.world}]", "Bridge  ",
                                 *run_bridge(B, case, config))
    except Unavailable as e:
        lines.append(f"Megatron-Bridge {BRIDGE_VERSION}: NOT RUN: {e}")
    if a.megatron_lm is None:
        lines.append("MIMO: NOT RUN: no --megatron-lm checkout given")
    else:
        try:
            lines.append(f"Megatron-LM MIMO at {MIMO_COMMIT} (examples/mimo/pretrain_mimo.py _parse_and_validate)")
            for case in MIMO_CASES:
                disagree += _verdict(lines, f"{case.name} [encoder tp{case.encoder_tp} dp{case.encoder_dp}, "
                                            f"language tp{case.llm_tp} pp{case.llm_pp} on {case.llm_gpus}, "
                                            f"world {case.world}]", "MIMO    ",
                                     *run_mimo(a.megatron_lm, case, config))
        except Unavailable as e:
            lines.append(f"MIMO: NOT RUN: {e}")
    lines.append(f"verdicts that differ from autoplan's: {disagree}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
