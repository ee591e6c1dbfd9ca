"""Checks of one kernel on one case: accuracy against the oracle (forward and gradients),
structural properties, and replays of saved cases."""
