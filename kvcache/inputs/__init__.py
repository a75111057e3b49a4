"""Inputs: the knobs (ServerArgs, SizingSettings), the rank's place (ParallelState), cards and dtypes (as data: no torch)."""
