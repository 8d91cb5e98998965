"""--profile on estimate and plan: one check that the profile fits the model and GPU, `sources` says measured only
where a measured point priced the strategy, and the file `autoplan profile-comm` writes is taken by --profile and
by --cluster as it is."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from autoplan.cli.main import main
from autoplan.clusterio import load_cluster
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.measured import find_profile, resolve_profiles
from autoplan.errors import InputError
from autoplan.profiler.comm import CommPoint, CommProfile, fit_points, gpu_overrides, write_comm_profile
from autoplan.strategy import Strategy
from autoplan.workload import Workload

SHIPPED = "profiles/measured/cpu-tiny-llama.json"


@pytest.fixture(scope="module")
def tiny():
    profile = find_profile("cpu", "tiny-llama")
    assert profile is not None
    return profile


@pytest.fixture
def tiny_yaml(tiny, tmp_path):
    path = tmp_path / "tiny-llama.yaml"
    path.write_text(yaml.safe_dump(tiny.model.model_dump()))
    return str(path)


def comm_profile(tmp_path, device_name="NVIDIA H100 80GB HBM3", alpha_us=20.0, busbw=300.0, n=8):
    """What `autoplan profile-comm` writes for an all-reduce following t = alpha + bus_bytes / busbw exactly."""
    points = []
    for size in (2 ** k for k in range(10, 31, 4)):
        t = alpha_us * 1e-6 + size * 2 * (n - 1) / n / (busbw * 1e9)
        points.append(CommPoint(op="all_reduce", size_bytes=size, median_s=t, min_s=t, max_s=t, raw_s=(t,),
                                algbw_gbytes_per_s=size / t / 1e9, busbw_gbytes_per_s=size * 2 * (n - 1) / n / t / 1e9))
    fits = fit_points(points, n)
    notes: list = []
    profile = CommProfile(created="2026-01-01T00:00:00+00:00", backend="nccl", device_name=device_name,
                          torch_version="2.13.0", world_size=n, local_world_size=n, level="nvlink",
                          points=tuple(points), fits=tuple(fits),
                          gpu_overrides=gpu_overrides(fits, "nvlink", None, notes), notes=tuple(notes))
    path = tmp_path / "comm.json"
    write_comm_profile(profile, path)
    return str(path)


def run(capsys, *argv):
    """(exit code, stdout, stderr) of the CLI in this process."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------- one check for estimate and plan

@pytest.mark.parametrize("args, message", [
    (["--model", "llama3-8b", "--cluster", "cpu", "--gpus", "2"], "was measured for tiny-llama with hidden_size=256"),
    (["--cluster", "h100", "--gpus", "8"], "was measured on cpu, but the cluster uses h100"),
])
def test_plan_and_estimate_refuse_a_profile_of_another_model_or_gpu(args, message, tiny_yaml, capsys):
    if "--model" not in args:
        args = ["--model", tiny_yaml, *args]
    common = [*args, "--seq", "256", "--gbs", "8", "--profile", SHIPPED]
    errors = []
    for command in (["estimate", *common, "--strategy", "tp=1,mbs=1"], ["plan", *common, "--json"]):
        code, _, err = run(capsys, *command)
        assert code == 2 and message in err and err.count("\n") == 1
        errors.append(err)
    assert errors[0] == errors[1]


# ---------------------------------------------------------------- sources

def test_sources_say_measured_only_where_a_point_was_used(tiny):
    cluster = load_cluster("cpu", num_gpus=2)
    inside = estimate(tiny.model, cluster, Strategy(tp=2, mbs=2), Workload(seq_len=256, global_batch_size=4),
                      profile=tiny)
    assert inside.sources["compute"] == f"measured:{SHIPPED}"
    far = estimate(tiny.model, cluster, Strategy(tp=2, mbs=1), Workload(seq_len=4096, global_batch_size=2),
                   profile=tiny)  # 16x the longest measured sequence: no point covers it
    assert far.sources["compute"] == "analytic" and set(far.sources.values()) == {"analytic"}
    recompute = estimate(tiny.model, cluster, Strategy(tp=2, mbs=2, recompute="full"),
                         Workload(seq_len=256, global_batch_size=4), profile=tiny)
    assert recompute.sources["recompute"] == recompute.sources["compute"] == f"measured:{SHIPPED}"


def test_plan_sources_follow_the_same_rule(tiny, tiny_yaml, capsys):
    """Measured exactly where the profile changed the compute time of the plan's strategy."""
    code, out, err = run(capsys, "plan", "--model", tiny_yaml, "--cluster", "cpu", "--gpus", "2", "--seq", "256",
                         "--gbs", "8", "--profile", SHIPPED, "--top", "20", "--json")
    assert code == 0, err
    cluster, workload = load_cluster("cpu", num_gpus=2), Workload(seq_len=256, global_batch_size=8)
    kinds = set()
    for plan in json.loads(out)["plans"]:
        strategy = Strategy(**{k: v for k, v in plan["strategy"].items() if k != "dp"})
        analytic = estimate(tiny.model, cluster, strategy, workload).time_breakdown["compute"]
        changed = plan["estimate"]["time_breakdown"]["compute"] != pytest.approx(analytic, rel=1e-9)
        source = plan["estimate"]["sources"]["compute"]
        assert source == (f"measured:{SHIPPED}" if changed else "analytic"), (strategy.label(), source)
        kinds.add(source)
    assert f"measured:{SHIPPED}" in kinds


# ---------------------------------------------------------------- profile-comm output

def test_comm_profile_is_taken_by_profile_and_changes_the_links(tmp_path, tiny):
    path = comm_profile(tmp_path, alpha_us=40.0, busbw=100.0)
    cluster = load_cluster("h100", 16)
    resolved = resolve_profiles(path, tiny.model, cluster)
    gpu = resolved.cluster.gpu
    assert resolved.layers is None and gpu.nvlink_bandwidth_gbytes_per_s == pytest.approx(100.0, rel=1e-6)
    assert gpu.nvlink_latency_us == pytest.approx(40.0 / 14, rel=1e-6)  # alpha over 2(n-1) ring steps
    assert any(path in n for n in resolved.notes)


@pytest.mark.slow
def test_comm_profile_in_estimate_plan_and_cluster(tmp_path, capsys):
    path = comm_profile(tmp_path, alpha_us=40.0, busbw=20.0)  # a slow link: TP communication grows
    base = ["--model", "llama3-8b", "--gpus", "8", "--seq", "4096", "--gbs", "16", "--strategy",
            "tp=8,pp=1,mbs=1,sp=true,zero=1,recompute=none,fp8=none,cp=1,vpp=1"]
    _, plain, _ = run(capsys, "estimate", *base, "--cluster", "h100", "--json")
    code, slow, err = run(capsys, "estimate", *base, "--cluster", "h100", "--profile", path, "--json")
    assert code == 0, err
    plain, slow = json.loads(plain), json.loads(slow)
    assert slow["time_breakdown"]["tp_comm"] > 2 * plain["time_breakdown"]["tp_comm"]
    assert any("comm profile" in n for n in slow["notes"])
    code, direct, err = run(capsys, "estimate", *base, "--cluster", path, "--json")
    assert code == 0, err
    assert json.loads(direct)["time_breakdown"] == slow["time_breakdown"]
    code, out, err = run(capsys, "plan", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "8", "--seq", "4096",
                         "--gbs", "16", "--profile", path, "--json", "--top", "1")
    assert code == 0, err
    assert json.loads(out)["plans"]


def test_comm_profile_of_another_gpu_is_refused(tmp_path, tiny):
    path = comm_profile(tmp_path, device_name="NVIDIA A100-SXM4-80GB")
    with pytest.raises(InputError, match="measured on 'NVIDIA A100-SXM4-80GB', but the cluster uses h100"):
        resolve_profiles(path, tiny.model, load_cluster("h100", 8))
    assert load_cluster(path, 8).gpu.id == "a100-80g"


def test_cluster_yaml_can_name_a_comm_profile(tmp_path):
    comm = comm_profile(tmp_path, busbw=123.0)
    (tmp_path / "c.yaml").write_text("gpu: h100\nnum_gpus: 16\ncomm_profile: comm.json\n")
    cluster = load_cluster(str(tmp_path / "c.yaml"))
    assert cluster.num_gpus == 16 and cluster.gpu.nvlink_bandwidth_gbytes_per_s == pytest.approx(123.0, rel=1e-6)
    assert load_cluster(comm, 16).gpu == cluster.gpu


@pytest.mark.parametrize("device, match", [("Tesla V100-SXM2-32GB", "matches no bundled GPU"),
                                           ("NVIDIA GB200", None), ("NVIDIA B200", None)])
def test_device_names_map_to_one_gpu(device, match, tmp_path):
    path = comm_profile(tmp_path, device_name=device)
    if match:
        with pytest.raises(InputError, match=match):
            load_cluster(path)
    else:
        assert load_cluster(path).gpu.id == device.split()[-1].lower()


def test_unused_layer_points_are_not_reported_as_measured(tiny):
    """measured_compute is the per-candidate form of the rule (what plan uses for every plan)."""
    from autoplan.costmodel.layout import layouts_from_strategies
    from autoplan.costmodel.measured import measured_compute

    lay = layouts_from_strategies([Strategy(tp=1, mbs=1), Strategy(tp=2, mbs=2), Strategy(tp=2, mbs=64)], 2)
    assert measured_compute(tiny, tiny.model, lay, 256).tolist() == [True, True, False]
    assert not measured_compute(tiny, tiny.model, lay, 100000).any()
    assert np.asarray(lay.fp8).dtype == bool
