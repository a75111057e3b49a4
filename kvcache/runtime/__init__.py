"""Runtime after start-up: the post-capture KV resize (pure decision, shrink, tail release), what ranks must
agree on, and the forward stream. Import the modules directly (this package imports nothing, so the inputs
can use its constants without a cycle).
"""
