"""Testing aids: fault injectors, an engine-shaped workload to drive a canary with, fault scenarios and the
demo. Nothing here is on an engine's hot path."""
