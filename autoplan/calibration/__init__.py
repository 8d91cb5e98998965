"""Calibration to a user's own cluster: read measured runs (training logs with their launch configs, runs tables,
probe results), fit the cost model's constants to them with the GPU profile's values as priors, and write a
calibration file that `estimate`, `plan` and `tune` take with `--calibration FILE`.

Modules: `params` (the constants that can be fitted, their bounds and priors), `runs` (measured runs and their
readers), `fit` (the regularised least-squares fit and what the data identify), `calfile` (the file and applying
it to a cluster)."""
