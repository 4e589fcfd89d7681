"""Sync-freedom of free, free_swa, free_group_end, clear_full_to_swa_mapping,
free_segment and alloc_decode (properties/sync.py)."""

import torch

from properties import sync
from properties.targets import resolve
from tests.sync_targets import bounds_checked_free

impl = resolve("impl")


def test_the_bundled_allocator_is_sync_free_on_every_path():
    report = sync.check(impl, "impl")
    assert report.ok, "\n".join(report.lines())
    assert len(report.checked) == 17 and not report.skipped, report.checked
    # What it does allow is named in the report, each with its reason.
    allowed = {e.where.split(" (")[0] for e in report.allowed}
    assert allowed <= set(sync.ALLOWED), allowed


def test_a_host_read_added_to_free_is_found_on_each_path_that_frees():
    report = sync.check(bounds_checked_free, "bounds_checked_free")
    assert not report.ok
    paths = {e.path.split(" (")[0] for e in report.findings}
    # Only the hybrid's own free carries the read: a group end and a segment free
    # release through the sub-allocators, not through it.
    assert paths == {"free"}, paths
    e = report.findings[0]
    assert e.op == "_local_scalar_dense (host read)" and e.where.startswith("_BoundsCheckedFree.free (sync_targets.py:"), e
    assert any("SYNC     free (hybrid, page size 4): _local_scalar_dense (host read) in _BoundsCheckedFree.free" in line
               for line in report.lines()), report.lines()


def test_each_kind_of_sync_is_seen_and_host_copies_are_not():
    watch = sync._Watch(on_host_device=True)
    device = torch.arange(6)
    host = torch.arange(6)
    watch.mark_host(host)
    with watch, sync._MethodWatch(watch):
        watch.path = "probe"
        int(host.sum())  # the CPU copy and what is computed from it alone: free
        host.tolist()
        device.tolist()
        bool(device[0])
        device[device > 2]
        torch.unique(device)
        device.nonzero()
        device.repeat_interleave(device)
        device.repeat_interleave(device, output_size=15)  # the size given: no read
        device[torch.tensor([1, 2])] = 0  # an int index: no read
    ops = [e.op for e in watch.events]
    assert ops == [
        "tolist (host read)",
        "_local_scalar_dense (host read)",
        "index (boolean mask)",
        "_unique2 (data-dependent shape)",
        "nonzero (data-dependent shape)",
        "repeat_interleave without output_size (data-dependent shape)",
    ], ops


def test_debug_only_reads_are_allowed_by_name_and_others_are_not():
    a = impl({"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4, "check_level": "warn"})
    slots = a.alloc_extend(torch.tensor([0]), torch.tensor([0]), torch.tensor([9]), torch.tensor([9]), torch.tensor([-1]), 9)
    a.swa_attn_allocator.debug_mode = True
    a.full_attn_allocator.debug_mode = True
    watch = sync._Watch(on_host_device=True)
    with watch, sync._MethodWatch(watch):
        a.free(slots)
    by_fn = {e.where.split(" (")[0]: e.allowed for e in watch.events}
    assert by_fn.get("BaseTokenToKVPoolAllocator._debug_check_release") == "debug_mode only", by_fn
    assert all(reason for reason in by_fn.values()), by_fn


def test_report_json_names_the_findings():
    out = sync.check(bounds_checked_free, "bounds_checked_free").to_json()
    assert out["ok"] is False and out["target"] == "bounds_checked_free"
    assert out["findings"][0]["path"].startswith("free (hybrid, page size 1)")


def test_the_cli_exits_0_clean_1_naming_path_and_op_2_on_bad_input(capsys, tmp_path):
    from fuzz.cli import main

    assert main(["sync"]) == 0
    assert "0 finding(s)" in capsys.readouterr().out
    report = tmp_path / "r.json"
    assert main(["sync", "--target", "tests.sync_targets:bounds_checked_free", "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "SYNC     free (hybrid, page size 1): _local_scalar_dense (host read) in _BoundsCheckedFree.free" in out, out
    assert '"ok": false' in report.read_text()
    assert main(["sync", "--target", "no_such_target"]) == 2
    assert "--target: unknown target 'no_such_target'" in capsys.readouterr().err
    assert main(["sync", "--device", "cuda:99"]) == 2
