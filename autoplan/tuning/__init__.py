"""Auto-tuning: confirm the cost model's best plans with short real probe runs, correct the model as measurements
arrive, and keep the best measured plan. See `autoplan.tuning.study.run_tune`."""
