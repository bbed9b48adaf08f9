"""--version names the commit built, and snapshots name the gpuckpt that
wrote them.

The three binaries say `NAME 0.1.0 (commit <hash>[-dirty])` for the source
tree they were built from; cmake/GpuckptVersion.cmake, which makes
gpuckpt/version.h at every build, is run on scratch git repositories
(committed, edited, a new commit, no git at all); a snapshot made by
`gpuckpt import` records `written_by`. No root, mount or CRIU needed.
"""

import json
import os
import re
import shutil
import subprocess
import time

import pytest

BUILD = os.environ.get("WORKLOAD_BIN", "")
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUCKPT = os.path.join(BUILD, "tools", "gpuckpt", "gpuckpt")
BINARIES = {
    "gpuckpt": GPUCKPT,
    "gpuckptfs": os.environ.get("GPUCKPTFS", ""),
    "cuda-checkpoint (gpuckpt)": os.path.join(BUILD, "libexec", "gpuckpt", "cuda-checkpoint"),
}
SCRIPT = os.path.join(SOURCE, "cmake", "GpuckptVersion.cmake")
GIT = shutil.which("git")


def run(args, **kwargs):
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, **kwargs)
    assert r.returncode == 0, f"{args}: exit {r.returncode}: {r.stderr}"
    return r.stdout


def git(repo, *args):
    # As the build asks it: a checkout owned by another user than root is
    # read all the same, and its index is never rewritten.
    return run([GIT, "--no-optional-locks", "-c", f"safe.directory={repo}", "-C", str(repo),
                "-c", "user.name=t", "-c", "user.email=t@t", *args]).strip()


def project_version():
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        return re.search(r"project\(gpuckpt VERSION ([0-9.]+)", f.read()).group(1)


def generate(source, out):
    """Runs the generator as the build does; the header's three macros."""
    run(["cmake", f"-DSOURCE_DIR={source}", f"-DOUTPUT={out}", "-DVERSION=1.2.3", "-P", SCRIPT])
    with open(out) as f:
        return dict(re.findall(r'#define (GPUCKPT_\w+) "([^"]*)"', f.read()))


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_version_names_the_commit_built(name):
    binary = BINARIES[name]
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{binary!r} is not built (WORKLOAD_BIN, GPUCKPTFS)")
    said = run([binary, "--version"]).strip()
    if GIT is None or not os.path.exists(os.path.join(SOURCE, ".git")):
        assert said == f"{name} {project_version()} (commit unknown: not built from a git checkout)"
        return
    commit = git(SOURCE, "rev-parse", "--short", "HEAD")
    if git(SOURCE, "status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    assert said == f"{name} {project_version()} (commit {commit})", (
        "built from another state of the source tree than this one (rebuild, then test)")


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_generated_header_follows_commits_and_edits(tmp_path):
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.cc").write_text("int a;\n")
    git(repo, "add", "a.cc")
    git(repo, "commit", "-q", "-m", "first")
    out = tmp_path / "include" / "gpuckpt" / "version.h"

    first = git(repo, "rev-parse", "--short", "HEAD")
    assert generate(repo, out) == {"GPUCKPT_VERSION": "1.2.3", "GPUCKPT_COMMIT": first,
                                   "GPUCKPT_VERSION_STRING": f"1.2.3 (commit {first})"}
    # Unchanged: the header is left alone, so nothing recompiles.
    mtime = os.stat(out).st_mtime_ns
    time.sleep(0.01)
    generate(repo, out)
    assert os.stat(out).st_mtime_ns == mtime

    # An untracked file is no edit; a changed tracked file is.
    (repo / "new.cc").write_text("")
    assert generate(repo, out)["GPUCKPT_COMMIT"] == first
    (repo / "a.cc").write_text("int a = 1;\n")
    assert generate(repo, out)["GPUCKPT_COMMIT"] == first + "-dirty"

    git(repo, "commit", "-q", "-am", "second")
    second = git(repo, "rev-parse", "--short", "HEAD")
    assert second != first
    assert generate(repo, out)["GPUCKPT_VERSION_STRING"] == f"1.2.3 (commit {second})"


def test_generated_header_without_git(tmp_path):
    source = tmp_path / "gpuckpt-1.2.3"  # as unpacked from a tarball
    source.mkdir()
    macros = generate(source, tmp_path / "version.h")
    assert macros["GPUCKPT_COMMIT"] == "unknown"
    assert macros["GPUCKPT_VERSION_STRING"] == "1.2.3 (commit unknown: not built from a git checkout)"


def test_import_records_written_by(tmp_path):
    if not os.access(GPUCKPT, os.X_OK):
        pytest.skip(f"{GPUCKPT!r} is not built (WORKLOAD_BIN)")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f").write_bytes(os.urandom(4096))
    store = str(tmp_path / "store")
    run([GPUCKPT, "--store", store, "import", str(tree), "--name", "one"])
    listed = json.loads(run([GPUCKPT, "--store", store, "ls", "--json"]))
    version = run([GPUCKPT, "--version"]).strip()
    assert [s["written_by"] for s in listed] == [version]
