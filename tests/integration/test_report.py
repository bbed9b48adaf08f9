"""The report page (docs/gpuckptfs.md, "report.html"): the mount's
report.html and `gpuckpt report --html FILE`, on real processes
checkpointed through a real mount by root and by an ordinary user.

Root's page shows both owners' processes and the whole store, the user's
only their own process and what their checkpoints hold; each process's
table holds exactly what its checkpoints' manifests say; the CLI writes
the same page (root from the store, the user a copy of the mount's), whole,
and refuses paths it cannot write. Each page is rendered in headless
Chromium: every chart is drawn (a point for each checkpoint and series, a
bar for each amount, none of them of zero size) and the page logs nothing
to the console (its Content-Security-Policy would log anything it tried to
fetch); its source names no address but SVG's namespace.

Run by ctest under wl_reaper:
    wl_reaper python3 -m pytest tests/integration/test_report.py
with GPUCKPTFS and WORKLOAD_BIN pointing at the built gpuckptfs and the
build directory. Needs root, /dev/fuse and CRIU (skipped, saying why,
without them) and Debian's chromium (failing, saying so, without it).
"""

import html
import html.parser
import json
import os
import re
import shutil
import stat
import subprocess

import pytest

from gpuckpt_testing import build
from gpuckpt_testing.filetools import read
from gpuckpt_testing.mount import cli, why_not_runnable
from gpuckpt_testing.processes import wait_for

pytestmark = pytest.mark.skipif(why_not_runnable() is not None,
                                reason=str(why_not_runnable()))

SVG_NAMESPACE = "http://www.w3.org/2000/svg"


# --- the page's source ---------------------------------------------------------

class Page(html.parser.HTMLParser):
    """What a report page's source says: its process sections (pid, owner)
    and its tables of numbers (each row's header and data-values). (Its
    charts are checked as Chromium draws them: assert_drawn.)"""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.processes = []  # (pid, owner)
        self.tables = []     # {"class", "pid", "rows": [(header, [values])]}
        self._pid = None
        self._table = None
        self._row = None
        self._in_header = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "section" and "process" in classes:
            self._pid = int(a["data-pid"])
            self.processes.append((self._pid, a["data-owner"]))
        elif tag == "table":
            self._table = {"class": " ".join(classes[1:]), "pid": self._pid, "rows": []}
            self.tables.append(self._table)
        elif tag == "tr" and self._table is not None:
            self._row = ["", []]
        elif tag == "th" and self._row is not None and a.get("scope") == "row":
            self._in_header = True
        elif tag == "td" and self._row is not None and "data-value" in a:
            self._row[1].append(a["data-value"])

    def handle_endtag(self, tag):
        if tag == "section":
            self._pid = None
        elif tag == "table":
            self._table = None
        elif tag == "tr" and self._row is not None:
            if self._row[0]:
                self._table["rows"].append((self._row[0], self._row[1]))
            self._row = None
        elif tag == "th":
            self._in_header = False

    def handle_data(self, data):
        if self._in_header and self._row is not None:
            self._row[0] += data

    def table(self, cls, pid=None):
        found = [t for t in self.tables if t["class"] == cls and t["pid"] == pid]
        assert len(found) == 1, f"{len(found)} tables of class {cls!r} for pid {pid}"
        return dict(found[0]["rows"])


def addresses(text):
    """Every http(s) address in `text` but SVG's namespace."""
    return [a for a in re.findall(r"https?://[^\s\"'<>)]*", text) if a != SVG_NAMESPACE]


def assert_self_contained(text):
    assert addresses(text) == [], addresses(text)
    for what in ("<script", "<link", "<img", "<iframe", "url(", "src=", "href=", "@import"):
        assert what not in text, f"the page has {what}"


def expected_row(manifest):
    """A process table's row for a checkpoint, from its manifest: logical,
    new and stored bytes, frozen time, time to durable."""
    frozen = manifest["extra"].get("stages", {}).get("frozen_s")
    return [str(manifest["logical_bytes"]), str(manifest["new_bytes"]),
            str(manifest["stored_bytes"]), frozen, manifest["duration_s"]]


def assert_rows_match(rows, manifests):
    """The process table `rows` ({id: values}) holds exactly `manifests`'
    checkpoints, each with its manifest's numbers."""
    assert sorted(rows) == sorted(m["id"] for m in manifests), rows
    for m in manifests:
        logical, added, stored, frozen, durable = rows[m["id"]]
        want = expected_row(m)
        assert [logical, added, stored] == want[:3], (m["id"], rows[m["id"]], want)
        assert (frozen == "" if want[3] is None else float(frozen) == want[3]), (m["id"], frozen)
        assert float(durable) == want[4], (m["id"], durable, want[4])


# --- Chromium -----------------------------------------------------------------

def chromium():
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("no chromium to render the report page with: tools/setup --test installs "
                    "it (Debian's chromium package)")
    return path


def run_chromium(tmp_path, *args):
    """Headless Chromium with `args`: its CompletedProcess, whose stderr is
    its log (the page's console messages included, as CONSOLE lines)."""
    argv = [chromium(), "--headless", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--disable-background-networking", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--enable-logging=stderr", "--v=0", *args]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"chromium {args}: exit {r.returncode}: {r.stderr[-3000:]}"
    return r


def console_messages(log):
    """The page's console messages in Chromium's log ("INFO:CONSOLE(12)]
    ..." or "INFO:CONSOLE:0] ..."): a page with no script logs only what
    went wrong (a refused fetch, a parse error)."""
    return [line for line in log.splitlines() if re.search(r":CONSOLE[:(]", line)]


# Loads the page in a frame of its own (untouched: its policy forbids
# scripts) and measures what Chromium laid out of its charts.
MEASURE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"></head><body>
<iframe id="report" src="PAGE" style="width:1200px;height:900px"></iframe>
<pre id="measured"></pre>
<script>
window.addEventListener("load", () => {
  const doc = document.getElementById("report").contentDocument;
  const size = (e) => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const charts = [...doc.querySelectorAll("svg.chart")].map((svg) => {
    const section = svg.closest("section.process");
    return {
      classes: svg.getAttribute("class"),
      pid: section ? Number(section.dataset.pid) : null,
      marks: Number(svg.dataset.marks),
      size: size(svg),
      points: [...svg.querySelectorAll("circle.point")].map(
          (c) => ({series: c.classList[1], size: size(c)})),
      bars: [...svg.querySelectorAll("rect.bar")].map(
          (b) => ({value: Number(b.dataset.value), size: size(b)})),
    };
  });
  document.getElementById("measured").textContent = JSON.stringify(charts);
});
</script></body></html>
"""


def rendered_charts(tmp_path, page_path):
    """The charts of the page at `page_path` as Chromium lays them out:
    [{"classes", "pid", "marks", "size", "points": [{series, size}],
    "bars": [{value, size}]}], sizes as [width, height]."""
    harness = tmp_path / f"measure-{os.path.basename(page_path)}"
    harness.write_text(MEASURE.replace("PAGE", os.path.basename(page_path)))
    assert os.path.dirname(page_path) == str(tmp_path)
    dom = run_chromium(tmp_path, "--allow-file-access-from-files", "--dump-dom",
                       f"file://{harness}").stdout
    m = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert m and m.group(1), f"Chromium measured nothing:\n{dom[-2000:]}"
    return json.loads(html.unescape(m.group(1)))


def assert_drawn(tmp_path, page_path, expected):
    """Chromium draws the page at `page_path` without a console message,
    and its charts as `expected` says: {(class, pid): {series: points}} for
    charts of points, {(class, pid): bars} for charts of bars; every chart
    and point of non-zero size, every bar as long as its value says (none
    for nothing)."""
    log = run_chromium(tmp_path, "--dump-dom", f"file://{page_path}").stderr
    assert console_messages(log) == [], "\n".join(console_messages(log))
    charts = rendered_charts(tmp_path, page_path)
    drawn = {}
    for c in charts:
        key = (c["classes"].replace("chart ", "", 1), c["pid"])
        assert key not in drawn, f"two charts {key}"
        assert c["size"][0] > 0 and c["size"][1] > 0, (key, c["size"])
        if c["points"]:
            by_series = {}
            for p in c["points"]:
                assert p["size"][0] > 0 and p["size"][1] > 0, (key, p)
                by_series[p["series"]] = by_series.get(p["series"], 0) + 1
            assert sum(by_series.values()) == c["marks"], (key, c)
            drawn[key] = by_series
        else:
            for b in c["bars"]:  # as long as its value says: none for nothing
                assert (b["size"][0] > 0) == (b["value"] > 0) and b["size"][1] > 0, (key, b)
            assert len(c["bars"]) == c["marks"], (key, c)
            drawn[key] = len(c["bars"])
    assert drawn == expected


def expected_charts(processes, whole_store, owners=0, top=0):
    """What assert_drawn expects of a page of `processes` ({pid:
    manifests}): per process its sizes (three points a checkpoint) and its
    times (a frozen point where recorded, a durable one for each)."""
    out = {("store-sizes", None): 4 if whole_store else 2}
    if owners:
        out[("holders owners", None)] = owners
    if top:
        out[("holders checkpoints", None)] = top
    for pid, manifests in processes.items():
        n = len(manifests)
        out[("bytes-over-time", pid)] = {"logical": n, "new": n, "stored": n}
        frozen = sum(1 for m in manifests if expected_row(m)[3] is not None)
        out[("times-over-time", pid)] = {"durable": n, **({"frozen": frozen} if frozen else {})}
    return out


def screenshot(tmp_path, page_path):
    shot = tmp_path / f"{os.path.basename(page_path)}.png"
    run_chromium(tmp_path, "--window-size=1100,2400", f"--screenshot={shot}",
                 f"file://{page_path}")
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10000, len(data)


# --- the tests -----------------------------------------------------------------

def manifests_of(mount, ids):
    return [json.loads(read(mount.path("checkpoints", i, "manifest.json"))) for i in ids]


def wait_until_settled(mount):
    """Until every checkpoint is chunked, deduplicated and compressed: its
    new and stored bytes are final then."""
    wait_for(lambda: "\ngpuckpt_store_spooled_bytes 0\n" in read(mount.path("metrics")), 120,
             "the store to settle")


def test_root_sees_every_owner_a_user_their_own_and_chromium_draws_them(mount, users,
                                                                          tmp_path):
    user, _ = users
    mine = mount.start("wl_memory", "--mib", "8")
    theirs = mount.start("wl_memory", "--mib", "4", user=user)
    my_ids = [mount.checkpoint(mine.pid), mount.checkpoint(mine.pid)]
    their_ids = [mount.checkpoint(theirs.pid, user=user), mount.checkpoint(theirs.pid, user=user)]
    wait_until_settled(mount)
    mine_m, theirs_m = manifests_of(mount, my_ids), manifests_of(mount, their_ids)

    # The mount: listed for everyone, 0444, of the moment it is read.
    assert "report.html" in os.listdir(mount.mnt)
    st = os.stat(mount.path("report.html"))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444

    root_text = read(mount.path("report.html"))
    ok, user_text = user.read(mount.path("report.html"))
    assert ok, user_text
    for text in (root_text, user_text):
        assert_self_contained(text)

    root_page = Page(root_text)
    assert sorted(root_page.processes) == sorted([(mine.pid, "root"), (theirs.pid, user.name)])
    assert_rows_match(root_page.table("checkpoints", mine.pid), mine_m)
    assert_rows_match(root_page.table("checkpoints", theirs.pid), theirs_m)
    sizes = root_page.table("store-sizes")
    assert sizes["checkpoints"] == ["4"], sizes
    assert sizes["logical"] == [str(sum(m["logical_bytes"] for m in mine_m + theirs_m))], sizes
    assert set(sizes) == {"checkpoints", "logical", "after dedup", "stored (compressed)",
                          "on disk"}, sizes
    assert sorted(root_page.table("holders owners")) == sorted(["root", user.name])

    # The user's: their process alone, what their checkpoints hold, and
    # nothing of root's or of the store as a whole.
    user_page = Page(user_text)
    assert user_page.processes == [(theirs.pid, user.name)]
    assert_rows_match(user_page.table("checkpoints", theirs.pid), theirs_m)
    sizes = user_page.table("store-sizes")
    assert set(sizes) == {"checkpoints", "logical", "held (stored)"}, sizes
    assert sizes["checkpoints"] == ["2"]
    assert int(sizes["held (stored)"][0]) > 0
    assert sorted(user_page.table("holders checkpoints")) == sorted(their_ids)
    for secret in my_ids + [f'data-pid="{mine.pid}"', "on disk", "<h3>Owners</h3>"]:
        assert secret not in user_text, secret

    # The CLI: root's from the store, the user's a copy of the mount's.
    root_file = tmp_path / "root-cli.html"
    r = cli(mount.store, "report", "--html", str(root_file))
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r
    assert stat.S_IMODE(root_file.stat().st_mode) == 0o600  # a new file is private
    cli_page = Page(root_file.read_text())
    assert sorted(cli_page.processes) == sorted(root_page.processes)
    for pid, manifests in ((mine.pid, mine_m), (theirs.pid, theirs_m)):
        assert_rows_match(cli_page.table("checkpoints", pid), manifests)
    assert cli_page.table("store-sizes")["logical"] == root_page.table("store-sizes")["logical"]

    theirs_dir = os.path.join(mount.work, "user-report")
    os.makedirs(theirs_dir)
    os.chown(theirs_dir, user.uid, user.gid)
    user_file = os.path.join(theirs_dir, "mine.html")
    r = user.run([build.GPUCKPT_CLI, "--store", mount.store, "report", "--html", user_file])
    assert r.returncode == 0 and r.stderr == "", r
    copied = read(user_file)
    assert Page(copied).processes == user_page.processes
    assert_rows_match(Page(copied).table("checkpoints", theirs.pid), theirs_m)
    assert os.stat(user_file).st_uid == user.uid

    # Chromium draws each page whole, and the page says nothing in its console.
    root_copy, user_copy = tmp_path / "root.html", tmp_path / "user.html"
    root_copy.write_text(root_text)
    user_copy.write_text(copied)
    everyone = {mine.pid: mine_m, theirs.pid: theirs_m}
    assert_drawn(tmp_path, str(root_copy), expected_charts(everyone, True, owners=2, top=4))
    assert_drawn(tmp_path, str(root_file), expected_charts(everyone, True, owners=2, top=4))
    assert_drawn(tmp_path, str(user_copy),
                 expected_charts({theirs.pid: theirs_m}, False, top=2))
    screenshot(tmp_path, str(root_copy))
    assert mine.verdict() == "PASS" and theirs.verdict() == "PASS"


def test_the_cli_writes_whole_files_and_refuses_paths_it_cannot_write(mount, users, tmp_path):
    def report(path, *more):
        r = cli(mount.store, *more, "report", "--html", str(path))
        return r.returncode, r.stderr.strip()

    # Bad usage: no file named.
    r = cli(mount.store, "report")
    assert r.returncode == 2, r

    # Paths that cannot be a report: one line each, naming the path.
    missing_dir = tmp_path / "no-such-dir" / "r.html"
    rc, said = report(missing_dir)
    assert rc == 1 and str(missing_dir) in said and "No such file or directory" in said, said
    assert len(said.splitlines()) == 1, said
    rc, said = report(tmp_path)
    assert rc == 1 and "is a directory" in said, said
    rc, said = report(str(tmp_path) + "/")
    assert rc == 1 and "directory" in said, said
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc, said = report(fifo)  # refused at once, never opened (which would block)
    assert rc == 1 and "not a regular file" in said, said
    rc, said = report(mount.path("report-here.html"))  # the mount takes no new files
    assert rc == 1 and "Operation not permitted" in said, said

    # A file is replaced whole, keeping its mode; nothing else is left.
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "report.html"
    target.write_text("old")
    target.chmod(0o644)
    rc, said = report(target)
    assert rc == 0, said
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert os.listdir(out_dir) == ["report.html"]
    # A symlink is replaced, not written through.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    link = out_dir / "link.html"
    link.symlink_to(elsewhere)
    rc, said = report(link)
    assert rc == 0, said
    assert not link.is_symlink() and link.read_text().startswith("<!DOCTYPE html>")
    assert elsewhere.read_text() == "untouched"
    # An empty store's page says so.
    assert "No checkpoints." in target.read_text()

    # An ordinary user without a mount to read is told where to look.
    user, _ = users
    r = user.run([build.GPUCKPT_CLI, "--store", mount.store, "--mount",
                  os.path.join(mount.work, "no-mount"),
                  "report", "--html", os.path.join(mount.work, "x.html")])
    assert r.returncode == 1 and "no report.html in" in r.stderr, r
