"""Inputs: the knobs (ServerArgs, SizingSettings), the rank's place (ParallelState), devices, cards and dtypes."""
