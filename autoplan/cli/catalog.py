"""`autoplan models` and `autoplan clusters`: what the catalogue and the GPU profiles hold."""
from __future__ import annotations

import json
from typing import Any, Dict, List

import typer
from rich.table import Table

from autoplan.cli.console import console
from autoplan.cluster import GpuSpec
from autoplan.clusterio import list_gpus
from autoplan.costmodel.params import count_parameters
from autoplan.model import ModelSpec
from autoplan.modelio import list_catalogue

DTYPES = ("bf16", "fp8", "fp4")


def model_row(m: ModelSpec) -> Dict[str, Any]:
    """One catalogue model as a stable JSON object (parameter counts in units, not billions)."""
    total, active = count_parameters(m)
    return {
        "name": m.name,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.num_query_groups,
        "num_experts": m.num_experts,
        "moe_router_topk": m.moe_router_topk,
        "total_params": total,
        "active_params": active,
    }


def gpu_row(g: GpuSpec) -> Dict[str, Any]:
    """One GPU profile as a stable JSON object."""
    return {
        "id": g.id,
        "name": g.name,
        "peak_tflops": {d: g.peak_tflops.get(d) for d in DTYPES},
        "hbm_gib": g.hbm_gib,
        "hbm_bandwidth_tbps": g.hbm_bandwidth_tbps,
        "nvlink_bandwidth_gbytes_per_s": g.nvlink_bandwidth_gbytes_per_s,
        "nvlink_domain_size": g.nvlink_domain_size,
        "gpus_per_node": g.gpus_per_node,
        "nics_per_node": g.nics_per_node,
        "nic_gbit_per_s": g.nic_gbit_per_s,
    }


def _billions(n: int) -> str:
    return f"{n / 1e9:,.2f}"


def _models_table(rows: List[Dict[str, Any]]) -> Table:
    table = Table(title="Model catalogue (parameters in billions)")
    for col in ("name", "layers", "hidden", "heads/kv", "experts E/k", "total B", "active B"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for r in rows:
        experts = f"{r['num_experts']}/{r['moe_router_topk']}" if r["num_experts"] else "-"
        table.add_row(r["name"], str(r["num_layers"]), str(r["hidden_size"]),
                      f"{r['num_attention_heads']}/{r['num_query_groups']}", experts,
                      _billions(r["total_params"]), _billions(r["active_params"]))
    return table


def _gpus_table(rows: List[Dict[str, Any]]) -> Table:
    table = Table(title="GPU profiles (dense TFLOP/s; NVLink GB/s per direction)")
    for col in ("id", "name", "bf16", "fp8", "fp4", "HBM GiB", "HBM TB/s", "NVLink GB/s", "domain", "NICs"):
        table.add_column(col, justify="left" if col in ("id", "name") else "right")
    for r in rows:
        peaks = [f"{r['peak_tflops'][d]:g}" if r["peak_tflops"][d] else "-" for d in DTYPES]
        nics = f"{r['nics_per_node']}x{r['nic_gbit_per_s']:g}G" if r["nics_per_node"] else "-"
        table.add_row(r["id"], r["name"], *peaks, f"{r['hbm_gib']:g}", f"{r['hbm_bandwidth_tbps']:g}",
                      f"{r['nvlink_bandwidth_gbytes_per_s']:g}", str(r["nvlink_domain_size"]), nics)
    return table


def models(as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table.")) -> None:
    """List the model catalogue: shapes, experts and parameter counts."""
    rows = [model_row(m) for m in list_catalogue()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        console(width=160).print(_models_table(rows))


def clusters(as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table.")) -> None:
    """List the GPU profiles: peaks, memory, links and NICs."""
    rows = [gpu_row(g) for g in list_gpus()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        console(width=160).print(_gpus_table(rows))


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("clusters")(clusters)
