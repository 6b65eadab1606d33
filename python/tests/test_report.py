"""attn report: one self-contained HTML page of the concentration experiments. The page built
from the checked-in results is opened in a real headless Chromium (Debian package `chromium`,
installed by scripts/install-deps.sh), which must render every image and inline SVG, find every
in-page link's target and log no error; the write-up's numbers are checked against the JSON."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attn
from conftest import HANG_SECONDS, cli_path

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"
CONCENTRATION = FIGURES / "concentration"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed to check the report page and was not found on PATH: install the "
                "Debian package 'chromium' (scripts/install-deps.sh does)", pytrace=False)


# Appended to a copy of the page: evaluates the checks once everything has loaded and writes the
# verdict into the DOM, which --dump-dom prints. Console errors are caught by wrapping
# console.error and listening for 'error' events (resource failures arrive in the capture phase).
CHECK_SCRIPT = r"""
<script>
(function () {
  var problems = [];
  var origError = console.error;
  console.error = function () { problems.push('console.error: ' + Array.prototype.join.call(arguments, ' ')); origError.apply(console, arguments); };
  window.addEventListener('error', function (e) {
    var t = e.target;
    problems.push('error event: ' + (e.message || (t && (t.src || t.href || t.tagName)) || 'unknown'));
  }, true);
  function check() {
    var imgs = Array.prototype.slice.call(document.images);
    var badImgs = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                      .map(function (i) { return (i.alt || '') + ' ' + String(i.src).slice(0, 40); });
    var svgs = Array.prototype.slice.call(document.querySelectorAll('svg'))
                    .filter(function (s) { return !(s.parentElement && s.parentElement.closest('svg')); });
    var badSvgs = svgs.filter(function (s) { var r = s.getBoundingClientRect(); return !(r.width > 0 && r.height > 0); })
                      .map(function (s) { return s.getAttribute('aria-label') || 'svg'; });
    var links = Array.prototype.slice.call(document.querySelectorAll('a[href]'));
    var badLinks = links.map(function (a) { return a.getAttribute('href'); }).filter(function (h) {
      if (h.charAt(0) === '#') return !document.getElementById(decodeURIComponent(h.slice(1)));
      return !/^https?:\/\//.test(h);
    });
    var external = Array.prototype.slice.call(document.querySelectorAll('[src]'))
                        .map(function (e) { return e.getAttribute('src'); })
                        .filter(function (s) { return s.indexOf('data:') !== 0; });
    document.body.setAttribute('data-check', JSON.stringify({
      title: document.title, images: imgs.length, bad_images: badImgs, svgs: svgs.length, bad_svgs: badSvgs,
      links: links.length, bad_links: badLinks, external_sources: external, problems: problems,
      sections: Array.prototype.map.call(document.querySelectorAll('section[id]'), function (s) { return s.id; })
    }));
  }
  if (document.readyState === 'complete') check(); else window.addEventListener('load', check);
})();
</script>
"""


def _browser_verdict(page: Path, tmp_path: Path) -> dict:
    probe = tmp_path / "probe.html"
    text = page.read_text(encoding="utf-8")
    # the probe script goes first in <head>, so it hears errors raised while the page loads
    probe.write_text(text.replace("<head>", "<head>" + CHECK_SCRIPT, 1), encoding="utf-8")
    return _probe_verdict(probe, tmp_path, "check")


def _probe_verdict(probe: Path, tmp_path: Path, script: str, window: str = "") -> dict:
    """Opens `probe` in headless Chromium and returns the JSON its `script` left in the body's
    data-check attribute."""
    import html
    cmd = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
           *([f"--window-size={window}"] if window else []), "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, f"chromium failed ({p.returncode}): {p.stderr[-2000:]}"
    m = re.search(r'<body[^>]*\sdata-check="([^"]*)"', p.stdout)
    assert m, f"the {script} script left no verdict in the DOM; chromium said: {p.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1)))


@pytest.fixture(scope="module")
def checked_in_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    info = attn.report.build([CONCENTRATION, FIGURES, FIGURES / "titans", FIGURES / "gemma3", FIGURES / "finetune"], out)
    return out, info


def test_page_from_the_checked_in_results_renders_in_chromium(checked_in_page, tmp_path):
    page, info = checked_in_page
    assert info["sections"] == {"curves": "ok", "needle": "ok", "scale": "ok", "titans_needle": "ok", "model": "ok",
                                "ppl": "ok", "train": "ok", "gemma": "ok", "finetune": "ok"}
    v = _browser_verdict(page, tmp_path)
    assert v["title"].startswith("attn report")
    assert v["images"] == 8 and v["bad_images"] == [], v  # the eight experiments' plots, decoded
    assert v["svgs"] >= 1 and v["bad_svgs"] == [], v      # the perplexity chart, laid out
    assert v["links"] >= 6 and v["bad_links"] == [], v
    assert v["external_sources"] == [] and v["problems"] == [], v
    assert v["sections"] == ["curves", "needle", "scale", "titans_needle", "model", "train", "gemma", "finetune"]


def test_the_browser_check_sees_broken_pages(tmp_path):
    # the probe itself: a broken image, an empty SVG, a dangling anchor, a relative link and a
    # script error must all be reported
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><title>t</title></head><body>'
                   '<img src="data:image/png;base64,AAAA" alt="broken"><svg width="0" height="0"></svg>'
                   '<a href="#nowhere">x</a><a href="other.html">y</a>'
                   '<script>console.error("oops"); undefinedFunction();</script></body></html>')
    v = _browser_verdict(bad, tmp_path)
    assert v["bad_images"] and v["bad_svgs"] == ["svg"] and v["bad_links"] == ["#nowhere", "other.html"]
    assert any("oops" in p for p in v["problems"]) and any("undefinedFunction" in p for p in v["problems"])


# The layout check: the page is loaded into same-origin iframes 1280 px and 390 px wide (a
# desktop and a phone; headless Chromium will not make its window narrower than 500 px, an iframe
# is its own viewport for the page's media queries). The rule, per width:
#   - no cell clips its text: every th/td has scrollWidth <= clientWidth + 1;
#   - numbers stay on one line: every td.num has white-space: nowrap;
#   - at 1280 px every table fits its column (nothing to scroll to find a number);
#   - at 390 px a table wider than its column sits in an overflow-x: auto/scroll wrapper, so it
#     scrolls sideways by itself and every number can be reached;
#   - the page is no wider than the viewport (documentElement.scrollWidth <= innerWidth); outside
#     such a wrapper no element reaches past the viewport's right edge and no text spills out of
#     its box (a long path or mechanism string: scrollWidth > clientWidth with overflow visible).
WIDTHS = (1280, 390)
LAYOUT_SCRIPT = r"""
<script>
function layoutOf(win, mustFit) {
  var doc = win.document, bad = [];
  function name(e) {
    var t = e.closest('table'), c = t && t.caption ? ' in "' + t.caption.textContent.slice(0, 50) + '"' : '';
    return e.tagName.toLowerCase() + (e.className && typeof e.className === 'string' ? '.' + e.className : '') +
           ' "' + e.textContent.trim().slice(0, 30) + '"' + c;
  }
  function scroller(e) {  // the nearest ancestor that scrolls sideways, or null
    for (var a = e.parentElement; a && a !== doc.body; a = a.parentElement) {
      var o = win.getComputedStyle(a).overflowX;
      if (o === 'auto' || o === 'scroll') return a;
    }
    return null;
  }
  Array.prototype.forEach.call(doc.querySelectorAll('th, td'), function (c) {
    if (c.scrollWidth > c.clientWidth + 1) bad.push('clipped cell ' + name(c) + ': ' + c.scrollWidth + ' > ' + c.clientWidth);
    if (c.classList.contains('num') && win.getComputedStyle(c).whiteSpace !== 'nowrap') bad.push('number may wrap: ' + name(c));
  });
  Array.prototype.forEach.call(doc.querySelectorAll('table'), function (t) {
    var box = t.parentElement, w = t.getBoundingClientRect().width;
    if (w <= box.clientWidth + 1) return;
    if (mustFit) bad.push('table wider than its column (' + Math.round(w) + ' > ' + box.clientWidth + ' px): ' + name(t));
    else if (!scroller(t)) bad.push('table wider than its column and not in a scrolling wrapper: ' + name(t));
  });
  var vw = win.innerWidth;
  if (doc.documentElement.scrollWidth > vw) bad.push('page ' + doc.documentElement.scrollWidth + ' px wide in a ' + vw + ' px viewport');
  Array.prototype.forEach.call(doc.body.querySelectorAll('*'), function (e) {
    if (e.closest('svg') && e.tagName.toLowerCase() !== 'svg') return;
    var r = e.getBoundingClientRect();
    if (scroller(e) || e.tagName.toLowerCase() === 'svg') return;
    if (r.width > 0 && r.right > vw + 1) {  // named once: the outermost element past the edge
      if (e.parentElement.getBoundingClientRect().right <= vw + 1) bad.push('past the right edge (' + Math.round(r.right) + ' px): ' + name(e));
    }
    else if (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1 && win.getComputedStyle(e).overflowX === 'visible')
      bad.push('text spills out (' + e.scrollWidth + ' > ' + e.clientWidth + ' px): ' + name(e));
  });
  return {width: vw, problems: bad.slice(0, 40), count: bad.length};
}
window.addEventListener('load', function () {
  var out = {};
  Array.prototype.forEach.call(document.querySelectorAll('iframe'), function (f) {
    out[f.width] = layoutOf(f.contentWindow, f.width >= 1000);
  });
  document.body.setAttribute('data-check', JSON.stringify(out));
});
</script>
"""


def _layout_verdict(page: Path, tmp_path: Path) -> dict:
    import html
    text = html.escape(page.read_text(encoding="utf-8"), quote=True)
    frames = "".join(f'<iframe width="{w}" height="1500" style="border:0;display:block" srcdoc="{text}"></iframe>'
                     for w in WIDTHS)
    probe = tmp_path / "layout.html"
    probe.write_text(f"<!DOCTYPE html><html><head><title>layout</title></head><body>{frames}{LAYOUT_SCRIPT}</body></html>",
                     encoding="utf-8")
    return {int(k): v for k, v in _probe_verdict(probe, tmp_path, "layout", "1400,1000").items()}


def test_tables_show_every_number_at_desktop_and_phone_width(checked_in_page, tmp_path):
    v = _layout_verdict(checked_in_page[0], tmp_path)
    assert sorted(v) == sorted(WIDTHS) and all(v[w]["width"] == w for w in WIDTHS), v
    for w in WIDTHS:
        assert v[w]["problems"] == [], f"at {w} px: {v[w]}"


def test_the_layout_check_sees_clipped_and_overflowing_pages(tmp_path):
    bad = tmp_path / "bad.html"
    wide_row = "".join(f'<td class="num">{i}.123456789</td>' for i in range(30))
    bad.write_text('<!DOCTYPE html><html><head><title>t</title><style>td.num { white-space: nowrap; }</style></head>'
                   '<body><table><tr><td class="num" style="max-width:3rem;overflow:hidden">123456789.123456</td>'
                   '<td class="num" style="white-space:normal">1 2</td></tr></table>'
                   f'<div style="width:20rem"><table><caption>wide</caption><tr>{wide_row}</tr></table></div>'
                   '<div style="overflow-x:auto"><table><caption>scrolls</caption><tr>' + wide_row + '</tr></table></div>'
                   f'<p style="width:10rem">{"x" * 60}</p>'
                   '</body></html>')
    v = _layout_verdict(bad, tmp_path)
    for w in WIDTHS:
        p = " | ".join(v[w]["problems"])
        assert "clipped cell td.num \"123456789.123456\"" in p and "number may wrap: td.num \"1 2\"" in p, p
        assert "table wider than its column" in p and '"wide"' in p and "past the right edge" in p, p
        assert "page " in p and f"px wide in a {w} px viewport" in p and 'text spills out' in p and '"xxxx' in p, p
    # the scrolling wrapper is accepted on the phone, never on the desktop
    assert '"scrolls"' in " ".join(v[1280]["problems"]) and '"scrolls"' not in " ".join(v[390]["problems"])


# The charts attn eval-ppl draws (tools/svg_chart.cpp: panels side by side, one <g> each, every
# point labelled): rendered in Chromium at their own size, every text's box must stay inside its
# panel's column and no two texts of a panel may overlap (by more than 2 px each way: labels are
# stacked 11 px apart in 10 px type).
SVG_LABEL_SCRIPT = r"""
<script>
window.addEventListener('load', function () {
  var svg = document.querySelector('svg'), panels = svg.querySelectorAll(':scope > g'), bad = [];
  var box = svg.getBoundingClientRect(), w = box.width / panels.length;
  Array.prototype.forEach.call(panels, function (g, i) {
    var lo = box.left + i * w, hi = lo + w;
    var texts = Array.prototype.map.call(g.querySelectorAll('text'), function (t) {
      return {text: t.textContent, r: t.getBoundingClientRect()};
    });
    texts.forEach(function (a, j) {
      if (a.r.left < lo - 1 || a.r.right > hi + 1)
        bad.push('panel ' + i + ': "' + a.text + '" spans ' + Math.round(a.r.left - lo) + '..' + Math.round(a.r.right - lo) + ' of 0..' + Math.round(w));
      texts.slice(j + 1).forEach(function (b) {
        var dx = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
        var dy = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
        if (dx > 2 && dy > 2) bad.push('panel ' + i + ': "' + a.text + '" overlaps "' + b.text + '"');
      });
    });
  });
  document.body.setAttribute('data-check', JSON.stringify({panels: panels.length, problems: bad}));
});
</script>
"""


def _svg_label_verdict(svg: Path, tmp_path: Path) -> dict:
    probe = tmp_path / "labels.html"
    probe.write_text("<!DOCTYPE html><html><head><title>labels</title></head><body style=\"margin:0\">"
                     + svg.read_text(encoding="utf-8") + SVG_LABEL_SCRIPT + "</body></html>", encoding="utf-8")
    return _probe_verdict(probe, tmp_path, "label", "1400,1000")


def test_eval_ppl_chart_labels_stay_in_their_panel_and_apart(tmp_path):
    v = _svg_label_verdict(FIGURES / "eval_ppl_smollm2.svg", tmp_path)
    assert v["panels"] == 2 and v["problems"] == [], v


def test_the_label_check_sees_labels_across_panels(tmp_path):
    bad = tmp_path / "bad.svg"
    bad.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="400" height="100">'
                   '<g transform="translate(0,0)"><text x="150" y="50" font-size="10">a label far too long for its panel</text>'
                   '<text x="10" y="20" font-size="10">one</text><text x="12" y="22" font-size="10">two</text></g>'
                   '<g transform="translate(200,0)"><text x="10" y="50" font-size="10">fine</text></g></svg>')
    v = _svg_label_verdict(bad, tmp_path)
    assert v["panels"] == 2 and len(v["problems"]) == 2, v
    assert v["problems"][0].startswith('panel 0: "a label far too long for its panel" spans 150..') \
        and v["problems"][1] == 'panel 0: "one" overlaps "two"', v


def test_page_is_self_contained(checked_in_page):
    text = checked_in_page[0].read_text(encoding="utf-8")
    assert "<script" not in text.lower()
    for attr in re.findall(r'\s(?:src|href)="([^"]*)"', text):
        assert attr.startswith(("data:", "#", "http://", "https://")), attr
    assert not re.search(r"url\((?!['\"]?data:)", text)  # no stylesheet fetches either
    assert checked_in_page[1]["bytes"] == len(text.encode("utf-8")) < 2 * 1024 * 1024


def _pct(x):
    return attn.report.pct(x)


def test_findings_numbers_come_from_the_json(checked_in_page):
    text = _page_text(checked_in_page[0])
    needle = json.loads((CONCENTRATION / "needle.json").read_text())
    n = max(r["n"] for r in needle)
    w = {r["mechanism"]: r["needle_weight"] for r in needle if r["n"] == n}
    lin = max(v for k, v in w.items() if k.startswith("linear"))
    assert f"softmax puts {_pct(w['softmax'])} of its weight" in text
    assert f"{attn.report.num(w['softmax'] / lin, 2)}× less" in text
    scale = json.loads((CONCENTRATION / "scale.json").read_text())
    ws = {r["text"]: r["needle_weight"] for r in scale if r["n"] == n}
    assert f"{attn.report.num(ws['softmax:entropy_scale=512'] / ws['softmax'], 2)}× more" in text
    model = json.loads((CONCENTRATION / "model.json").read_text())
    smol = [r for r in model if r["model"] == "SmolLM2-135M"]
    top = max(smol, key=lambda r: r["sink_mass"])
    assert f"head {top['head']} of layer {top['layer']} puts {attn.report.pct(top['sink_mass'], 2)} there" in text
    layer0 = [r["sparsity"] for r in smol if r["layer"] == 0]
    assert f"the first layer has S {attn.report.num(sum(layer0) / len(layer0), 2)} and entropy" in text
    ppl = {r["mechanism"]: r["perplexity"] for r in json.loads((FIGURES / "eval_ppl_smollm2.json").read_text())["rows"]}
    assert f"exact {attn.report.num(ppl['softmax:causal'], 4)}" in text
    curves = json.loads((CONCENTRATION / "curves.json").read_text())
    s_exp = [r["sparsity"] for r in curves if r["curve"] == "exp (softmax)" and r["gamma"] == 4.0]
    assert f"S = {attn.report.num(s_exp[0])} for every β" in text


def _page_text(path: Path) -> str:
    import html
    t = path.read_text(encoding="utf-8")
    t = re.sub(r"<style>.*?</style>|<svg.*?</svg>", "", t, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", t))


def _needle_rows(n_hi=4096, soft=0.123456, lin=0.000321):
    rows = []
    for n in (64, n_hi):
        for mech, w, s, sees in (("softmax", soft if n == n_hi else 0.9, 0.2, True),
                                 ("softmax window 256", 0.0, 0.05, n == 64),
                                 ("linear elu+1", lin if n == n_hi else 0.02, 0.99, True)):
            rows.append({"mechanism": mech, "text": mech, "n": n, "strength": 8.0, "needle_weight": w,
                         "sparsity": s, "entropy": 1.0, "max_weight": w, "sees_needle": sees})
    return rows


def test_synthetic_numbers_reach_the_page(tmp_path):
    (tmp_path / "needle.json").write_text(json.dumps(_needle_rows()))
    info = attn.report.build(tmp_path, tmp_path / "r.html")
    assert info["sections"]["needle"] == "ok"
    text = _page_text(tmp_path / "r.html")
    assert "At n = 4\u202f096 keys softmax puts 12.3\u202f% of its weight" in text
    assert "puts 0.0321\u202f%, 385× less" in text
    assert "softmax window 256: weight exactly 0 at n = 4\u202f096" in text
    assert "3\u202f071 keys before the query" in text  # 4096 - 1 - 1024


def _train_rows(skipped="retention"):
    rows = []
    for mech, losses, accs, in_view in (("softmax", (4.9, 0.0123), (0.01, 0.987), 1.0),
                                        ("window+sinks", (4.9, 2.5), (0.01, 0.2468), 0.2), ("elu-linear", (4.9, 3.21), (0.01, 0.1234), 1.0)):
        for step, loss, acc in zip((0, 500), losses, accs):
            rows.append({"mechanism": mech, "description": f"<{mech}>", "in_view": in_view, "step": step, "loss": loss,
                         "accuracy": acc, "answer_weight": acc * 0.9, "answer_sparsity": 0.5, "answer_layer": 2,
                         "seconds": 1.0, "note": "", "pairs": 16, "seq_len": 64, "d_model": 64,
                         "heads": 4})
    rows.append({"mechanism": skipped, "description": "", "in_view": 1.0, "step": 0, "loss": None, "accuracy": None,
                 "answer_weight": None, "answer_sparsity": None,
                 "seconds": 0.0, "note": "not trainable yet: ValueError: no backward", "pairs": 16, "seq_len": 64,
                 "d_model": 64, "heads": 4})
    return rows


def test_training_numbers_reach_the_page(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps(_train_rows()))
    info = attn.report.build(tmp_path, tmp_path / "r.html")
    assert info["sections"]["train"] == "ok"
    text = _page_text(tmp_path / "r.html")
    assert "Softmax answers 98.7\u202f% of the queries after 500 steps (loss 4.9 → 0.0123)" in text
    assert "its layer 2 puts 88.8\u202f% of a query's weight on the one position that holds the answer (S = 0.5" in text
    assert "elu-linear: 12.3\u202f% after 500 steps, 8× less than softmax (loss 4.9 → 3.21)" in text
    assert "window+sinks: 24.7\u202f%; only 20\u202f% of the queries have their pair" in text
    assert "It stays below even that share" not in text
    assert "retention is not in the curves: not trainable yet: ValueError: no backward." in text
    assert "16 key-value pairs in 64 tokens" in text and "&lt;softmax&gt;" in (tmp_path / "r.html").read_text()


def test_missing_inputs_name_the_command_and_draw_no_image(tmp_path):
    (tmp_path / "needle.json").write_text(json.dumps(_needle_rows()))  # no needle.png either
    info = attn.report.build([tmp_path], tmp_path / "r.html")
    assert info["sections"] == {"curves": "missing", "needle": "ok", "scale": "missing", "titans_needle": "missing",
                                "model": "missing", "ppl": "missing", "train": "missing", "gemma": "missing",
                                "finetune": "missing"}
    text = _page_text(tmp_path / "r.html")
    for name in ("curves", "scale", "model"):
        assert f"No {name}.json was found in {tmp_path}" in text
        assert f"attn concentration {name} --out docs/figures/concentration" in text
    assert "attn eval-ppl --model" in text and "No an attn" not in text
    assert "No train.json was found" in text and "python -m attn.lab.experiments train --out docs/figures/concentration" in text
    assert "No gemma.json was found" in text and "python -m attn.lab.experiments gemma --out docs/figures/gemma3" in text
    assert "No plot beside" in text
    assert "<img" not in (tmp_path / "r.html").read_text()


def test_unreadable_input_gets_a_section_not_a_crash(tmp_path):
    (tmp_path / "scale.json").write_text("[{\"mechanism\": 1}]")
    (tmp_path / "curves.json").write_text("{not json")
    info = attn.report.build(tmp_path, tmp_path / "r.html")
    assert info["sections"]["scale"] == "error" and info["sections"]["curves"] == "error"
    text = _page_text(tmp_path / "r.html")
    assert "Could not read" in text and "attn concentration scale" in text


def test_text_from_the_inputs_is_escaped(tmp_path):
    rows = _needle_rows()
    for r in rows:
        if r["mechanism"] == "softmax window 256":
            r["mechanism"] = "<script>alert('x')</script> & <b>"
    (tmp_path / "needle.json").write_text(json.dumps(rows))
    ppl = {"model": "/m/<i>model</i>.gguf", "tokens": 8,
           "rows": [{"mechanism": "softmax:causal", "perplexity": 2.0, "seconds": 1, "kv_mib": 1, "kv_ratio": 1,
                     "note": "a \"quoted\" <note>"}]}
    (tmp_path / "eval_ppl_x.json").write_text(json.dumps(ppl))
    (tmp_path / "eval_ppl_x.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" onload="alert(1)">'
        '<script>alert(2)</script><a href="evil.html"><rect width="5" height="5"/></a><text>ok &amp; &lt;</text></svg>')
    attn.report.build(tmp_path, tmp_path / "r.html")
    raw = (tmp_path / "r.html").read_text()
    assert "<script" not in raw and "<b>" not in raw and "<i>" not in raw and "<note>" not in raw
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;" in raw
    assert "a &quot;quoted&quot; &lt;note&gt;" in raw
    assert "onload" not in raw and "evil.html" not in raw and "ok &amp; &lt;" in raw


def test_write_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "r.html"
    # a failure while the page is built: nothing is written
    monkeypatch.setattr(attn.report, "render", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        attn.report.build(tmp_path, out)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    # a failure while writing: an existing page is left as it was, and no temporary file remains
    out.write_text("old page")

    class Boom(Exception):
        pass

    real_fsync = os.fsync

    def failing_fsync(fd):
        raise Boom()

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(Boom):
        attn.report.build(tmp_path, out)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert out.read_text() == "old page" and sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
    attn.report.build(tmp_path, out)
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_run_runs_the_missing_experiments_with_progress(tmp_path):
    data, old = tmp_path / "new" / "data", tmp_path / "old"  # the run's directory is made
    old.mkdir()
    (old / "needle.json").write_text(json.dumps(_needle_rows()))
    p = subprocess.run([sys.executable, "-m", "attn.lab.report", "--out", str(tmp_path / "r.html"), "--from", str(data),
                        "--from", str(old), "--run", "curves", "--quick"], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr
    assert "[1/1] running curves (quick)" in p.stderr and "[1/1] curves: 222 rows in" in p.stderr
    assert (data / "curves.png").exists() and "wrote" in p.stdout and "without scale, titans_needle, model, ppl, train, gemma, finetune" in p.stdout
    page = (tmp_path / "r.html").read_text()
    assert 'id="curves"' in page and "At n = 4\u202f096 keys softmax" in page


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="unknown experiment 'needles'"):
        attn.report.build(tmp_path, tmp_path / "r.html", run="needles")
    with pytest.raises(FileNotFoundError, match="no such file"):
        attn.report.build([tmp_path / "nope"], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_number_format():
    num, pct = attn.report.num, attn.report.pct
    assert num(0.026957) == "0.027" and num(12.3456) == "12.3" and num(2.3162e-5) == "2.32e-5"
    assert num(65536) == "65\u202f536" and num(0) == "0" and num(float("nan")) == "n/a"
    assert pct(0.026957) == "2.7\u202f%" and pct(4.48e-24) == "4.48e-24"
    assert math.isclose(float(num(1 / 3)), 0.333)


def test_attn_report_command(tmp_path):
    env = dict(os.environ, ATTN_PYTHON=sys.executable)
    out = tmp_path / "r.html"
    p = subprocess.run([str(cli_path()), "report", "--out", str(out), "--from", str(CONCENTRATION), "--from",
                        str(FIGURES)], capture_output=True, text=True, timeout=HANG_SECONDS, env=env)
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size > 100_000 and "wrote" in p.stdout
    p = subprocess.run([str(cli_path()), "report", "--out", str(tmp_path / "x.html")], capture_output=True,
                       text=True, timeout=HANG_SECONDS, env=dict(os.environ, ATTN_PYTHON=str(tmp_path / "no-python")))
    assert p.returncode == 2 and "attn report runs the Python package" in p.stderr and "set ATTN_PYTHON" in p.stderr


def test_checked_in_page_matches_the_checked_in_results(tmp_path, monkeypatch):
    # docs/figures/concentration/report.html is the page of the results beside it, built from the
    # repository's root with the default inputs
    monkeypatch.chdir(ROOT)
    attn.report.build(None, tmp_path / "report.html")
    fresh = (tmp_path / "report.html").read_text(encoding="utf-8")
    kept = (CONCENTRATION / "report.html").read_text(encoding="utf-8")
    unversioned = lambda page: re.sub(r"\(attn [^)]*\)", "(attn)", page)  # a release alone changes nothing
    assert unversioned(kept) == unversioned(fresh), \
        "docs/figures/concentration/report.html is stale: rebuild it with " \
        "`attn report --out docs/figures/concentration/report.html` from the repository's root"


def test_titans_section_states_what_retrieves_beyond_the_window():
    def row(form, d, cos, acc):
        return {"form": form, "distance": d, "d": 128, "window": 32, "trials": 4, "cosine": cos, "accuracy": acc,
                "beyond_window": d > 32}
    rows = [row("sliding window (32 earlier tokens)", 8, 1.0, 1.0), row("sliding window (32 earlier tokens)", 64, 0.01, 0),
            row("sliding window (32 earlier tokens)", 256, -0.02, 0), row("memory", 8, 0.9, 1.0),
            row("memory", 64, 0.8, 1.0), row("memory", 256, 0.3, 0.25), row("MAG", 8, 1.0, 1.0), row("MAG", 64, 0.0, 0),
            row("MAG", 256, 0.0, 0)]
    table, facts = attn.report.titans_section(rows)
    assert "D = 256" in table and "0.8 (100" in table
    assert facts[0].startswith("Beyond the window (D > 32) the window alone finds nothing: cosine 0.01 at best")
    assert "memory retrieve it in most trials up to D = 64, 2× the window (100" in facts[1]
    assert facts[2].startswith("MAG: no better than the window")


def test_out_in_a_missing_directory_is_refused_and_nothing_is_made(tmp_path):
    # as every output of the CLI: a missing parent directory is an error, never created
    out = tmp_path / "a" / "b" / "r.html"
    p = subprocess.run([sys.executable, "-m", "attn.lab.report", "--out", str(out)], capture_output=True, text=True,
                       timeout=HANG_SECONDS, cwd=ROOT)
    assert p.returncode == 2 and f"--out {out}: no directory '{out.parent}' to write it in" in p.stderr, p.stderr
    assert not (tmp_path / "a").exists()
