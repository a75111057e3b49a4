"""Readers for families whose cache or weights are not a standard decoder's (one module per family)."""
