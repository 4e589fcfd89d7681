"""One configuration schema (impl/config.py): the factory, the driver and the trace
loader accept and refuse the same configurations and name the same field."""

import pytest

from fuzz import trace as trace_mod
from impl import make_allocator
from impl.config import KEYS, ConfigError, validate
from properties.lockstep import check_config

GOOD = {"kind": "hybrid", "size": 16, "size_swa": 16, "page_size": 4}
BAD = [
    ({"size": 0}, "size"), ({"size_swa": 0}, "size_swa"), ({"page_size": 0}, "page_size"), ({"size": True}, "size"),
    ({"kind": "other"}, "kind"), ({"need_sort": 1}, "need_sort"), ({"ring_size": 0, "req_slots": 2}, "ring_size"),
    ({"ring_size": 4}, "req_slots"), ({"req_slots": 0}, "req_slots"), ({"check_level": "loud"}, "check_level"),
    ({"backend": "tpu"}, "backend"), ({"layout": "cutlass"}, "layout"), ({"debug_memory_pool": "yes"}, "debug_memory_pool"),
    ({"device": "my gpu"}, "device"), ({"colour": 1}, "colour"),
]


@pytest.mark.parametrize("change, field", BAD, ids=[f for _, f in BAD])
def test_every_reader_refuses_the_same_bad_value_naming_the_field(change, field):
    cfg = {**GOOD, **change}
    for read in (validate, check_config, make_allocator):
        with pytest.raises(ConfigError) as e:
            read(cfg)
        assert e.value.field == field, (read.__name__, str(e.value))
    data = trace_mod.Trace("t", "pass", {}, []).to_json()
    data["config"] = cfg
    with pytest.raises(trace_mod.TraceError) as e:
        trace_mod.from_json(data)
    assert e.value.field == f"config.{field}"


@pytest.mark.parametrize("missing", ["kind", "size", "page_size"])
def test_required_keys(missing):
    cfg = {k: v for k, v in GOOD.items() if k != missing}
    for read in (validate, check_config, make_allocator):
        with pytest.raises(ConfigError, match=repr(missing)):
            read(cfg)


def test_the_schema_holds_the_keys_other_parts_use():
    assert set(KEYS) >= {"backend", "layout", "debug_memory_pool"}
    full = validate(GOOD)
    assert set(full) == set(KEYS) and full["layout"] == "torch" and full["debug_memory_pool"] is False
    assert full["backend"] == "auto" and full["size_swa"] == 16
    assert check_config(GOOD)["check_level"] == "strict"  # the driver needs a level
