"""One description of a model: config.json read once into the cache description and the weight layout.

`registry.read_model` dispatches to a family reader (`families/`) or the generic decoder
reader; `fields` validates every value read; `weights_layout` lists a rank's tensors.
Import the modules directly (this package imports nothing, so model_config can use it).
"""
