"""Log parsers against real log excerpts (tests/fixtures/logs/README.md names each source)."""
from pathlib import Path

import pytest

from autoplan.integrations.logparse import (parse_deepspeed_log, parse_ds_train_log, parse_log,
                                            parse_megatron_log)

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"


def _read(name: str) -> str:
    return (LOGS / name).read_text()


def test_megatron_iterations_and_memory_ling_v2():
    parsed = parse_megatron_log(_read("megatron_ling_v2_pretrain.log"))
    assert [r.iteration for r in parsed.iterations] == list(range(1, 11))
    assert parsed.iterations[0].step_time_s == pytest.approx(79.4899)
    assert parsed.iterations[9].step_time_s == pytest.approx(10.7206)
    assert parsed.iterations[9].tflops_per_gpu == pytest.approx(133.7)
    assert parsed.iterations[1].loss == pytest.approx(2.688647)
    assert len(parsed.memory) == 1
    mem = parsed.memory[0]
    assert mem.rank == 0
    assert mem.max_allocated_gib == pytest.approx(63359.77001953125 / 1024)
    assert mem.max_reserved_gib == pytest.approx(66802.0 / 1024)
    assert parsed.peak_mem_gib_by_rank() == {0: pytest.approx(61.874775)}
    assert parsed.oom_line is None and parsed.error_line is None


def test_megatron_moe_log_with_extra_loss_fields():
    parsed = parse_megatron_log(_read("megatron_issue756_mixtral.log"))
    assert [r.iteration for r in parsed.iterations] == [43, 44, 45]
    assert [r.step_time_s for r in parsed.iterations] == pytest.approx([5.4449, 5.5338, 5.7186])
    assert [r.tflops_per_gpu for r in parsed.iterations] == pytest.approx([239.8, 236.0, 228.4])


def test_megatron_old_memory_report_without_rank_prefix():
    parsed = parse_megatron_log(_read("megatron_issue60_old_memory.log"))
    assert [r.iteration for r in parsed.iterations] == [5, 10]
    assert parsed.iterations[1].tflops_per_gpu is None
    assert parsed.memory[0].rank is None
    assert parsed.memory[0].max_allocated_gib == pytest.approx(12606.06201171875 / 1024)


@pytest.mark.parametrize("name", ["megatron_issue525_oom.log", "deepspeed_medicalgpt317_oom.log"])
def test_out_of_memory_line_found(name):
    parsed = parse_megatron_log(_read(name))
    assert parsed.oom_line is not None
    assert "CUDA out of memory. Tried to allocate" in parsed.oom_line
    assert parsed.oom_line.startswith("torch.cuda.OutOfMemoryError")


def test_deepspeed_timer_lines_new_format():
    parsed = parse_deepspeed_log(_read("megatron_deepspeed_issue3742_bf16.log"))
    assert len(parsed.iterations) == 1
    rec = parsed.iterations[0]
    assert rec.iteration == 34
    assert rec.samples_per_s == pytest.approx(8.00912418308922)  # CurrSamplesPerSec, not the running average
    assert parsed.memory[0].max_allocated_gib == pytest.approx(63.31)


def test_deepspeed_timer_lines_old_format():
    parsed = parse_deepspeed_log(_read("deepspeed_issue1825_timer_old.log"))
    assert [r.iteration for r in parsed.iterations] == [40, 50]
    assert parsed.iterations[1].samples_per_s == pytest.approx(83.73838805358588)
    assert max(m.max_allocated_gib for m in parsed.memory) == pytest.approx(9.02)


def test_deepspeed_see_memory_usage():
    parsed = parse_deepspeed_log(_read("deepspeed_issue4700_see_memory.log"))
    assert [m.max_allocated_gib for m in parsed.memory] == pytest.approx([26.38, 26.38, 0.58])
    assert parsed.memory[0].reserved_gib == pytest.approx(26.71)
    assert parsed.memory[0].max_reserved_gib == pytest.approx(27.0)
    assert parsed.peak_mem_gib_by_rank() == {0: pytest.approx(26.38)}
    assert parsed.iterations == []


def test_megatron_deepspeed_iteration_line_read_by_megatron_parser():
    # Megatron-DeepSpeed prints Megatron's iteration line without the TFLOP/s field.
    parsed = parse_megatron_log(_read("megatron_deepspeed_issue3742_bf16.log"))
    assert [r.iteration for r in parsed.iterations] == [34]
    assert parsed.iterations[0].step_time_s == pytest.approx(4.1031)


def test_error_line_is_last_exception():
    text = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad layout tp=3\n"
    assert parse_log(text, "megatron").error_line == "ValueError: bad layout tp=3"


def test_unparseable_text_gives_empty_result():
    parsed = parse_ds_train_log("hello\nworld\n")
    assert parsed.iterations == [] and parsed.memory == [] and parsed.error_line is None


def test_ds_train_log_from_real_cpu_run():
    parsed = parse_ds_train_log(_read("ds_train_cpu_2rank.log"))
    assert {r.rank for r in parsed.iterations} == {0, 1}
    assert sorted({r.iteration for r in parsed.iterations}) == [1, 2, 3, 4, 5, 6]
    assert len(parsed.iterations) == 12
    first_rank0 = next(r for r in parsed.iterations if r.rank == 0 and r.iteration == 1)
    assert first_rank0.step_time_s == pytest.approx(4.170692)
    assert parsed.memory == []  # device memory is null on CPU
    assert set(parsed.peak_mem_gib_by_rank(host=True)) == {0, 1}


def test_error_line_with_torchrun_rank_prefix():
    text = ('[rank1]:     raise RuntimeError("boom")\n[rank1]: RuntimeError: boom on rank 1\n'
            '[rank0]: RuntimeError: boom on rank 0\n')
    assert parse_log(text, "ds_train").error_line == "[rank0]: RuntimeError: boom on rank 0"
