"""GPU profiles and cluster inputs: every profile loads and is consistent with the reference table, ids and files
resolve, node rules hold, and every bad input is a one-line InputError."""
from __future__ import annotations

import os

import pytest

from autoplan.clusterio import gpu_ids, list_gpus, load_cluster, load_gpu
from autoplan.errors import InputError

REQUIRED_IDS = {"a100-40g", "a100-80g", "h100", "h800", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "cpu"}


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


def test_every_required_profile_exists_and_loads():
    assert REQUIRED_IDS <= set(gpu_ids())
    assert {g.id for g in list_gpus()} == set(gpu_ids())


@pytest.mark.parametrize("gpu", sorted(REQUIRED_IDS - {"cpu"}))
def test_profile_sanity(gpu):
    g = load_gpu(gpu)
    assert g.id == gpu and g.source
    assert set(g.gemm_efficiency) == set(g.peak_tflops)  # an efficiency for every dtype with a peak
    assert all(0.3 < e < 1.0 for e in g.gemm_efficiency.values())
    assert g.nvlink_domain_size % g.gpus_per_node == 0
    # Low precision doubles the dense rate on every part listed (B300/GB300 FP4 more than doubles).
    if "fp8" in g.peak_tflops:
        assert g.peak_tflops["fp8"] == pytest.approx(2 * g.peak_tflops["bf16"], rel=1e-3)
    if "fp4" in g.peak_tflops:
        assert g.peak_tflops["fp4"] >= 2 * g.peak_tflops["fp8"]


def test_figures_against_reference_rows():
    # profiles/gpu_reference.md sec. 1 and 2: a few rows spelled out.
    h100 = load_gpu("h100")
    assert (h100.peak_tflops["bf16"], h100.hbm_bandwidth_tbps, h100.nvlink_bandwidth_gbytes_per_s) == (989, 3.35, 450)
    assert h100.network_bandwidth_gbytes_per_s == 50.0  # 8x 400 Gb/s NICs for 8 GPUs
    assert load_gpu("h800").nvlink_bandwidth_gbytes_per_s == 200
    assert load_gpu("a100-40g").network_bandwidth_gbytes_per_s == 25.0
    gb200 = load_gpu("gb200")
    assert (gb200.nvlink_domain_size, gb200.gpus_per_node) == (72, 4)
    assert load_gpu("b200").hbm_bandwidth_tbps == 7.7  # N4
    assert "fp8" not in load_gpu("a100-80g").peak_tflops


def test_gpu_id_is_case_insensitive():
    assert load_gpu("H100").id == "h100"


def test_unknown_gpu_suggests_and_lists():
    with pytest.raises(InputError) as e:
        load_gpu("h1000")
    message = one_line_error(e)
    assert "did you mean 'h100'" in message and "mi300x" in message


def test_cluster_from_id_defaults_to_one_node():
    c = load_cluster("h100", None)
    assert (c.num_gpus, c.num_nodes) == (8, 1)
    assert load_cluster("h100", 4).num_gpus == 4  # part of a node is fine
    assert load_cluster("gb200", 72).num_nodes == 18


def test_counts_that_do_not_fill_whole_nodes():
    c = load_cluster("a100-80g", 252)  # 31 full nodes and one with 4 GPUs
    assert (c.num_gpus, c.num_nodes, c.partial_node_gpus) == (252, 32, 4)
    assert load_cluster("gb200", 6).partial_node_gpus == 2
    assert load_cluster("h100", 16).partial_node_gpus == 0


@pytest.mark.parametrize("ref, gpus, expect", [
    ("h100", 0, "gpus=0 must be > 0"),
    ("h100", -8, "gpus=-8 must be > 0"),
])
def test_bad_gpu_counts(ref, gpus, expect):
    with pytest.raises(InputError) as e:
        load_cluster(ref, gpus)
    assert one_line_error(e) == expect


def test_cluster_yaml_with_id_and_override(tmp_path):
    path = tmp_path / "mycluster.yaml"
    path.write_text("gpu: h200\nnum_gpus: 64\n")
    c = load_cluster(str(path), None)
    assert (c.gpu.id, c.num_gpus, c.name) == ("h200", 64, "mycluster")
    assert load_cluster(str(path), 16).num_gpus == 16  # --gpus overrides the file


def test_cluster_yaml_with_full_gpu_mapping(tmp_path):
    gpu = load_gpu("h100").model_dump()
    gpu.update(id="h100-custom", hbm_gib=64.0)
    path = tmp_path / "custom.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"gpu": gpu, "num_gpus": 16, "name": "lab"}))
    c = load_cluster(str(path), None)
    assert (c.gpu.id, c.gpu.hbm_gib, c.num_gpus, c.name) == ("h100-custom", 64.0, 16, "lab")


@pytest.mark.parametrize("content, expect", [
    (None, "does not exist"),
    ("gpu: [h100\n", "not valid YAML"),
    ("- h100\n", "not a mapping"),
    ("num_gpus: 8\n", "has no `gpu:`"),
    ("gpu: h100\nnum_gpu: 8\n", "did you mean 'num_gpus'"),
    ("gpu: h1000\n", "did you mean 'h100'"),
    ("gpu: 5\n", "must be a GPU id or a mapping"),
    ("gpu: h100\nnum_gpus: eight\n", "gpus='eight' must be a whole number"),
    ("gpu: {id: x, name: y}\n", "missing required field(s)"),
    ("gpu: {id: x, name: y, peak_tflop: {}}\n", "did you mean 'peak_tflops'"),
])
def test_bad_cluster_files(tmp_path, content, expect):
    path = tmp_path / "cluster.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as e:
        load_cluster(str(path), None)
    assert expect in one_line_error(e)


def test_cluster_directory_is_rejected(tmp_path):
    with pytest.raises(InputError) as e:
        load_cluster(str(tmp_path) + "/", None)
    assert "is a directory" in one_line_error(e)


def test_cpu_devices_fill_one_node_up_to_core_count():
    cores = os.cpu_count() or 1
    c = load_cluster("cpu", cores)
    assert (c.num_gpus, c.num_nodes, c.gpu.gpus_per_node, c.gpu.nvlink_domain_size) == (cores, 1, cores, cores)
    assert load_cluster("cpu", 1).num_nodes == 1
    assert load_cluster("cpu", None).num_gpus == min(8, cores)
    with pytest.raises(InputError) as e:
        load_cluster("cpu", cores + 1)
    assert f"exceeds the {cores} CPU cores" in one_line_error(e)


def test_profiles_read_through_package_resources():
    from importlib import resources

    files = {p.name for p in (resources.files("autoplan.profiles") / "gpus").iterdir()}
    assert {f"{i}.yaml" for i in REQUIRED_IDS} <= files
