"""The README's test example, verbatim in spirit: it must keep working."""

from containers import EngineContainer
from kvcache.byte_units import GiB
from kvcache.inputs.server_args import ServerArgs
from kvcache.testing import FixedMemoryProbe, tiny_model_config


def test_a_one_gib_card_holds_what_the_formula_says(mocker):
    engine = EngineContainer(server_args=ServerArgs.from_mapping({"device": "cpu", "kv_cache_memory": GiB // 4}),
                             model_config=tiny_model_config())
    with engine.memory_probe.override(FixedMemoryProbe(total_bytes=GiB)):
        runner = engine.engine().target
        spy = mocker.spy(type(engine.target.configurator()), "configure")
        runner.initialize()
    assert spy.call_count == 1 and runner.memory_pool_config.total_bytes <= GiB // 4
