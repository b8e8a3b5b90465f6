#!/bin/bash
# tier: slow
# report.html in a real browser. A stories260K job (the e2e helpers' spec, scored on the
# eight benchmarks and sciq) runs to success; its report.html, fetched over HTTP, is
# rendered by headless Chromium (Debian's `chromium`, installed with apt-get when absent)
# into a 1200x2400 PNG. Checks: the PNG has that size, is not blank and shows the charts'
# bar colours; Chromium logged no console message (errors from a script or a bad SVG
# attribute); and in the browser itself, with real font metrics, no two x-axis labels of
# any chart overlap and none leaves its SVG. Control pages (a script error, a broken SVG,
# a blank page, overlapping labels) must each fail the same checks, so a check that
# silently stops working fails the test. AC_REPORT_KEEP=DIR keeps the page and PNG there.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
export AC_BIN=$(realpath "${AC_BIN:-$here/../../build/autocompress}")
export AC_SHARED=$(realpath "${AC_SHARED:-$here/../../../shared}")
if [ -z "${AC_PYTHON:-}" ]; then
    source "$here/../../scripts/pyenv.sh" >/dev/null || { echo "FAIL: no python environment"; exit 1; }
fi

if ! command -v chromium >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { echo "FAIL: chromium is not installed and installing it needs root"; exit 1; }
    echo "installing chromium (apt-get)"
    apt-get update -q >/dev/null || { echo "FAIL: apt-get update failed"; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null ||
        { echo "FAIL: apt-get install chromium failed"; exit 1; }
fi
chromium --version

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export AC_BROWSER_TMP=$tmp AC_E2E_DIR=$here
"$AC_PYTHON" - <<'EOF'
import os, re, shutil, struct, subprocess, sys, zlib

import numpy as np

sys.path.insert(0, os.environ["AC_E2E_DIR"])
from e2e_common import server, stories_spec, wait_terminal  # noqa: E402

TMP = os.environ["AC_BROWSER_TMP"]
W, H = 1200, 2400
EIGHT = ["arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande", "boolq", "openbookqa", "lambada_openai"]
COLOURS = {"parent bars": (0x9a, 0xa5, 0xb1), "result bars": (0x2f, 0x6f, 0xb0)}


def chromium(args, page):
    """Run headless Chromium on page (a file path); returns (stdout, stderr)."""
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=%d,%d" % (W, H),
           "--enable-logging=stderr", "--v=0"] + args + ["file://" + page]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, "chromium exited %d:\n%s" % (p.returncode, p.stderr[-3000:])
    return p.stdout, p.stderr


def png_read(path):
    """(width, height, pixels uint8 [h, w, channels]) of a non-interlaced 8-bit PNG,
    decoded here with zlib (no imaging library needed)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "%s is not a PNG" % path
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and ctype in (0, 2, 4, 6), "unexpected PNG header %s" % (ihdr,)
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    stride = w * bpp
    rows = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, stride + 1)
    out = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(h):
        ft, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if ft == 0:
            cur = line
        elif ft == 1:   # Sub: a running sum per channel
            cur = (np.cumsum(line.reshape(w, bpp), axis=0) & 0xFF).reshape(stride)
        elif ft == 2:   # Up
            cur = (line + prev) & 0xFF
        else:           # Average, Paeth: sequential along the row
            cur, p = line.tolist(), prev.tolist()
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                if ft == 3:
                    cur[i] = (cur[i] + ((a + p[i]) >> 1)) & 0xFF
                else:
                    b, c = p[i], (p[i - bpp] if i >= bpp else 0)
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            cur = np.array(cur, np.int32)
        out[y] = cur
        prev = cur
    return w, h, out.reshape(h, w, bpp)


def screenshot_faults(page, want_colours):
    """Render page to a PNG; the faults found in it and in Chromium's log (empty: fine)."""
    png = page[:-5] + ".png"
    if os.path.exists(png):
        os.unlink(png)
    _, log = chromium(["--screenshot=" + png], page)
    faults = []
    # Console messages are logged as INFO:CONSOLE (Chromium 156) or ERROR:CONSOLE
    # (older): this page has no script, so any console line is a fault.
    for line in log.splitlines():
        if re.search(r":CONSOLE\b", line) or "Uncaught" in line:
            faults.append("console: " + line.strip())
    if not os.path.exists(png):
        return faults + ["no PNG written"]
    w, h, px = png_read(png)
    if (w, h) != (W, H):
        faults.append("PNG is %dx%d, not %dx%d" % (w, h, W, H))
    rgb = px[:, :, :3] if px.shape[2] >= 3 else np.repeat(px[:, :, :1], 3, axis=2)
    flat = rgb.reshape(-1, 3)
    non_white = int(np.count_nonzero(np.any(flat < 250, axis=1)))
    distinct = len(np.unique(flat[:: 7].astype(np.uint32) @ np.array([65536, 256, 1], np.uint32)))
    print("%s: %dx%d, %d non-white pixels (%.2f%%), >= %d colours" %
          (os.path.basename(png), w, h, non_white, 100.0 * non_white / flat.shape[0], distinct))
    if non_white < 0.01 * flat.shape[0] or distinct < 16:
        faults.append("blank: %d non-white pixels, %d colours" % (non_white, distinct))
    for name, c in want_colours.items():
        n = int(np.count_nonzero(np.all(flat == np.array(c, np.uint8), axis=1)))
        if n < 200:
            faults.append("%s (#%02x%02x%02x) cover %d pixels" % ((name,) + c + (n,)))
    return faults


# Runs in the browser on a copy of the page: for each chart, the x-axis labels (text below
# the axis line) as boxes from getBBox() mapped through getCTM() (rotation included),
# intersected pairwise (separating axes) and against the SVG's bounds.
CHECK_JS = r"""
<script>
(function () {
  var out = [];
  function corners(t) {
    var b = t.getBBox(), m = t.getCTM(), r = [];
    [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]].forEach(
      function (p) { var q = new DOMPoint(p[0], p[1]).matrixTransform(m); r.push([q.x, q.y]); });
    return r;
  }
  function separated(a, b) {
    var polys = [a, b];
    for (var k = 0; k < 2; k++) for (var e = 0; e < 4; e++) {
      var p = polys[k][e], q = polys[k][(e + 1) % 4], nx = p[1] - q[1], ny = q[0] - p[0];
      var len = Math.hypot(nx, ny); nx /= len; ny /= len;
      var pa = a.map(function (c) { return c[0] * nx + c[1] * ny; });
      var pb = b.map(function (c) { return c[0] * nx + c[1] * ny; });
      if (Math.max.apply(null, pa) <= Math.min.apply(null, pb) + 0.5 ||
          Math.max.apply(null, pb) <= Math.min.apply(null, pa) + 0.5) return true;
    }
    return false;
  }
  document.querySelectorAll('figure').forEach(function (fig) {
    var cap = fig.querySelector('figcaption').textContent, svg = fig.querySelector('svg');
    var axis = parseFloat(svg.querySelector('line').getAttribute('y1'));
    var sw = svg.width.baseVal.value, sh = svg.height.baseVal.value, labels = [];
    svg.querySelectorAll('text').forEach(function (t) {
      if (parseFloat(t.getAttribute('y')) > axis) labels.push({name: t.textContent, c: corners(t)});
    });
    var bad = 0;
    labels.forEach(function (l) {
      l.c.forEach(function (p) {
        if (p[0] < -0.5 || p[0] > sw + 0.5 || p[1] < axis - 0.5 || p[1] > sh + 0.5) {
          out.push('OUTSIDE|' + cap + '|' + l.name + '|' + p[0].toFixed(1) + ',' + p[1].toFixed(1)); bad++;
        }
      });
    });
    for (var i = 0; i < labels.length; i++) for (var j = i + 1; j < labels.length; j++)
      if (!separated(labels[i].c, labels[j].c)) {
        out.push('OVERLAP|' + cap + '|' + labels[i].name + '|' + labels[j].name); bad++;
      }
    out.push('CHART|' + cap + '|' + labels.length + '|' + labels.map(function (l) { return l.name; }).join(','));
  });
  var pre = document.createElement('pre');
  pre.id = 'ac-label-check';
  pre.textContent = out.join('\n');
  document.body.appendChild(pre);
})();
</script>
"""


def label_check(page):
    """Label geometry measured by the browser: (charts {caption: [labels]}, faults)."""
    with open(page) as f:
        html = f.read()
    probe = page[:-5] + ".probe.html"
    with open(probe, "w") as f:
        f.write(html.replace("</body>", CHECK_JS + "</body>"))
    dom, _ = chromium(["--dump-dom"], probe)
    m = re.search(r'<pre id="ac-label-check">(.*?)</pre>', dom, re.S)
    assert m, "the label probe did not run:\n" + dom[-2000:]
    charts, faults = {}, []
    for line in m.group(1).replace("&amp;", "&").splitlines():
        kind, rest = line.split("|", 1)
        if kind == "CHART":
            cap, n, names = rest.split("|")
            charts[cap] = names.split(",") if int(n) else []
        else:
            faults.append(kind + " " + rest)
    return charts, faults


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


# --- the checks must catch broken pages: each control fails the check named beside it
controls = {
    "script error": ("console", "<!DOCTYPE html><html><body><p>x</p>" + "<svg width='300' height='300'>" +
                     "".join("<rect x='%d' y='0' width='30' height='300' fill='#%02x6fb0'/>" % (i * 30, i * 20)
                             for i in range(10)) + "</svg><script>no_such_function();</script></body></html>"),
    "broken svg": ("console", "<!DOCTYPE html><html><body><svg width='300' height='300'>" +
                   "".join("<rect x='%d' y='0' width='30' height='300' fill='#%02x6fb0'/>" % (i * 30, i * 20)
                           for i in range(10)) +
                   "<rect x='0' y='0' width='abc' height='-5' fill='red'/></svg></body></html>"),
    "blank page": ("blank", "<!DOCTYPE html><html><body></body></html>"),
}
for name, (check, html) in controls.items():
    f = screenshot_faults(write(name.replace(" ", "_") + ".html", html), {})
    assert [x for x in f if x.startswith(check + ":")], "control '%s' passed the %s check: %s" % (name, check, f)
    print("control %-12s caught: %s" % (name, f[0][:150]))
overlap = write("overlap.html", "<!DOCTYPE html><html><body><figure><figcaption>c</figcaption>"
                "<svg xmlns='http://www.w3.org/2000/svg' width='300' height='100'>"
                "<line x1='0' y1='50' x2='300' y2='50' stroke='#444'/>"
                "<text x='100' y='62' font-size='10' text-anchor='middle'>lambada_openai</text>"
                "<text x='140' y='62' font-size='10' text-anchor='middle'>openbookqa</text></svg></figure></body></html>")
charts, f = label_check(overlap)
assert charts == {"c": ["lambada_openai", "openbookqa"]} and f and f[0].startswith("OVERLAP"), (charts, f)
print("control overlap      caught:", f[0])

# --- a real job's report
tasks = EIGHT + ["sciq"]
with server() as s:
    _, _, job = s.json("POST", "/v1/jobs", stories_spec(
        name="e2e-report-browser", evaluation={"tasks": tasks, "limit": 10, "seed": 1234}), expect=201)
    fin = wait_terminal(s, job["id"], 1500)
    assert fin["status"] == "succeeded", fin
    _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
    for who in ("parent", "result"):
        assert sorted(rep[who]["accuracy"]) == sorted(tasks), (who, sorted(rep[who]["accuracy"]))
    st, hd, body = s.request("GET", "/v1/jobs/%s/report.html" % job["id"])
    assert st == 200 and hd["content-type"].startswith("text/html"), (st, hd)
page = write("report.html", body.decode())

faults = screenshot_faults(page, COLOURS)
charts, label_faults = label_check(page)
for cap, names in charts.items():
    print("chart %-46s %2d x-axis labels" % (cap, len(names)))
assert sorted(charts.get("Accuracy per benchmark", [])) == sorted(tasks), charts
assert "Kept FFN width per layer" in charts and "Attention heads per layer" in charts, charts
keep = os.environ.get("AC_REPORT_KEEP")
if keep:
    os.makedirs(keep, exist_ok=True)
    for n in ("report.html", "report.png"):
        shutil.copy(os.path.join(TMP, n), os.path.join(keep, n))
    print("kept", os.path.join(keep, "report.png"))
assert not faults and not label_faults, "\n".join(faults + label_faults)
print("ok")
EOF
