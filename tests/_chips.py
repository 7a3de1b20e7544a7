"""Chips for tests that need one priced without measured rates."""

from gpushape.auditing.target import resolve_target

# The H100's datasheet numbers alone (as `--no-profile` gives them): no measured host rates,
# so a test's tiny batch is not host-bound and the GPU-side fixes stay worth applying
# (test_optimize_guard). `gpu="h100"` now brings the profile gpushape ships for the chip.
H100_DATASHEET = resolve_target("h100", None)
