"""MeasuredProfile lookup, interpolation and loading (no torch needed)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from autoplan.costmodel.measured import find_profile, load_profile, save_profile, shipped_profiles
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.profiler import interpolate
from autoplan.profiler.schema import DeviceInfo, GemmTiming, LayerTiming, MeasuredProfile

MODEL = ModelSpec(name="synthetic", num_layers=4, hidden_size=256, ffn_hidden_size=512, num_attention_heads=8,
                  num_query_groups=8, kv_channels=32, vocab_size=1000, max_position_embeddings=8192)


def power_law(tp, mbs, seq, ep=1):
    """A cost that is a product of powers, which log-log interpolation reproduces exactly."""
    return 1e-3 * mbs * (seq / 1024) ** 1.5 / tp ** 0.9 * ep ** 0.2


def entry(kind, pass_, tp, mbs, seq, t, ep=1, dtype="bf16"):
    return LayerTiming(kind=kind, pass_=pass_, tp=tp, ep=ep, mbs=mbs, seq=seq, dtype=dtype, median_s=t, min_s=t,
                       max_s=t, repeats=1, raw_s=(t,), activation_bytes=10, weight_bytes=20)


def synthetic_profile(tps=(1, 2, 4, 8), mbss=(1, 2, 4), seqs=(1024, 2048, 4096), law=power_law) -> MeasuredProfile:
    layers = [entry(kind, pass_, tp, mbs, seq, law(tp, mbs, seq) * (2 if pass_ == "bwd" else 1))
              for kind in ("attention", "mlp") for pass_ in ("fwd", "bwd")
              for tp in tps for mbs in mbss for seq in seqs]
    layers += [entry("moe", "fwd", 1, mbs, seq, law(1, mbs, seq, ep), ep=ep)
               for ep in (1, 2, 8) for mbs in mbss for seq in seqs]
    gemms = [GemmTiming(m=m, n=1024, k=256, dtype="bf16", median_s=1.0, tflops=float(m) / 1000, repeats=1,
                        raw_s=(1.0,), source="test") for m in (1024, 4096)]
    device = DeviceInfo(kind="cpu", name="test", gpu_id="cpu", torch_version="0", cpu_threads=1)
    return MeasuredProfile(created="2025-01-01T00:00:00+00:00", device=device, model=MODEL, warmup=0,
                           layers=tuple(layers), gemms=tuple(gemms))


def test_measured_points_are_returned_exactly():
    p = synthetic_profile()
    got = p.layer_time("attention", "bwd", np.array([2]), np.array([4]), np.array([2048]), "bf16")
    assert got[0] == pytest.approx(2 * power_law(2, 4, 2048), rel=1e-12)


def test_interior_points_follow_power_laws_in_log_log():
    p = synthetic_profile(tps=(1, 4), mbss=(1, 4), seqs=(1024, 4096))
    tp, mbs, seq = np.array([2, 1, 4, 2]), np.array([2, 3, 1, 2]), np.array([2048, 1500, 3000, 4096])
    got = p.layer_time("mlp", "fwd", tp, mbs, seq, "bf16")
    np.testing.assert_allclose(got, power_law(tp, mbs, seq), rtol=1e-9)


def test_ep_axis_is_used_only_for_moe():
    p = synthetic_profile()
    moe = p.layer_time("moe", "fwd", np.array([1]), np.array([2]), np.array([2048]), "bf16", ep=np.array([4]))
    assert moe[0] == pytest.approx(power_law(1, 2, 2048, 4), rel=1e-9)
    attn = p.layer_time("attention", "fwd", np.array([1]), np.array([2]), np.array([2048]), "bf16",
                        ep=np.array([4]))
    assert attn[0] == pytest.approx(power_law(1, 2, 2048), rel=1e-9)


def test_extrapolation_is_limited_to_a_factor_of_two():
    p = synthetic_profile()
    seq = np.array([8192, 8193, 512, 511])
    got = p.layer_time("attention", "fwd", np.ones(4), np.ones(4), seq, "bf16")
    np.testing.assert_allclose(got[[0, 2]], power_law(1, 1, seq[[0, 2]]), rtol=1e-9)
    assert np.isnan(got[1]) and np.isnan(got[3])


def test_unmeasured_kind_dtype_or_single_point_axis_is_nan():
    p = synthetic_profile(tps=(2,))
    ones = np.ones(1)
    assert np.isnan(p.layer_time("head", "fwd", ones, ones, ones * 1024, "bf16")).all()
    assert np.isnan(p.layer_time("mlp", "fwd", ones * 2, ones, ones * 1024, "fp8")).all()
    assert np.isnan(p.layer_time("mlp", "fwd", ones * 4, ones, ones * 1024, "bf16")).all()  # only tp=2 measured
    assert np.isfinite(p.layer_time("mlp", "fwd", ones * 2, ones, ones * 1024, "bf16")).all()


def test_lookup_broadcasts_and_keeps_shape():
    p = synthetic_profile()
    tp = np.array([[1], [2], [4]])
    mbs = np.array([1, 2])
    got = p.layer_time("attention", "fwd", tp, mbs, np.array(2048), "bf16")
    assert got.shape == (3, 2)
    np.testing.assert_allclose(got, power_law(tp, mbs, 2048), rtol=1e-9)


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic_profile().layer_time("norm", "fwd", np.ones(1), np.ones(1), np.ones(1), "bf16")


def test_loglog_uses_end_slope_outside_and_nan_for_empty():
    assert interpolate.loglog([1, 2], [1, 4], 4) == pytest.approx(16)
    assert math.isnan(interpolate.loglog([], [], 1))
    assert math.isnan(interpolate.loglog([2], [1], 3))


def test_gemm_lookup_interpolates_near_shapes_only():
    p = synthetic_profile()
    got = p.gemm_tflops(np.array([1024, 2048, 16384]), 1024, 256, "bf16")
    assert got[0] == pytest.approx(1.024)
    assert 1.024 < got[1] < 4.096
    assert np.isnan(got[2])


def test_round_trip_through_json(tmp_path):
    p = synthetic_profile()
    path = save_profile(p, tmp_path / "p.json")
    assert '"pass": "fwd"' in path.read_text()
    loaded = load_profile(path)
    assert loaded.model_dump() == p.model_dump()
    assert loaded.path == str(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema_version=99), "schema_version=99"),
    (lambda d: d["layers"][0].update({"pass": "sideways"}), "layers.0.pass"),
    (lambda d: d.update(extra_field=1), "does not match the profile schema"),
])
def test_bad_files_raise_one_line_input_errors(tmp_path, mutate, message):
    data = json.loads(synthetic_profile().model_dump_json(by_alias=True))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=message) as info:
        load_profile(path)
    assert "\n" not in str(info.value)


def test_missing_and_non_json_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_profile(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_profile(tmp_path / "x.json")


def test_shipped_profiles_load_and_are_found_by_gpu_and_model():
    shipped = list(shipped_profiles())
    assert shipped, "profiles/measured/ ships at least one profile"
    name, profile = shipped[0]
    found = find_profile(profile.device.gpu_id.upper(), profile.model.name)
    assert found is not None and found.model_dump() == profile.model_dump()
    assert found.path == f"profiles/measured/{name}"
    assert find_profile("no-such-gpu", profile.model.name) is None


def test_copies_with_new_layers_do_not_reuse_the_lookup_cache():
    p = synthetic_profile()
    args = ("mlp", "fwd", np.array([2]), np.array([2]), np.array([2048]), "bf16")
    before = p.layer_time(*args)[0]
    doubled = tuple(e.model_copy(update=dict(median_s=2 * e.median_s)) for e in p.layers)
    q = p.model_copy(update=dict(layers=doubled))
    assert q.layer_time(*args)[0] == pytest.approx(2 * before)
    assert p.layer_time(*args)[0] == before


def test_a_profile_of_other_shapes_or_another_gpu_is_rejected(tmp_path):
    path = save_profile(synthetic_profile(), tmp_path / "p.json")
    assert load_profile(path, model=MODEL.model_copy(update=dict(name="renamed", num_layers=80)), gpu_id="CPU")
    wider = MODEL.model_copy(update=dict(hidden_size=512))
    with pytest.raises(InputError, match="hidden_size=256, but synthetic has hidden_size=512"):
        load_profile(path, model=wider)
    with pytest.raises(InputError, match="measured on cpu, but the cluster uses h100"):
        load_profile(path, gpu_id="h100")
