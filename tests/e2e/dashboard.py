#!/usr/bin/env python3
"""The Grafana dashboard's queries against a Prometheus (tests/e2e/dashboard.sh runs it).

check:  every query of every panel, and the node variable's label_values, through
        /api/v1/query with the template variables substituted as Grafana would; each must
        parse and return a series with a number (not NaN), except those in EXPECTED_EMPTY,
        which must still parse. Polls until all pass or --deadline seconds have gone, then
        names each failing query with its text.
render: each panel's queries as query_range since --since, laid out by gridPos into an
        HTML page (SVG lines, stat values, bar gauges) for a headless browser to screenshot,
        since Grafana itself cannot be installed here; prints the page's WIDTH,HEIGHT.
Standard library only.
"""
import argparse
import html
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request

# Series that cannot exist where the test runs, and why; their queries must still parse.
EXPECTED_EMPTY = {
    "csi_sidecar_operations_seconds": "external-provisioner's own endpoint: the sidecar runs only "
    "in Kubernetes (the chart's DaemonSet), not beside this standalone driver",
}
RATE_INTERVAL = "1m"


def substitute(expr, rate_interval=RATE_INTERVAL):
    """The template variables as Grafana expands them: All of node is its allValue."""
    for var, value in (
        ("__rate_interval", rate_interval),
        ("__interval", "15s"),
        ("__range", "1h"),
        ("node", ".*"),
    ):
        expr = expr.replace("${%s}" % var, value).replace("$" + var, value)
    if "$" in expr:
        raise ValueError(f"an unsubstituted variable in {expr!r}")
    return expr


def queries(dashboard):
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"], t.get("legendFormat", "")


def api(prom, path, **params):
    url = f"{prom}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # 400/422 carry Prometheus' error JSON
        return json.load(e)


def finite(v):
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


def check_one(prom, expr):
    """None when the query returns a series with a number, else why not."""
    r = api(prom, "query", query=substitute(expr))
    if r.get("status") != "success":
        return f"{r.get('errorType')}: {r.get('error')}"
    result = r["data"]["result"]
    if not result:
        return "no series"
    if not any(finite(s["value"][1]) for s in result):
        return f"{len(result)} series, none with a number (NaN or Inf)"
    return None


def expected_empty(expr):
    return next((why for m, why in EXPECTED_EMPTY.items() if m in expr), None)


def check(args):
    dash = json.load(open(args.dashboard))
    node_var = next(v for v in dash["templating"]["list"] if v["name"] == "node")
    m = re.fullmatch(r"label_values\((\w+), *(\w+)\)", node_var["query"]["query"])
    if not m:
        print(f"FAIL - the node variable's query {node_var['query']['query']!r} is no label_values(METRIC, LABEL)")
        return 1
    deadline = time.monotonic() + args.deadline
    while True:
        failures, passed, empty = [], 0, []
        r = api(args.prometheus, f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
        if r.get("status") != "success" or not r["data"]:
            failures.append(("variable node", "", node_var["query"]["query"], f"no values: {r}"))
        for title, ref, expr, _ in queries(dash):
            why = expected_empty(expr)
            if why:
                r = api(args.prometheus, "query", query=substitute(expr))
                if r.get("status") != "success":
                    failures.append((title, ref, expr, f"{r.get('errorType')}: {r.get('error')}"))
                else:
                    empty.append((title, ref, why))
                continue
            problem = check_one(args.prometheus, expr)
            if problem:
                failures.append((title, ref, expr, problem))
            else:
                passed += 1
        if not failures or time.monotonic() > deadline:
            break
        time.sleep(1)
    for title, ref, why in empty:
        print(f"ok   - parses, expected empty: {title} [{ref}]: {why}")
    for title, ref, expr, problem in failures:
        print(f"FAIL - {title} [{ref}]: {problem}\n       {expr}\n       as run: {substitute(expr)}")
    print(f"dashboard queries: {passed} passed, {len(failures)} failed, {len(empty)} expected empty "
          f"(and the node variable's values)")
    return 1 if failures else 0


# --- render -----------------------------------------------------------------------------

COL, ROW = 64, 30  # pixels per grid column (24 to the page) and per grid row
COLORS = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9",
          "#705da0", "#508642", "#cca300", "#447ebc", "#c15c17", "#890f02", "#0a437c"]


def legend(fmt, metric):
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip()
    return text or ",".join(f"{k}={v}" for k, v in metric.items()) or "value"


def human(v, unit):
    if v is None or not math.isfinite(v):
        return "-"
    if unit == "percentunit":
        return f"{v * 100:.0f}%"
    if unit in ("bytes", "Bps"):
        suffix = "/s" if unit == "Bps" else ""
        for u in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1000 or u == "TiB":
                return f"{v:.3g} {u}{suffix}"
            v /= 1024
    if unit == "s":
        return f"{v * 1e3:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    suffix = {"reqps": " req/s", "ops": " op/s"}.get(unit, "")
    return f"{v:.3g}{suffix}"


def series_of(prom, panel, start, end, step):
    out = []
    for t in panel.get("targets", []):
        r = api(prom, "query_range", query=substitute(t["expr"]), start=start, end=end, step=step)
        if r.get("status") != "success":
            continue
        for s in r["data"]["result"]:
            pts = [(float(ts), float(v)) for ts, v in s["values"] if finite(v)]
            if pts:
                out.append((legend(t.get("legendFormat", ""), s["metric"]), pts))
    return out


def svg_lines(series, w, h, unit, start, end, stacked):
    pad_l, pad_b, pad_t = 84, 18, 6
    pw, ph = w - pad_l - 8, h - pad_b - pad_t
    if stacked:  # cumulative sums at each timestamp, in series order
        acc, stacked_series = {}, []
        for name, pts in series:
            new = [(ts, v + acc.get(ts, 0.0)) for ts, v in pts]
            acc.update(dict(new))
            stacked_series.append((name, new))
        series = stacked_series
    vals = [v for _, pts in series for _, v in pts]
    lo = min(0.0, min(vals)) if vals else 0.0
    hi = max(vals) if vals else 1.0
    if hi <= lo:
        hi = lo + 1.0
    x = lambda ts: pad_l + (ts - start) / max(end - start, 1) * pw
    y = lambda v: pad_t + ph - (v - lo) / (hi - lo) * ph
    parts = [f'<svg width="{w}" height="{h}">']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        parts.append(f'<line x1="{pad_l}" x2="{pad_l + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{pad_l - 4}" y="{y(v) + 4:.1f}" class="axis" text-anchor="end">'
                     f"{html.escape(human(v, unit))}</text>")
    ticks = max(2, min(4, w // 150))
    for i in range(ticks):
        ts = start + (end - start) * i / (ticks - 1)
        anchor = "start" if i == 0 else "end" if i == ticks - 1 else "middle"
        parts.append(f'<text x="{x(ts):.1f}" y="{h - 4}" class="axis" text-anchor="{anchor}">'
                     f'{time.strftime("%H:%M:%S", time.gmtime(ts))}</text>')
    for i, (name, pts) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{x(ts):.1f},{y(v):.1f}" for ts, v in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        if len(pts) == 1:  # a lone sample draws no line
            parts.append(f'<circle cx="{x(pts[0][0]):.1f}" cy="{y(pts[0][1]):.1f}" r="2.5" fill="{c}"/>')
    parts.append("</svg>")
    return "".join(parts)


def color_for(panel, v):
    d = panel.get("fieldConfig", {}).get("defaults", {})
    for m in d.get("mappings", []):
        hit = m.get("options", {}).get(str(int(v))) if math.isfinite(v) and v == int(v) else None
        if hit:
            return hit.get("color", "#555"), hit.get("text")
    color = "#555"
    for step in d.get("thresholds", {}).get("steps", []):
        if step["value"] is None or v >= step["value"]:
            color = step["color"]
    return color, None


NAMED = {"green": "#37872d", "red": "#c4162a", "orange": "#fa6400", "blue": "#1f60c4"}


def render_panel(prom, p, start, end, step):
    g = p["gridPos"]
    left, top, w, h = g["x"] * COL, g["y"] * ROW, g["w"] * COL - 6, g["h"] * ROW - 6
    style = f"left:{left}px;top:{top}px;width:{w}px;height:{h}px"
    if p["type"] == "row":
        return f'<div class="row" style="{style}">{html.escape(p["title"])}</div>'
    unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    series = series_of(prom, p, start, end, step)
    body = ""
    if not series:
        body = '<div class="nodata">No data</div>'
    elif p["type"] == "timeseries":
        stacked = p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        body = svg_lines(series, w - 12, h - 30 - 18 * min(len(series), 3 if h > 200 else 2), unit, start, end, stacked)
        body += '<div class="legend">' + "".join(
            f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>{html.escape(name)}</span>'
            for i, (name, _) in enumerate(series)) + "</div>"
    elif p["type"] == "stat":
        cells = []
        for name, pts in series:
            v = pts[-1][1]
            color, text = color_for(p, v)
            cells.append(f'<div class="stat" style="background:{NAMED.get(color, color)}">'
                         f'<div class="sname">{html.escape(name)}</div>'
                         f'<div class="sval">{html.escape(text or human(v, unit))}</div></div>')
        body = '<div class="stats">' + "".join(cells) + "</div>"
    elif p["type"] == "bargauge":
        rows = []
        hi = max(max(pts[-1][1] for _, pts in series), 1.0 if unit == "percentunit" else 0.0) or 1.0
        for name, pts in series:
            v = pts[-1][1]
            color, _ = color_for(p, v)
            rows.append(f'<div class="bar"><span class="bname">{html.escape(name)}</span>'
                        f'<span class="btrack"><span style="width:{max(0.0, v / hi) * 100:.1f}%;'
                        f'background:{NAMED.get(color, color)}"></span></span>'
                        f'<span class="bval">{html.escape(human(v, unit))}</span></div>')
        body = "".join(rows)
    return (f'<div class="panel" style="{style}"><div class="title">{html.escape(p["title"])}</div>'
            f"{body}</div>")


CSS = """
body{margin:0;background:#111217;color:#ccccdc;font:12px 'DejaVu Sans',sans-serif}
.top{height:40px;line-height:40px;padding-left:10px;font-size:17px;border-bottom:1px solid #2c2d33}
.top small{font-size:12px;color:#8e8e9e;margin-left:14px}
.grid{stroke:#2c2d33}.axis{fill:#8e8e9e;font-size:10px}
.page{position:relative;margin:8px}
.panel{position:absolute;background:#181b1f;border:1px solid #2c2d33;border-radius:2px;overflow:hidden;padding:4px 6px}
.row{position:absolute;font-size:15px;font-weight:bold;color:#d8d9da;line-height:30px}
.title{font-weight:bold;margin-bottom:2px;white-space:nowrap;overflow:hidden}
.legend span{display:inline-block;margin-right:12px;white-space:nowrap;font-size:11px}
.legend i{display:inline-block;width:12px;height:3px;margin-right:4px;vertical-align:middle}
.stats{display:flex;gap:4px;height:calc(100% - 22px)}
.stat{flex:1;border-radius:2px;color:#fff;display:flex;flex-direction:column;justify-content:center;align-items:center}
.sname{font-size:11px}.sval{font-size:26px;font-weight:bold}
.bar{display:flex;align-items:center;margin:6px 0}.bname{width:38%;overflow:hidden;white-space:nowrap;font-size:11px}
.btrack{flex:1;height:16px;background:#22252b;margin:0 6px}.btrack span{display:block;height:100%}
.bval{width:72px;text-align:right;font-weight:bold}
.nodata{color:#8e8e9e;text-align:center;margin-top:30px}
"""


def render(args):
    dash = json.load(open(args.dashboard))
    end = time.time()
    start = min(float(args.since), end - 10)
    step = max(1, int((end - start) / 300))
    panels = [render_panel(args.prometheus, p, start, end, step) for p in dash["panels"]]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dash["panels"])
    width, height = 24 * COL + 16, bottom * ROW + 40 + 16
    page = (f"<!doctype html><html><head><meta charset='utf-8'><style>{CSS}</style></head><body>"
            f'<div class="top">{html.escape(dash["title"])}<small>node: All · data source: Prometheus · '
            f'{time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))} to '
            f'{time.strftime("%H:%M:%S", time.gmtime(end))} · static rendering of '
            f"deploy/helm/gds-csi/dashboards/gds-csi.json</small></div>"
            f'<div class="page" style="height:{bottom * ROW}px">{"".join(panels)}</div></body></html>')
    open(args.html, "w").write(page)
    print(f"{width},{height}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "render"):
        s = sub.add_parser(name)
        s.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
        s.add_argument("--dashboard", required=True)
    sub.choices["check"].add_argument("--deadline", type=float, default=30)
    sub.choices["render"].add_argument("--since", required=True, help="unix time the range starts")
    sub.choices["render"].add_argument("--html", required=True)
    args = ap.parse_args()
    return check(args) if args.cmd == "check" else render(args)


if __name__ == "__main__":
    sys.exit(main())
