"""The trace format: round trip, validation that names file, step and field, atomic writes."""

import json
import os

import pytest

from fuzz import trace as trace_mod
from fuzz.trace import Trace, TraceError
from properties.steps import Admit, Decode, Evict, Finish, GroupBegin, GroupEnd

CONFIG = {"kind": "hybrid", "size": 16, "size_swa": 16, "page_size": 4, "device": "cpu",
          "need_sort": False, "ring_size": None, "req_slots": None, "check_level": "strict",
          "backend": "auto", "layout": "torch", "debug_memory_pool": False}
STEPS = [Admit(((0, 5), (1, 3))), Decode((0, 1)), GroupBegin(), Evict(0, 0, 4), GroupEnd(), Finish(0, "split"), Finish(1, "free")]


def make(**kw) -> Trace:
    return Trace(**{"name": "t", "expect": "pass", "config": dict(CONFIG), "steps": list(STEPS), **kw})


def write(tmp_path, data, name="bad.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_round_trip(tmp_path):
    t = make(variant="release_padding", target="release_padding", expect="pool.padding_reserved", note="n")
    p = trace_mod.dump(t, tmp_path / "t.json")
    back = trace_mod.load(p)
    assert back == t
    data = json.loads(p.read_text())
    assert data["format"] == "swa-lockstep-trace" and data["version"] == 1
    assert data["steps"][0] == {"op": "admit", "reqs": [[0, 5], [1, 3]]}


def test_every_config_key_round_trips(tmp_path):
    """Each key of the schema, set away from its default, is written and read back."""
    from impl.config import DEFAULTS, KEYS

    config = {"kind": "pure_swa", "size": 24, "size_swa": 20, "page_size": 2, "device": "cuda:1",
              "need_sort": True, "ring_size": 3, "req_slots": 2, "check_level": "warn",
              "backend": "npu_emulated", "layout": "triton", "debug_memory_pool": True}
    assert set(config) == set(KEYS)
    assert all(config[k] != v for k, v in DEFAULTS.items()), "every key away from its default"
    back = trace_mod.load(trace_mod.dump(make(config=config), tmp_path / "t.json"))
    assert back.config == config


def test_replays_on_impl_and_device_of_replay_wins():
    t = make(config=dict(CONFIG, device="cuda:7"))
    out = trace_mod.run(t, trace_mod_target(), device="cpu")
    assert out.outcome == "pass", out.message


def trace_mod_target():
    from properties.targets import resolve

    return resolve("impl")


def test_expected_on_own_target_and_others():
    t = make(variant="v", target="v", expect="map.live")
    assert t.expected_on("v") == "map.live"
    assert t.expected_on("impl") == "pass"


@pytest.mark.parametrize(
    "mutate, index, field",
    [
        (lambda d: d["steps"][3].update(rid="x"), 3, "rid"),
        (lambda d: d["steps"][0].update(op="nope"), 0, "op"),
        (lambda d: d["steps"][1].pop("rids"), 1, "rids"),
        (lambda d: d["steps"][5].update(how="later"), 5, "how"),
        (lambda d: d["steps"][2].update(extra=1), 2, "extra"),
        (lambda d: d["config"].update(page_size=0), None, "config.page_size"),
        (lambda d: d["config"].update(size=0), None, "config.size"),
        (lambda d: d["config"].update(size_swa=-4), None, "config.size_swa"),
        (lambda d: d["config"].update(backend="tpu"), None, "config.backend"),
        (lambda d: d["config"].update(layout="cutlass"), None, "config.layout"),
        (lambda d: d["config"].update(debug_memory_pool="yes"), None, "config.debug_memory_pool"),
        (lambda d: d["config"].update(ring_size=2), None, "config.req_slots"),
        (lambda d: d["config"].update(device="my gpu"), None, "config.device"),
        (lambda d: d["config"].pop("kind"), None, "config.kind"),
        (lambda d: d["config"].update(colour="red"), None, "config.colour"),
        (lambda d: d.update(expect="pool.everything"), None, "expect"),
        (lambda d: d.update(steps={}), None, "steps"),
        (lambda d: d.update(format="other"), None, "format"),
    ],
)
def test_malformed_names_file_step_and_field(tmp_path, mutate, index, field):
    data = make().to_json()
    mutate(data)
    p = write(tmp_path, data)
    with pytest.raises(TraceError) as e:
        trace_mod.load(p)
    assert e.value.path == str(p) and e.value.index == index and e.value.field == field
    assert str(e.value).startswith(f"{p}: " + (f"step {index}: " if index is not None else "") + f"field {field!r}: ")


def test_message_shape(tmp_path):
    data = make().to_json()
    data["steps"][3]["rid"] = "x"
    p = write(tmp_path, data)
    with pytest.raises(TraceError, match=r"bad\.json: step 3: field 'rid': must be an integer"):
        trace_mod.load(p)


def test_unknown_version_says_which_it_reads(tmp_path):
    data = dict(make().to_json(), version=2)
    with pytest.raises(TraceError, match=r"field 'version': version 2 is not supported; this swa-lockstep reads version 1"):
        trace_mod.load(write(tmp_path, data))


def test_not_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"format": ')
    with pytest.raises(TraceError, match=r"x\.json: not valid JSON \(line 1"):
        trace_mod.load(p)


def test_step_that_cannot_apply_names_step(tmp_path):
    t = make(steps=[Admit(((0, 2),)), Decode((7,))])
    t.path = tmp_path / "late.json"
    with pytest.raises(TraceError) as e:
        trace_mod.run(t, trace_mod_target())
    assert e.value.index == 1 and e.value.field == "rids"


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "t.json"
    trace_mod.dump(make(name="old"), target)
    before = target.read_text()

    def fail_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail_fsync)
    with pytest.raises(OSError):
        trace_mod.dump(make(name="new"), target)
    assert target.read_text() == before  # the old trace is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no temporary left


def test_save_names_by_content(tmp_path):
    a = trace_mod.save(make(name="", target="v", variant="v", expect="map.live"), tmp_path)
    b = trace_mod.save(make(name="", target="v", variant="v", expect="map.live"), tmp_path)
    assert a == b and a.name.startswith("v-map.live-")
