"""Drawing what `fuzz.show` collected: a page map for the terminal, and one HTML page.

The terminal map has one cell per page (three characters and a mark), sixteen pages a
row, folded runs between the rows that matter. Colour is plain ANSI, used when asked
for or when stdout is a terminal and NO_COLOR is unset. The page is one XHTML file
with inline SVG and CSS: no script, nothing fetched, so it opens from disk anywhere.
"""

from __future__ import annotations

import html
import os

from fuzz import show as S
from fuzz.trace import summary

# ------------------------------------------------------------------ colour
_OWNER_ANSI = ("34", "32", "36", "94", "92", "96")
_OWNER_RGB = ("#6b9bd1", "#7cc47f", "#5fc7c7", "#b19cd9", "#e0a96d", "#9fc25b", "#d38fb5", "#8ab6e8")


def use_colour(choice: str, stream) -> bool:
    """--color always/never decide; auto: a terminal, NO_COLOR unset or empty, TERM not dumb."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


class _Paint:
    def __init__(self, on: bool):
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on and code else text


def disagrees(cell) -> bool:
    """Model and target disagree on this page or slot."""
    if isinstance(cell, S.SlotState):
        return cell.differs
    if cell.differs:
        return True
    if cell.target_free is not None and cell.target_free != (cell.model == "free"):
        return True
    return cell.target_peers is not None and cell.target_peers != cell.peers


def _ansi(cell: S.PageState, involved: bool) -> str:
    if disagrees(cell):
        return "1;97;41"
    code = {"padding": "2", "free": "2", "held": "35", "beyond": "2;31"}.get(cell.model)
    if code is None:
        code = _OWNER_ANSI[cell.owners[0] % len(_OWNER_ANSI)] if len(cell.owners) == 1 else "33"
    return code + (";1;4" if involved else "")


# ---------------------------------------------------------------- terminal
LEGEND = (
    "legend: P padding  . free  rN request N  r+ several requests  H held by the open free group\n"
    "        o owned, no live request  x beyond the pool's size  * involved  ! model and target differ"
)


def _outcome_lines(shown: S.Shown) -> list[str]:
    t = shown.trace
    lines = [
        f"trace: {t.path or t.name}",
        f"  target {shown.target} ({shown.device}); config {summary(t.config)}; {len(t.steps)} steps",
        f"  outcome {shown.outcome}, expected {shown.expected}" + ("" if shown.matches else "  <- MISMATCH"),
    ]
    lines += [f"  | {line}" for line in shown.message.splitlines()]
    return lines


def _where(shown: S.Shown) -> str:
    at = shown.at
    if shown.failing is not None and shown.failing == shown.index:
        return f"state {at.label}  (the failing step)"
    if shown.failing is not None and shown.failing == len(shown.trace.steps) and shown.index == len(shown.trace.steps) - 1:
        return f"state {at.label}  (the closing census fails here)"
    if shown.failing == -1:
        return "state after construction  (the census after construction fails)"
    return f"state {at.label}"


def pool_lines(pm: S.PoolMap, colour: bool = False) -> list[str]:
    """The map of one pool: a header, a column ruler, rows of cells and folded runs."""
    paint = _Paint(colour)
    involved = set(pm.involved)
    width = max(6, len(str(pm.extent)) + 1)
    head = (
        f"{pm.title}: {pm.num_pages} pages of {pm.page_size} slot{'s' * (pm.page_size != 1)}, page 0 padding; "
        f"free pages: model {pm.model_free}, target {pm.target_free}; differing {pm.differing}"
    )
    lines = [head, " " * width + " " + "".join(f"{'+' + str(i):>3} " for i in range(min(S.ROW, pm.extent))).rstrip()]
    for item in pm.layout:
        if isinstance(item, S.Fold):
            extra = f", target {item.target_free} free" if item.target_free != item.free else ""
            extra += f", {item.differ} differ" if item.differ else ""
            held = f", {item.held} held" if item.held else ""
            lines.append(
                f"{'':>{width}}  ... pages {item.lo}..{item.hi - 1} folded ({item.hi - item.lo}): "
                f"{item.free} free, {item.owned} owned{held}{extra}"
            )
            continue
        cells = []
        for p in range(item, min(item + S.ROW, pm.extent)):
            c = pm.pages[p]
            mark = "!" if disagrees(c) else "*" if p in involved else " "
            cells.append(paint(f"{c.symbol:>3}", _ansi(c, p in involved)) + mark)
        lines.append(f"{item:>{width}} " + "".join(cells).rstrip())
    return lines


def _involved_lines(snap: S.Snapshot) -> list[str]:
    """One line per page where model and target differ; runs of adjacent pages in the
    same state share a line, so a long request's pages do not flood the screen."""
    out = []
    for pm in snap.pools:
        side = "full" if pm.side == "full" else "SWA"
        pages = sorted(p for p in pm.involved if p in pm.pages)
        i = 0
        while i < len(pages):
            p, c = pages[i], pm.pages[pages[i]]
            j = i
            while (
                not disagrees(c) and j + 1 < len(pages) and pages[j + 1] == pages[j] + 1
                and not disagrees(nxt := pm.pages[pages[j + 1]]) and (nxt.model, nxt.owners) == (c.model, c.owners)
            ):
                j += 1
            if j - i >= 2:
                out.append(f"    {side:<4} pages {p}..{pages[j]} ({j - i + 1} pages)  {c.symbol:<3} {c.state()}")
            else:
                for q in pages[i : j + 1]:
                    d = pm.pages[q]
                    why = "; ".join(d.differs)
                    out.append(f"  {'!' if disagrees(d) else ' '} {side:<4} page {q:<7} {d.symbol:<3} {d.describe()}" + (f"  <- {why}" if why else ""))
            i = j + 1
    for st in snap.slots:
        side = "full" if st.side == "full" else "SWA"
        out.append(f"  {'!' if st.differs else ' '} {side:<4} slot {st.slot:<7} {st.symbol:<3} {st.describe()}")
    return out


def _steps_lines(shown: S.Shown) -> list[str]:
    steps = shown.trace.steps
    lo, hi = 0, len(steps)
    if len(steps) > 20:
        lo, hi = max(0, shown.index - 12), min(len(steps), max(shown.index, 0) + 4)
    out = ["steps"]
    if lo:
        out.append(f"   ... steps 0..{lo - 1}")
    for i in range(lo, hi):
        mark = ">" if i == shown.index else " "
        tail = "  <- fails here" if i == shown.failing else ""
        out.append(f"  {mark}{i:4d}  {steps[i]!r}{tail}")
    if hi < len(steps):
        out.append(f"   ... steps {hi}..{len(steps) - 1}")
    if shown.failing == len(steps):
        out.append("        the closing census fails")
    return out


def text(shown: S.Shown, colour: bool = False) -> str:
    """The terminal view: the outcome, the map of each pool, the involved pages, the steps."""
    lines = _outcome_lines(shown)
    if shown.at is None:
        lines.append(shown.unreadable or "no map: the target did not build the configuration")
        return "\n".join(lines) + "\n"
    snap = shown.at
    lines += ["", _where(shown)]
    lines += [f"  note: {n}" for n in snap.notes]
    for pm in snap.pools:
        lines += [""] + pool_lines(pm, colour)
    if snap.req_slots is not None:
        lines += ["", "request slots (ring mode): " + " ".join(snap.req_slots)]
    lines += ["", LEGEND]
    inv = _involved_lines(snap)
    if inv:
        lines += ["", "involved pages and slots"] + inv
    sizes = "  ".join(f"{k} {m}" + ("" if t == m else f" (target {t})") for k, (m, t) in snap.sizes.items())
    lines += ["", f"sizes: {sizes}"]
    if snap.group[0] or snap.group[1]:
        lines.append(f"free group: model {'open' if snap.group[0] else 'closed'}, target {'open' if snap.group[1] else 'closed'}")
    if shown.trace.steps:
        lines += [""] + _steps_lines(shown)
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------- HTML
CW, CH, LW, FH = 30, 22, 64, 20  # cell width/height, row-label width, fold height

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.2em; } h2 { font-size: 1.05em; margin-top: 1.6em; } h3 { font-size: 0.95em; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
.maps { display: flex; flex-wrap: wrap; gap: 2em; }
.maps section { flex: 0 0 auto; }
svg text { font: 11px ui-monospace, monospace; dominant-baseline: middle; text-anchor: middle; }
svg text.label { text-anchor: end; fill: #666; }
svg text.fold { text-anchor: start; fill: #666; }
svg text.head { fill: #666; }
svg text.peer { font-size: 9px; fill: #333; }
rect.free, rect.padding, rect.beyond { fill: #f1f1f1; }
rect.held { fill: #f3c6f0; }
rect.orphan { fill: #f2d06b; }
rect.cell { stroke: #fff; stroke-width: 1; }
rect.involved { stroke: #222; stroke-width: 2; }
rect.differs { stroke: #d00; stroke-width: 3; }
rect.shown { fill: none; stroke: #333; stroke-dasharray: 3 2; }
table { border-collapse: collapse; } td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
td.bad { color: #b00; }
ol.steps li.shown { font-weight: bold; }
.legend span { display: inline-block; padding: 0 6px; margin-right: 6px; border: 1px solid #ccc; font-family: monospace; }
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _fill(cell) -> tuple[str, str]:
    """(class, fill attribute) of a page or slot cell."""
    if isinstance(cell, S.SlotState):
        if not cell.live:
            return "free", ""
        return ("cell", f' fill="{_OWNER_RGB[cell.owner % len(_OWNER_RGB)]}"') if cell.owner is not None else ("orphan", "")
    if cell.model == "owned":
        if len(cell.owners) == 1:
            return "cell", f' fill="{_OWNER_RGB[cell.owners[0] % len(_OWNER_RGB)]}"'
        return "orphan", ""
    return cell.model, ""


def _cell_svg(x: int, y: int, cell, involved: bool, key: str, tip: str) -> str:
    cls, fill = _fill(cell)
    classes = ["cell", cls] + (["involved"] if involved else []) + (["differs"] if disagrees(cell) else [])
    return (
        f'<g data-key="{_e(key)}"><rect class="{" ".join(dict.fromkeys(classes))}" x="{x}" y="{y}" width="{CW - 1}" height="{CH - 1}"{fill}>'
        f"<title>{_e(tip)}</title></rect>"
        f'<text x="{x + CW / 2:g}" y="{y + CH / 2:g}">{_e(cell.symbol)}</text></g>'
    )


def map_svg(pm: S.PoolMap) -> str:
    involved = set(pm.involved)
    body, y = [], 16
    body.append("".join(f'<text class="head" x="{LW + i * CW + CW / 2:g}" y="8">+{i}</text>' for i in range(min(S.ROW, pm.extent))))
    for item in pm.layout:
        if isinstance(item, S.Fold):
            held = f", {item.held} held" if item.held else ""
            extra = f", target {item.target_free} free" if item.target_free != item.free else ""
            extra += f", {item.differ} differ" if item.differ else ""
            body.append(
                f'<text class="fold" x="{LW}" y="{y + FH / 2:g}">\u22ef pages {item.lo}..{item.hi - 1} folded: '
                f"{item.free} free, {item.owned} owned{held}{_e(extra)}</text>"
            )
            y += FH
            continue
        body.append(f'<text class="label" x="{LW - 6}" y="{y + CH / 2:g}">{item}</text>')
        for p in range(item, min(item + S.ROW, pm.extent)):
            c = pm.pages[p]
            side = "full" if pm.side == "full" else "SWA"
            tip = f"{side} page {p}: {c.describe()}" + (f" | differs: {'; '.join(c.differs)}" if c.differs else "")
            body.append(_cell_svg(LW + (p - item) * CW, y, c, p in involved, f"{pm.side} page {p}", tip))
        y += CH
    width = LW + S.ROW * CW
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 4}" viewBox="0 0 {width} {y + 4}" '
        f'role="img" aria-label="{_e(pm.title)}">{"".join(body)}</svg>'
    )


def _snapshot_html(snap: S.Snapshot, heading: str) -> str:
    parts = [f"<section><h3>{_e(heading)}</h3>"]
    for n in snap.notes:
        parts.append(f"<p>{_e(n)}</p>")
    for pm in snap.pools:
        parts.append(
            f"<h4>{_e(pm.title)}: {pm.num_pages} pages of {pm.page_size} slots; free pages model {pm.model_free}, "
            f"target {pm.target_free}; differing {pm.differing}</h4>"
        )
        parts.append(map_svg(pm))
    if snap.req_slots is not None:
        parts.append(f"<p>request slots (ring mode): <code>{_e(' '.join(snap.req_slots))}</code></p>")
    sizes = ", ".join(f"{k} {m}" + ("" if t == m else f" (target {t})") for k, (m, t) in snap.sizes.items())
    parts.append(f"<p>sizes: {_e(sizes)}</p>")
    parts.append("</section>")
    return "".join(parts)


def _peer_text(cell) -> str:
    """Where a timeline cell's pairs point: ->SWA pages of a full page, <-full pages of an
    SWA page (slots for slot rows); a few characters, the tooltip has them all."""
    if isinstance(cell, S.SlotState):
        peers = (cell.peer,) if cell.peer else ()
    else:
        peers = cell.peers
    if not peers:
        return ""
    text = ("\u2192" if cell.side == "full" else "\u2190") + S.join_ints(peers)
    return text if len(text) <= 6 else text[:5] + "\u2026"


def timeline_svg(shown: S.Shown) -> str:
    rows = shown.timeline
    steps = shown.trace.steps[: shown.index + 1]
    lw, tw, th = 130, 40, 30
    width, height = lw + len(steps) * tw + 4, 24 + len(rows) * th + 4
    body = []
    for i, step in enumerate(steps):
        body.append(f'<text class="head" x="{lw + i * tw + tw / 2:g}" y="10">{i}<title>{_e(f"step {i}: {step!r}")}</title></text>')
    x = lw + shown.index * tw
    body.append(f'<rect class="shown" x="{x}" y="18" width="{tw - 1}" height="{len(rows) * th + 4}"/>')
    for j, row in enumerate(rows):
        y = 20 + j * th
        body.append(f'<g data-row="{_e(row.key)}"><text class="label" x="{lw - 6}" y="{y + th / 2:g}">{_e(row.key.replace("swa", "SWA"))}</text>')
        for i, cell in enumerate(row.cells):
            cls, fill = _fill(cell)
            classes = ["cell", cls] + (["differs"] if disagrees(cell) else [])
            tip = f"after step {i} {steps[i]!r}: {row.key.replace('swa', 'SWA')}: {cell.describe()}"
            body.append(
                f'<rect class="{" ".join(dict.fromkeys(classes))}" x="{lw + i * tw}" y="{y}" width="{tw - 1}" height="{th - 1}"{fill}>'
                f"<title>{_e(tip)}</title></rect>"
                f'<text x="{lw + i * tw + tw / 2:g}" y="{y + 10}">{_e(cell.symbol)}</text>'
                f'<text class="peer" x="{lw + i * tw + tw / 2:g}" y="{y + 22}">{_e(_peer_text(cell))}</text>'
            )
        body.append("</g>")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="timeline of the involved pages and slots">{"".join(body)}</svg>'
    )


def _involved_table(shown: S.Shown) -> str:
    before = {(pm.side, p): pm.pages.get(p) for pm in (shown.before.pools if shown.before else []) for p in pm.pages}
    rows = ["<table><tr><th>pool</th><th>page</th><th>before</th><th>at</th><th>differs</th></tr>"]
    for pm in shown.at.pools:
        for p in pm.involved:
            c = pm.pages.get(p)
            if c is None:
                continue
            b = before.get((pm.side, p))
            rows.append(
                f'<tr data-key="{_e(pm.side)} page {p}"><td>{"full" if pm.side == "full" else "SWA"}</td><td>{p}</td>'
                f"<td>{_e(b.describe()) if b else ''}</td><td>{_e(c.describe())}</td>"
                f'<td class="bad">{_e("; ".join(c.differs) or ("yes" if disagrees(c) else ""))}</td></tr>'
            )
    for st in shown.at.slots:
        rows.append(
            f'<tr data-key="{_e(st.side)} slot {st.slot}"><td>{"full" if st.side == "full" else "SWA"}</td><td>slot {st.slot}</td>'
            f'<td></td><td>{_e(st.describe())}</td><td class="bad">{"yes" if st.differs else ""}</td></tr>'
        )
    rows.append("</table>")
    return "".join(rows)


def page(shown: S.Shown) -> str:
    """The whole page as one XHTML string (it parses as XML)."""
    t = shown.trace
    title = f"{t.name}: {shown.outcome} on {shown.target}"
    out = [
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n',
        '<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8"/>',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<pre>{_e(chr(10).join(_outcome_lines(shown)))}</pre>",
    ]
    if shown.at is None:
        out.append(f"<p>{_e(shown.unreadable or 'no map: the target did not build the configuration')}</p></body></html>\n")
        return "".join(out)
    out.append("<h2>Page map</h2>")
    out.append(
        '<p class="legend"><span>P</span>padding <span>.</span>free <span>rN</span>request N <span>r+</span>several '
        "<span>o</span>owned, no live request <span>H</span>held by the open free group <span>x</span>beyond the pool "
        "&#160; black border: involved &#160; red border: model and target differ. Hover a cell for its state.</p>"
    )
    out.append('<div class="maps">')
    if shown.before is not None:
        out.append(_snapshot_html(shown.before, f"before: state {shown.before.label}"))
    out.append(_snapshot_html(shown.at, _where(shown)))
    out.append("</div>")
    out.append("<h2>Involved pages and slots</h2>")
    out.append(_involved_table(shown))
    if shown.timeline:
        out.append(
            "<h2>Timeline</h2><p>Each involved page and slot after every step: the model's owner, and under it where "
            "its pairs point (&#8594; SWA pages of a full page, &#8592; full pages of an SWA page). A red border marks "
            "where the target disagrees; hover a cell for both sides.</p>"
        )
        out.append(timeline_svg(shown))
    if t.steps:
        out.append('<h2>Steps</h2><ol class="steps" start="0">')
        for i, step in enumerate(t.steps):
            mark = " (fails here)" if i == shown.failing else ""
            cls = ' class="shown"' if i == shown.index else ""
            out.append(f"<li{cls}><code>{_e(repr(step))}</code>{_e(mark)}</li>")
        out.append("</ol>")
    out.append("</body></html>\n")
    return "".join(out)
