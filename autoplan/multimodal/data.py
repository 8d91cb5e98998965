"""The image distribution from flags (`mean=1,p95=4`) or a histogram file (CSV rows: images per sample, tokens
per image, count)."""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Optional, Tuple

from autoplan.errors import InputError
from autoplan.multimodal.spec import ImageData, ImageLoad


def _mean_tail(text: str, flag: str) -> Tuple[float, float, float]:
    m = re.fullmatch(r"\s*mean=([0-9.]+)\s*,\s*p([0-9.]+)=([0-9.]+)\s*", text or "")
    if not m:
        example = "mean=2,p95=6" if flag == "--images-per-sample" else "mean=1024,p95=4096"
        raise InputError(f"{flag} {text!r} must read mean=M,pNN=T (e.g. {flag} {example})")
    mean, pct, tail = float(m.group(1)), float(m.group(2)), float(m.group(3))
    if not 0 < pct < 100 or tail < mean:
        raise InputError(f"{flag} {text!r}: the percentile must lie in (0, 100) and the tail be >= the mean")
    return mean, pct, tail


def from_flags(images: str, tokens: str) -> ImageData:
    im, pct_i, it = _mean_tail(images, "--images-per-sample")
    tm, pct_t, tt = _mean_tail(tokens, "--tokens-per-image")
    if pct_i != pct_t:
        raise InputError(f"--images-per-sample and --tokens-per-image must name the same percentile (got p{pct_i:g} "
                         f"and p{pct_t:g})")
    return ImageData(mean=ImageLoad(images_per_sample=im, tokens_per_image=tm),
                     tail=ImageLoad(images_per_sample=it, tokens_per_image=tt), tail_percentile=pct_i,
                     source=f"--images-per-sample {images} --tokens-per-image {tokens}")


def from_histogram(path: str, percentile: float) -> ImageData:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--image-hist {path!r}: no such file; pass a CSV of images,tokens_per_image,count rows")
    rows = []
    for n, row in enumerate(csv.reader(io.StringIO(p.read_text())), 1):
        if not row or row[0].strip().startswith("#") or not re.match(r"\s*[0-9.]", row[0]):
            continue
        try:
            images, tokens, count = (float(x) for x in row[:3])
        except ValueError:
            raise InputError(f"--image-hist {path} line {n}: {row!r} must be three numbers: images,tokens,count") \
                from None
        if min(images, tokens, count) < 0:
            raise InputError(f"--image-hist {path} line {n}: negative value in {row!r}")
        rows.append((images, tokens, count))
    total = sum(r[2] for r in rows)
    if not rows or total <= 0:
        raise InputError(f"--image-hist {path}: no rows with a positive count")
    images = sum(r[0] * r[2] for r in rows) / total
    tokens = sum(r[0] * r[1] * r[2] for r in rows) / max(sum(r[0] * r[2] for r in rows), 1e-12)
    ordered = sorted(rows, key=lambda r: r[0] * r[1])
    acc, tail = 0.0, ordered[-1]
    for r in ordered:
        acc += r[2]
        if acc >= percentile / 100.0 * total:
            tail = r
            break
    return ImageData(mean=ImageLoad(images_per_sample=images, tokens_per_image=tokens),
                     tail=ImageLoad(images_per_sample=tail[0], tokens_per_image=tail[1]), tail_percentile=percentile,
                     source=f"--image-hist {path}", histogram=tuple(rows))


def image_data(images: Optional[str], tokens: Optional[str], hist: Optional[str], percentile: float) -> ImageData:
    if hist:
        if images or tokens:
            raise InputError("--image-hist replaces --images-per-sample/--tokens-per-image; pass one or the other")
        return from_histogram(hist, percentile)
    if not (images and tokens):
        raise InputError("pass --images-per-sample mean=M,pNN=T and --tokens-per-image mean=M,pNN=T (or "
                         "--image-hist FILE)")
    return from_flags(images, tokens)
