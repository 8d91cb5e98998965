"""DistTrain's 72B multimodal LLM figure priced by `autoplan vlm`'s placement search.

Published (Zhang et al., "DistTrain: Addressing Model and Data Heterogeneity with Disaggregated Training for
Multimodal Large Language Models", SIGCOMM '25, arXiv:2408.04275, abstract): 54.7% MFU training a 72B multimodal
LLM on 1,172 GPUs, with the modality encoder, the LLM backbone and the generator on separately sized grids.

Inputs taken from the paper: the GPU count (1,172), the MFU (54.7%), a disaggregated encoder (autoplan's disjoint
placement), a ~72B model. Inputs ASSUMED here because the parts of the paper that state them could not be read
from this repository's sources (each is a named constant below):
- the model: a ViT-H/14 encoder at 224 px (OpenCLIP ViT-Huge: width 1280, 32 layers, MLP 5120) in front of a
  Llama-3-70B backbone (benchmarks/models/disttrain_mllm72b.json, 71.4B in all); the image generator is not priced
  (autoplan has no generator model), so its FLOPs are in neither the prediction nor our MFU;
- the GPU: H800 (Hopper, 989 TFLOP/s dense bf16, as autoplan's h800 profile);
- the data: 8,192-token sequences, a global batch of 1,152 samples, 4 images per sample on average (8 at the
  95th percentile), 256 tokens per image (ViT-H/14 at 224 px: 16 x 16 patches, one token each);
- everything trains (no frozen part);
- the generator's grid: the 20 GPUs past 144 whole nodes (1,172 = 1,152 + 20); the encoder and the backbone are
  planned on the other 1,152, and MFU is taken over those 1,152 GPUs and the FLOPs they run.
MFU here = (language-model training FLOPs as Megatron counts them + encoder and projector training FLOPs, 3x
their forward) per step / (step time x GPUs x bf16 peak), the paper's definition over the priced components.

Run: python -m benchmarks.disttrain_mllm"""
from __future__ import annotations

from pathlib import Path

from autoplan.clusterio import load_cluster
from autoplan.costmodel.flops import model_flops_per_token
from autoplan.multimodal.encoder_cost import image_flops
from autoplan.multimodal.params import param_split
from autoplan.multimodal.reader import load_multimodal
from autoplan.multimodal.search import best_of, search
from autoplan.multimodal.spec import Freeze, ImageData, ImageLoad
from autoplan.workload import Workload

PUBLISHED_MFU = 0.547
GPUS = 1172
PRICED_GPUS = 1152  # assumed: the rest is the (unpriced) generator's grid
GPU = "h800"  # assumed
SEQ, GBS = 8192, 1152  # assumed
IMAGES_MEAN, IMAGES_P95, TOKENS_PER_IMAGE = 4.0, 8.0, 256.0  # assumed
MODEL = Path(__file__).parent / "models" / "disttrain_mllm72b.json"


def main() -> None:
    spec = load_multimodal(str(MODEL))
    cluster = load_cluster(GPU, PRICED_GPUS)
    wl = Workload(seq_len=SEQ, global_batch_size=GBS)
    data = ImageData(mean=ImageLoad(images_per_sample=IMAGES_MEAN, tokens_per_image=TOKENS_PER_IMAGE),
                     tail=ImageLoad(images_per_sample=IMAGES_P95, tokens_per_image=TOKENS_PER_IMAGE),
                     tail_percentile=95)
    best = best_of(search(spec, cluster, wl, data, Freeze(), kinds=("disjoint",)), "disjoint")
    split = param_split(spec)
    enc = image_flops(spec, TOKENS_PER_IMAGE)
    flops = model_flops_per_token(spec.llm, SEQ) * SEQ * GBS + 3 * (enc.gemm + enc.attention) * IMAGES_MEAN * GBS
    mfu = flops / (best.step_s * PRICED_GPUS * cluster.gpu.peak_tflops["bf16"] * 1e12)
    print(f"model: vision {split.vision / 1e6:.0f}M + projector {split.projector / 1e6:.0f}M + language "
          f"{split.language / 1e9:.2f}B = {split.total / 1e9:.2f}B")
    print(f"best disjoint plan on {PRICED_GPUS} of {GPUS} {GPU}: {best.placement.label()}")
    print(f"step {best.step_s:.2f} s (p95 load {best.tail_step_s:.2f} s), peak {best.peak_mem_gib:.1f} GiB")
    print(f"predicted MFU {mfu:.1%} vs published {PUBLISHED_MFU:.1%}: error {mfu / PUBLISHED_MFU - 1:+.1%} "
          f"({(mfu - PUBLISHED_MFU) * 100:+.1f} points)")


if __name__ == "__main__":
    main()
