"""`python -m fuzz show`: the terminal map (golden), the page (XML, every involved page
and slot in it), the configurations it must draw, big pools folded, exit codes.

Goldens live in tests/golden/; after an intended change of the terminal view, rewrite
them with `SWA_LOCKSTEP_REGOLD=1 pytest tests/test_show.py -k golden` and read the diff.
"""

import io
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fuzz import campaign, show, show_render
from fuzz import trace as trace_mod
from properties.steps import Admit, AdmitTail, Decode, DropTail, Evict, Finish, GroupBegin, Repair

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
GOLDEN = Path(__file__).resolve().parent / "golden"
REGOLD = os.environ.get("SWA_LOCKSTEP_REGOLD") == "1"
ENTRIES = sorted(p.name for p in CORPUS.glob("*.json"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def shown_for(path, target=None, step=None, page=True):
    t = trace_mod.load(path)
    spec = target or t.own_target
    return show.show(t, campaign.resolve(spec), spec, "cpu", step, page=page)


def small(kind="hybrid", ps=1, size=None, size_swa=None, steps=(), **cfg):
    size = size or 8 * ps
    config = {"kind": kind, "size": size, "size_swa": size_swa or size, "page_size": ps, "check_level": "strict", **cfg}
    return trace_mod.Trace(name="t", expect="pass", config=config, steps=list(steps))


def keys(root, attr):
    return {e.get(attr) for e in root.iter() if e.get(attr)}


def involved_keys(s):
    pages = {f"{pm.side} page {p}" for pm in s.at.pools for p in pm.involved}
    slots = {f"{st.side} slot {st.slot}" for st in s.at.slots}
    return pages, slots


# ------------------------------------------------------------------- golden
@pytest.mark.parametrize(
    "entry",
    [
        "seed-release-paired-page-pool.no-double-ownership-b5f72ec9c9.json",  # an SWA page free in the target only
        "group-holds-view-pool.padding-reserved-5caafd36a6.json",  # the closing census: padding in the free list
    ],
)
def test_golden_terminal_view(entry, monkeypatch):
    monkeypatch.chdir(ROOT)  # the header names the trace by the path given
    out = show_render.text(shown_for(Path("fuzz/corpus") / entry, page=False), colour=False)
    golden = GOLDEN / (Path(entry).stem + ".txt")
    if REGOLD or not golden.exists():
        if not REGOLD:
            pytest.fail(f"no golden {golden}; write it with SWA_LOCKSTEP_REGOLD=1 and read it")
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(out)
    assert out == golden.read_text()


def test_golden_marks_the_page_the_failure_is_about():
    s = shown_for(CORPUS / "seed-release-paired-page-pool.no-double-ownership-b5f72ec9c9.json", page=False)
    swa = next(pm for pm in s.at.pools if pm.side == "swa")
    assert show_render.disagrees(swa.pages[2]) and swa.pages[2].model == "owned" and swa.pages[2].target_free
    assert not any(show_render.disagrees(c) for p, c in swa.pages.items() if p != 2)
    assert s.failing == s.index == 2 and s.matches


# --------------------------------------------------------------------- page
@pytest.mark.parametrize("entry", ENTRIES)
def test_page_parses_and_holds_every_involved_page_and_slot(entry):
    if trace_mod.load(CORPUS / entry).own_target == "sglang":
        # An upstream finding replays on sglang itself, as tests/test_corpus.py does it.
        from properties.sglang_target import available

        ok, why = available()
        if not ok:
            pytest.skip(f"sglang not importable: {why}")
    s = shown_for(CORPUS / entry)
    root = ET.fromstring(show_render.page(s))
    assert root.tag == "{http://www.w3.org/1999/xhtml}html"
    assert not [e for e in root.iter() if e.tag.endswith("script")]
    text = "".join(root.itertext())
    assert s.outcome in text and s.trace.name in text
    if s.at is None:
        return
    pages, slots = involved_keys(s)
    drawn = keys(root, "data-key")
    assert pages <= drawn, pages - drawn  # in the maps (and the table)
    assert slots <= drawn
    if s.index >= 0:
        rows = keys(root, "data-row")
        assert rows == pages | slots  # a timeline row each, and nothing else
        for row in s.timeline:
            assert len(row.cells) == s.index + 1  # one cell per step up to the one shown
    if s.failing is not None and s.failing >= 1 and s.index == s.failing:
        assert s.before is not None and s.before.index == s.index - 1


def test_page_has_the_map_before_and_at_the_failing_step_side_by_side(tmp_path):
    s = shown_for(CORPUS / "seed-release-paired-page-pool.no-double-ownership-b5f72ec9c9.json")
    before = next(pm for pm in s.before.pools if pm.side == "swa")
    at = next(pm for pm in s.at.pools if pm.side == "swa")
    # The bad release happens in the failing step: before it the page agrees.
    assert not show_render.disagrees(before.pages[2]) and show_render.disagrees(at.pages[2])
    root = ET.fromstring(show_render.page(s))
    sections = [e for e in root.iter() if e.tag.endswith("section")]
    assert len(sections) == 2 and all(any(x.tag.endswith("svg") for x in sec.iter()) for sec in sections)
    # The timeline marks the step where the target starts to disagree on SWA page 2.
    row = next(r for r in s.timeline if r.key == "swa page 2")
    assert [show_render.disagrees(c) for c in row.cells] == [False, False, True]


# ------------------------------------------------------ what it must draw
def _check(s):
    text = show_render.text(s)
    root = ET.fromstring(show_render.page(s))
    assert s.matches, s.message
    pages, slots = involved_keys(s)
    assert pages <= keys(root, "data-key")
    return text


def test_passing_trace_at_any_step():
    t = small(ps=2, steps=[Admit(((0, 3), (1, 2))), Evict(0, 0, 2), Finish(1, "split"), DropTail(0, 2)])
    for step in range(len(t.steps)):
        s = show.show(t, campaign.resolve("impl"), "impl", step=step, page=True)
        assert s.index == step and s.failing is None and s.outcome == "pass"
        assert f"state after step {step}: {t.steps[step]!r}" in _check(s)
        assert len(s.timeline[0].cells) == step + 1 if s.timeline else True
    # Step 0 admits both requests: their pages are drawn as theirs and involved.
    s = show.show(t, campaign.resolve("impl"), "impl", step=0)
    full = s.at.pools[0]
    assert {full.pages[p].symbol for p in full.involved if p} == {"r0", "r1"}


def test_pure_swa_draws_one_pool():
    t = small(kind="pure_swa", steps=[Admit(((0, 3),)), Evict(0, 0, 1), Admit(((1, 2),))])
    s = show.show(t, campaign.resolve("impl"), "impl", page=True)
    text = _check(s)
    assert len(s.at.pools) == 1 and "pool (pure SWA: the only pool)" in text and "SWA pool" not in text
    assert {s.at.pools[0].pages[p].symbol for p in s.at.pools[0].involved} >= {"r0", "r1", "."}


def test_ring_mode_draws_the_full_pool_and_the_request_slots():
    t = small(ps=2, steps=[Admit(((0, 3),)), Admit(((1, 1),))], ring_size=2, req_slots=3)
    s = show.show(t, campaign.resolve("impl"), "impl", page=True)
    text = _check(s)
    assert len(s.at.pools) == 1 and "request slots (ring mode): r0 r1 ." in text


@pytest.mark.parametrize("ps", [1, 4, 256])
def test_page_sizes(ps):
    t = small(ps=ps, size=8 * ps, steps=[
        Admit(((0, 2 * ps + 1),)), Evict(0, 0, 2 * ps), Repair(0, 0, 2 * ps, ps - 1), AdmitTail(1, ps + 1, 1) if ps > 1 else Admit(((1, 1),)),
        Decode((0, 1)), GroupBegin(), Finish(0, "free"),
    ])
    s = show.show(t, campaign.resolve("impl"), "impl", page=True)
    text = _check(s)
    full = s.at.pools[0]
    assert "H" in {full.pages[p].symbol for p in full.involved}  # the group holds the finished pages
    assert f"pages of {ps} slot" in text


def test_a_pool_of_100k_pages_is_folded_never_one_element_per_slot():
    size = 200_000
    t = small(ps=1, size=size, size_swa=size, steps=[Admit(((0, 40), (1, 5))), Evict(0, 0, 30), Admit(((2, 3),)), Finish(1, "split")])
    s = show.show(t, campaign.resolve("impl"), "impl", page=True)
    text = _check(s)
    for pm in s.at.pools:
        folded = sum(f.hi - f.lo for f in pm.layout if isinstance(f, show.Fold))
        assert folded > size - 2000 and len(pm.pages) < 2000
        assert sum(f.free for f in pm.layout if isinstance(f, show.Fold)) + sum(c.model == "free" for c in pm.pages.values()) == pm.model_free
    assert len(text.splitlines()) < 80
    html = show_render.page(s)
    assert len(html) < 1_000_000 and html.count("<rect") < 5000


def test_folds_count_what_they_hide():
    t = small(ps=1, size=4096, steps=[Admit(((0, 100),)), Admit(((1, 300),)), Finish(0, "split")])
    s = show.show(t, campaign.resolve("impl"), "impl", page=False)
    full = s.at.pools[0]
    owned_drawn = sum(c.model == "owned" for c in full.pages.values())
    owned_folded = sum(f.owned for f in full.layout if isinstance(f, show.Fold))
    assert owned_drawn + owned_folded == 300  # request 1's slots, wherever they are drawn


# ------------------------------------------------------------------- colour
def test_colour_only_when_asked_or_on_a_terminal_without_no_color(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert show_render.use_colour("auto", Tty()) and not show_render.use_colour("auto", io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not show_render.use_colour("auto", Tty()) and show_render.use_colour("always", io.StringIO())
    s = shown_for(CORPUS / "seed-release-paired-page-pool.no-double-ownership-b5f72ec9c9.json", page=False)
    coloured = show_render.text(s, colour=True)
    assert "\x1b[1;97;41m" in coloured  # the differing page
    assert ANSI.sub("", coloured) == show_render.text(s, colour=False)


# ---------------------------------------------------------------- named pages
def test_pages_and_slots_named_in_details_count_for_their_pool():
    pages, slots = show.named_in(
        ["pool.no_double_ownership: SWA pages [2, 5] are free but owned",
         "map.live: mapping[7] is 3, but slot 7 is unpaired",
         "alloc.layout: SWA tail (position 2) slot 9 has in-page offset 1"],
        page_size=2, pure=False,
    )
    assert sorted(pages["swa"]) == [2, 4, 5] and sorted(pages["full"]) == [3, 3]
    assert slots["full"] == [7, 7] and slots["swa"] == [9]


# ---------------------------------------------------------------- the CLI
def fuzz(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fuzz", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_cli_prints_the_map_writes_the_page_and_exits_by_outcome(tmp_path):
    entry = CORPUS / "seed-release-paired-page-pool.no-double-ownership-b5f72ec9c9.json"
    out = tmp_path / "p.html"
    r = fuzz("show", entry, "--html", out)
    assert r.returncode == 0, r.stderr
    assert "SWA pool:" in r.stdout and "r0!" in r.stdout and "\x1b[" not in r.stdout
    assert r.stdout.rstrip().endswith(f"page: {out}")
    ET.parse(out)
    assert [p.name for p in tmp_path.iterdir()] == ["p.html"]  # no temporary left behind
    # A trace run where it must have another outcome: 1, as replay.
    wrong = trace_mod.load(entry)
    wrong.expect, wrong.name = "map.live", "wrong"
    r = fuzz("show", trace_mod.dump(wrong, tmp_path / "wrong.json"))
    assert r.returncode == 1 and "<- MISMATCH" in r.stdout
    r = fuzz("show", entry, "--color", "always")
    assert r.returncode == 0 and "\x1b[1;97;41m" in r.stdout


@pytest.mark.parametrize(
    "args, names",
    [
        (["--step", "3"], "--step: 3 is outside 0..2"),
        (["--step", "x"], "--step"),
        (["--target", "no_such_variant"], "--target"),
        (["--html", "/nonexistent/dir/p.html"], "--html"),
        (["--device", "nowhere"], "--device"),
    ],
)
def test_cli_bad_input_exits_2_naming_it(args, names):
    r = fuzz("show", CORPUS / "seed-release-paired-page-pool.no-double-ownership-b5f72ec9c9.json", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert names in r.stderr.strip().splitlines()[-1] and "Traceback" not in r.stderr


def test_cli_malformed_trace_exits_2_naming_file_step_field(tmp_path):
    bad = tmp_path / "bad.json"
    t = small(steps=[Admit(((0, 3),)), Finish(0, "split")])
    text = trace_mod.dump(t, bad).read_text().replace('"rid": 0', '"rid": "x"')
    bad.write_text(text)
    r = fuzz("show", bad)
    assert r.returncode == 2 and f"{bad}: step 1: field 'rid'" in r.stderr


def test_a_campaign_writes_the_page_beside_the_trace_and_prints_it(tmp_path):
    r = fuzz("run", "--target", "release_padding", "--examples", "40", "--seed", "1",
             "--db", tmp_path / "db", "--corpus", tmp_path / "corpus")
    assert r.returncode == 1, r.stdout + r.stderr
    saved = next(line.split("saved: ", 1)[1] for line in r.stdout.splitlines() if "saved: " in line)
    page = next(line.split("page: ", 1)[1].split(" (open")[0] for line in r.stdout.splitlines() if "  page: " in line)
    assert Path(page) == Path(saved).with_suffix(".html")
    root = ET.parse(page).getroot()
    assert trace_mod.load(saved).name in "".join(root.itertext())


def test_the_readme_shows_the_current_terminal_view():
    golden = GOLDEN / "seed-release-paired-page-pool.no-double-ownership-b5f72ec9c9.txt"
    assert golden.read_text() in (ROOT / "README.md").read_text(), "README's show picture is stale: paste the golden in"
