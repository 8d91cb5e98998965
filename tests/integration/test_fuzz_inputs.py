"""Fuzzed Hugging Face configs and --strategy strings through the command line (in this process): every call exits
0, 1 or 2, prints no traceback and answers within a bound derived from a measured baseline call on this machine.
Derandomized, so the same examples run every time."""
import contextlib
import io
import json
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from autoplan.cli.main import main
from autoplan.strategy import ALL_KEYS
from conftest import call_within, deadline_s, startup_s

# Public Hugging Face configs, trimmed to the fields that matter (meta-llama/Meta-Llama-3-8B,
# mistralai/Mixtral-8x7B-v0.1, deepseek-ai/DeepSeek-V3 with fewer layers, openai-community/gpt2).
BASES = {
    "llama": {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 8192, "tie_word_embeddings": False, "hidden_act": "silu",
              "rope_theta": 500000.0},
    "mixtral": {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "deepseek_v3": {"model_type": "deepseek_v3", "num_hidden_layers": 16, "hidden_size": 7168,
                    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
                    "max_position_embeddings": 163840, "tie_word_embeddings": False},
    "gpt2": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
             "n_positions": 1024, "activation_function": "gelu_new", "tie_word_embeddings": True},
}
GPUS = (1, 8, 16)
SEQ, GBS = 1024, 64

# Values a broken or hand-edited config holds: zero, negative, huge (past int64, past float), non-finite, wrong kinds.
ODD = [0, -1, 1, 3, 10**12, 2**63, 10**400, 0.5, 1e308, float("nan"), float("inf"), "x", "", None, True, [], {},
       [1, 2], {"rope_type": "yarn", "factor": "x"}]
EXTRA_KEYS = ["head_dim", "sliding_window", "rope_scaling", "layer_types", "partial_rotary_factor", "attention_bias",
              "mlp_bias", "n_shared_experts", "num_nextn_predict_layers", "mlp_only_layers", "decoder_sparse_step"]
MODEL_TYPES = ["llama", "mixtral", "qwen2", "qwen3", "qwen2_moe", "deepseek_v3", "gpt2", "gpt_neox", "gemma2",
               "phi3", "gpt_oss", "glm4", "bert", "mamba", ""]


@st.composite
def configs(draw):
    base = draw(st.sampled_from(sorted(BASES)))
    cfg = dict(BASES[base])
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(cfg) + EXTRA_KEYS))
        how = draw(st.sampled_from(["odd", "scale", "drop", "type"]))
        if how == "drop":
            cfg.pop(key, None)
        elif how == "type":
            cfg["model_type"] = draw(st.sampled_from(MODEL_TYPES))
        elif how == "scale" and isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            cfg[key] = cfg[key] * draw(st.sampled_from([2, 3, 7, 10**6])) + draw(st.sampled_from([0, 1]))
        else:
            cfg[key] = draw(st.sampled_from(ODD))
    return base, cfg


VALUES = ["1", "2", "8", "0", "-1", "3", "99999999999999999999", "true", "false", "full", "selective", "hybrid",
          "mxfp8", "1e3", "", "core_attn+mlp", "Et|(tt|)*30,L", "\x00", "٣", "nan"]
strategy_items = st.builds(lambda k, v, eq: f"{k}{eq}{v}", st.sampled_from(list(ALL_KEYS) + ["tpp", "", "dp"]),
                           st.sampled_from(VALUES), st.sampled_from(["=", "=", "==", ":", ""]))
strategies_text = st.one_of(
    st.lists(strategy_items, min_size=1, max_size=6).map(",".join),
    st.text(alphabet=st.sampled_from("tpzeromb=,|+:0189 \t-."), max_size=40),
    st.sampled_from(["x" * 5000, "tp=8" * 200, ",,,", "=", "~/none.yaml", "strategy.json", "."]),
)


def cli(argv):
    """(exit code, everything printed) of one in-process CLI call."""
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code or 0
    return code, out.getvalue()


def timed(bound, argv):
    """cli(argv), raising Timeout past `bound()` seconds, so a hang fails the example."""
    return call_within(bound(), lambda: cli(argv), " ".join(argv))


# A fuzzed call may search a larger space than its base config (up to 7x the layers, heads or experts of the base,
# past which the model's own bounds refuse it), and the machine may be shared; a hang (the unbounded --gpus divisor
# loop, an 80-million-layer walk) overshoots the slowest base search by orders of magnitude. 10x that search bounds
# the first without catching the second late.
BOUND_FACTOR = 10


@pytest.fixture(scope="module")
def bound_s(tmp_path_factory):
    """Seconds a fuzzed call may take: BOUND_FACTOR x the slowest unmutated base `plan` on this machine (after one
    warm-up call), grown with the load since then as conftest's deadlines grow (`startup_s`, the largest start-up
    seen in this session, re-measured as the load changes), and never below one such start-up. A function, asked
    afresh by every call."""
    folder = tmp_path_factory.mktemp("bases")
    cli(["estimate", "--model", "llama3-8b", "--gpus", "8", "--strategy", "tp=1"])  # imports, catalogue
    slowest = 0.0
    for name, cfg in BASES.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(cfg))
        start = time.perf_counter()
        code, text = cli(["plan", "--model", str(path), "--gpus", str(max(GPUS)), "--seq", str(SEQ), "--gbs",
                          str(GBS), "--top", "1", "--json"])
        slowest = max(slowest, time.perf_counter() - start)
        assert code in (0, 1), text
    measured_at = startup_s()
    # Never below one fresh start-up as measured now (deadline_s(1), at least 5 s): a quick refusal overran the
    # 3.0 s bound (10 x a 0.3 s base search) beside a second test run, in typer rebuilding its command tree under
    # that load; a hang still overshoots the floor by orders of magnitude.
    return lambda: max(BOUND_FACTOR * slowest * max(1.0, startup_s() / measured_at), deadline_s(1))


def check(code, text, argv):
    assert code in (0, 1, 2), f"exit {code} for {argv}: {text[-500:]}"
    assert "Traceback" not in text, f"{argv}: {text[-2000:]}"
    if code == 2:
        errors = [line for line in text.splitlines() if line.startswith("autoplan: error:")]
        assert len(errors) == 1, f"{argv}: {text[-500:]}"


FUZZ = settings(max_examples=30, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@FUZZ
@given(case=configs(), gpus=st.sampled_from(GPUS), command=st.sampled_from(["plan", "estimate"]))
def test_fuzzed_model_configs(tmp_path, bound_s, case, gpus, command):
    _, cfg = case
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))  # NaN, Infinity and huge ints are written as Python's json writes them
    argv = [command, "--model", str(path), "--gpus", str(gpus), "--seq", str(SEQ), "--gbs", str(GBS), "--json"]
    argv += ["--top", "1"] if command == "plan" else ["--strategy", "tp=1,pp=1"]
    check(*timed(bound_s, argv), argv)


@pytest.mark.slow
@FUZZ
@given(text=strategies_text, gpus=st.sampled_from(GPUS))
def test_fuzzed_strategy_strings(bound_s, text, gpus):
    argv = ["estimate", "--model", "llama3-8b", "--gpus", str(gpus), "--seq", str(SEQ), "--gbs", str(GBS),
            "--strategy", text, "--json"]
    check(*timed(bound_s, argv), argv)
