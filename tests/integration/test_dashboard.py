"""contrib/grafana/gpuckpt-dashboard.json, the Grafana dashboard of the
metrics (contrib/README.md; docs/gpuckptfs.md, "metrics").

The dashboard is valid: a Grafana dashboard whose data source is the
import-time input DS_PROMETHEUS, every panel with a unique id and queries,
every query PromQL that promtool parses. And it asks only for what a mount
says: every metric name of every query is in the `metrics` file of a real
gpuckptfs after a checkpoint (a histogram's _bucket, _sum and _count series
as samples of a family declared a histogram), with the labels the query
selects or groups by; the shared pool's metrics, which a daemon shows only
with --pool, in the metrics of a daemon on a one-node Ceph cluster's pool.

Run by ctest under wl_reaper:
    wl_reaper python3 -m pytest tests/integration/test_dashboard.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory. The mounts need root, /dev/fuse and CRIU, the pool Ceph
(tools/setup --test installs it), the query check promtool: each test is
skipped, saying why, without what it needs.
"""

import json
import os
import re
import shutil
import subprocess

import pytest

from gpuckpt_testing.build import REPO_ROOT
from gpuckpt_testing.filetools import read
from gpuckpt_testing.micro_ceph import MicroCeph
from gpuckpt_testing.mount import Mount, why_not_runnable

DASHBOARD = os.path.join(REPO_ROOT, "contrib", "grafana", "gpuckpt-dashboard.json")
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# Labels Prometheus adds to every scraped series: never in the file.
TARGET_LABELS = {"instance", "job"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
POOL = "gpuckpt"


def dashboard():
    with open(DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def all_panels(d):
    """Every panel, those inside rows included."""
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def queries(d):
    """(panel title, expr) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in all_panels(d) if p["type"] != "row"
            for t in p["targets"]]


def metric_names(expr):
    return set(re.findall(r"\b(gpuckpt_[a-z0-9_]+)\b", expr))


def selected_labels(expr):
    """{metric: label names its selectors match on} of `expr`."""
    out = {}
    for name, matchers in re.findall(r"\b(gpuckpt_[a-z0-9_]+)\{([^}]*)\}", expr):
        out.setdefault(name, set()).update(
            re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"", matchers))
    return out


def grouping_labels(expr):
    """The label names of every `by (...)` of `expr`."""
    return {label.strip() for group in re.findall(r"\bby\s*\(([^)]*)\)", expr)
            for label in group.split(",") if label.strip()}


class Exposition:
    """What a metrics file says: the families declared (# TYPE name type),
    and each sample name with the label names it is seen with."""

    def __init__(self, text):
        self.types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        self.labels = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s", line)
            assert m, f"not a sample line: {line!r}"
            self.labels.setdefault(m.group(1), set()).update(
                re.findall(r"(\w+)=\"", m.group(2) or ""))

    def family(self, sample):
        """The family a sample name belongs to: a histogram's _bucket, _sum
        and _count are its own name with the suffix."""
        for suffix in HISTOGRAM_SUFFIXES:
            base = sample[:-len(suffix)]
            if sample.endswith(suffix) and self.types.get(base) == "histogram":
                return base
        return sample


def missing_from(text, only):
    """What the dashboard's queries ask for of the metrics `text` that it
    lacks, for the metrics `only` says yes to: one line each."""
    shown = Exposition(text)
    missing = []
    for title, expr in queries(dashboard()):
        names = {n for n in metric_names(expr) if only(n)}
        for name in sorted(names):
            if name not in shown.labels:
                missing.append(f"{title}: {name} is not in the metrics")
                continue
            family = shown.family(name)
            if family not in shown.types:
                missing.append(f"{title}: {name} has no # TYPE line (family {family})")
            if name.endswith(HISTOGRAM_SUFFIXES) and family == name:
                missing.append(f"{title}: {name} looks like a histogram's but {name} is a "
                               f"{shown.types.get(name)}")
            for label in selected_labels(expr).get(name, set()) - TARGET_LABELS:
                if label not in shown.labels[name]:
                    missing.append(f"{title}: {name} has no label {label}")
        if names:
            known = set().union(*(shown.labels.get(n, set()) for n in metric_names(expr)))
            for label in grouping_labels(expr) - TARGET_LABELS - known:
                missing.append(f"{title}: grouped by {label}, which none of its metrics has")
        # histogram_quantile(q, ... NAME ...): the first metric after it.
        for after in expr.split("histogram_quantile(")[1:]:
            quantile = re.search(r"\bgpuckpt_[a-z0-9_]+", after).group(0)
            if not (quantile.endswith("_bucket") and
                    shown.types.get(quantile[:-len("_bucket")]) == "histogram"):
                missing.append(f"{title}: histogram_quantile of {quantile}, no histogram's buckets")
    return missing


def is_pool_metric(name):
    return name.startswith("gpuckpt_pool_")


# --- the dashboard alone --------------------------------------------------------

def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_input():
    d = dashboard()
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int)
    inputs = {i["name"]: i for i in d["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    # Nothing names a data source of some other Grafana.
    text = json.dumps(d)
    assert set(re.findall(r"\$\{(\w+)\}", text)) == {"DS_PROMETHEUS"}
    for variable in d["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable

    panels = all_panels(d)
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), ids
    for p in panels:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["title"] and p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], f"{p['title']} has no queries"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), (p["title"], refs)
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == DATASOURCE, (p["title"], t)
            assert metric_names(t["expr"]), (p["title"], t["expr"])

    # What the dashboard is for: each of these is asked for by some panel.
    asked = set().union(*(metric_names(e) for _, e in queries(d)))
    for wanted in ("gpuckpt_operations_total", "gpuckpt_checkpoint_logical_bytes_total",
                   "gpuckpt_checkpoint_new_bytes_total", "gpuckpt_checkpoint_stored_bytes_total",
                   "gpuckpt_stage_duration_seconds_bucket",
                   "gpuckpt_checkpoint_frozen_seconds_bucket", "gpuckpt_store_logical_bytes",
                   "gpuckpt_store_stored_bytes", "gpuckpt_chunk_cache_requests_total",
                   "gpuckpt_pool_pushes_total", "gpuckpt_pool_pending_checkpoints"):
        assert wanted in asked, wanted
    exprs = " ".join(e for _, e in queries(d))
    assert "histogram_quantile(0.95, sum by (le, operation, stage) (rate(" \
           "gpuckpt_stage_duration_seconds_bucket" in exprs
    assert "histogram_quantile(0.99, sum by (le) (rate(gpuckpt_checkpoint_frozen_seconds_bucket" \
           in exprs


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="no promtool (Debian's prometheus package; tools/setup --test "
                           "installs it) to parse the queries with")
def test_every_query_is_promql_that_promtool_parses(tmp_path):
    # Grafana's variables as Grafana would fill them in.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}",
         "expr": expr.replace("$__rate_interval", "5m").replace("$instance", ".*")}
        for i, (_, expr) in enumerate(queries(dashboard()))]}]}
    path = tmp_path / "rules.json"  # YAML's superset: promtool reads JSON as it is
    path.write_text(json.dumps(rules))
    r = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# --- against real mounts -----------------------------------------------------------

needs_a_mount = pytest.mark.skipif(why_not_runnable() is not None,
                                   reason=str(why_not_runnable()))


def checkpointed_metrics(mount):
    """The mount's metrics after a checkpoint of a process."""
    wl = mount.start("wl_memory", "--mib", "4")
    mount.checkpoint(wl.pid)
    text = read(mount.path("metrics"))
    assert wl.verdict() == "PASS"
    return text


@needs_a_mount
def test_every_metric_the_panels_ask_for_is_in_a_mounts_metrics(mount):
    text = checkpointed_metrics(mount)
    assert "gpuckpt_pool_" not in text  # a daemon without a pool shows none of them
    missing = missing_from(text, only=lambda name: not is_pool_metric(name))
    assert missing == [], "\n".join(missing)


def why_no_ceph():
    tools = ("ceph-mon", "ceph-osd", "ceph-mgr", "rados")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"no {', '.join(missing)} (Debian's Ceph packages; tools/setup --test installs them)"
    return None


@needs_a_mount
@pytest.mark.skipif(why_no_ceph() is not None, reason=str(why_no_ceph()))
def test_the_pool_panels_metrics_are_in_a_pooled_mounts_metrics(tmp_path):
    (tmp_path / "ceph").mkdir()
    ceph = MicroCeph(str(tmp_path / "ceph"), pools=(POOL,))
    try:
        mount = Mount("gpuckpt-dashboard-pool.", "--pool", POOL, "--ceph-conf", ceph.conf,
                      "--pool-timeout", "20")
        try:
            text = checkpointed_metrics(mount)
        finally:
            mount.close()
    finally:
        ceph.stop()
    assert f'gpuckpt_pool_pushes_total{{pool="{POOL}",result="ok"}} 1' in text, text
    missing = missing_from(text, only=lambda name: True)
    assert missing == [], "\n".join(missing)
