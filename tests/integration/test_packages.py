"""The packages install and run on a fresh Debian 12, by Debian's rules.

`cmake --install` installs the product and nothing of the tests. Then the
two .deb packages are built as a user would build them (`cpack -G DEB` in
the build directory; tools/package-criu) and checked with lintian: every
tag it gives is one explained in LINTIAN_EXPLAINED, and none is an error.
They are installed with apt-get, which resolves their dependencies from
Debian's mirror, into a fresh Debian 12 minimal root (debootstrap). There,
in a mount namespace of the test's own, the installed gpuckptfs mounts a
store, its tree is read, and a process is checkpointed through the mount
with the packaged CRIU; the packaged crit decodes the checkpoint's
pstree.img.

Cached under /var/cache/gpuckpt/package-test, so that a second run needs
neither debootstrap nor downloads: the pristine root (its package lists
refreshed once a day) and the .debs apt fetched. Each run installs into an
overlay over the pristine root, thrown away afterwards. Skips, saying why,
without root, /dev/fuse, debootstrap or a reachable mirror.
"""

import contextlib
import fcntl
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from gpuckpt_testing.build import GPUCKPTFS
from gpuckpt_testing.processes import kill_if_alive, wait_for

BUILD = os.environ.get("WORKLOAD_BIN", "")
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = "/var/cache/gpuckpt/package-test"
PRISTINE = os.path.join(CACHE, "bookworm")
ARCHIVES = os.path.join(CACHE, "archives")
LISTS_MAX_AGE_S = 24 * 3600
PREFIX = "/usr"  # the packages' prefix (Debian's policy)
MOUNT = "/mnt/gpuckpt"

# What the product is: installed by `cmake --install` and in the package.
PRODUCT = {
    "bin/gpuckpt",
    "bin/gpuckptfs",
    "libexec/gpuckpt/cuda-checkpoint",
    "share/man/man1/gpuckpt.1.gz",
    "share/man/man8/gpuckptfs.8.gz",
    "share/bash-completion/completions/gpuckpt",
    "share/doc/gpuckpt/copyright",
    "share/doc/gpuckpt/changelog.gz",
}

# What lintian (Debian 12's, 2.116) still says of the two packages, and
# why each is left. Any other tag fails the test, and so does any error.
LINTIAN_EXPLAINED = {
    # CPack adds ldconfig calls to the maintainer scripts of a package with
    # a shared object under /usr/lib; gpuckpt's is the Slurm plugin
    # (/usr/lib/gpuckpt/gpuckpt_spank.so), no library, and the calls are
    # harmless.
    "maintscript-calls-ldconfig",
    # CRIU's man pages are made with asciidoc and xmlto, a documentation
    # toolchain the build does not pull in; `criu --help`, `crit --help`
    # and CRIU's online manual remain.
    "no-manual-page",
    # CRIU's own build (its parasite code is compiled with flags of its
    # own, and the plugins are built by its Makefiles); gpuckpt's binaries
    # have these hardening flags.
    "hardening-no-bindnow",
    "hardening-no-fortify-functions",
    # The compiler's identification comment, which CPack's strip keeps.
    "binary-has-unneeded-section",
    # gpuckptfs is started by systemd or by hand (`gpuckptfs /mnt/gpuckpt`,
    # or the fstab line); there is no SysV init script.
    "package-supports-alternative-init-but-no-init.d-script",
    # A false match: "another" cut by the compiler's merging of string
    # constants that end alike ("...held by another holder").
    "spelling-error-in-binary",
}


def run(args, timeout=120, check=True, **kwargs):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check:
        assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def why_not():
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot, mounts)"
    if not os.access("/dev/fuse", os.W_OK):
        return "/dev/fuse is not usable here, so the installed gpuckptfs cannot mount"
    for tool in ("debootstrap", "cpack", "dpkg-shlibdeps", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (tools/setup installs it)"
    if not os.path.isfile(os.path.join(BUILD, "CPackConfig.cmake")):
        return f"WORKLOAD_BIN={BUILD!r} is no configured build directory (no CPackConfig.cmake)"
    if sanitized_build():
        return ("a sanitizer build (GPUCKPT_SANITIZE) is not what is packaged; "
                "the normal build's packages are the ones tested")
    return None


def sanitized_build():
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            return any(line.strip() == "GPUCKPT_SANITIZE:BOOL=ON" for line in f)
    except OSError:
        return False


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def installed_files(root):
    """Paths of the files under `root`, relative to it."""
    out = set()
    for d, _, files in os.walk(root):
        out |= {os.path.relpath(os.path.join(d, f), root) for f in files}
    return out


def assert_product_only(files, where):
    """`files` (relative to the prefix) hold the product and nothing of the
    tests or benchmarks."""
    assert PRODUCT <= files, f"{where} lacks {sorted(PRODUCT - files)}"
    test_only = sorted(f for f in files if os.path.basename(f).startswith(("wl_", "fake_libcuda"))
                       or f.endswith("_test") or "make_checkpoint_tree" in f or "bench" in f)
    assert not test_only, f"{where} holds what only tests use: {test_only}"


def test_cmake_install_installs_the_product_only(tmp_path):
    run(["cmake", "--install", BUILD, "--prefix", str(tmp_path)], timeout=300)
    assert_product_only(installed_files(tmp_path), "cmake --install")


def debian_mirror():
    """The Debian mirror this system's apt uses (as tools/install-criu)."""
    if os.environ.get("GPUCKPT_DEBIAN_MIRROR"):
        return os.environ["GPUCKPT_DEBIAN_MIRROR"].rstrip("/")
    r = run(["apt-get", "indextargets", "--format", "$(LABEL) $(REPO_URI)"], check=False)
    for line in r.stdout.splitlines():
        label, _, uri = line.partition(" ")
        if label == "Debian" and uri:
            return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def chroot_run(root, command, timeout=300, check=True):
    """`command` (a shell line) run in the chroot `root` (nothing mounted
    there: for apt-get update in the pristine root)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"}
    return run(["chroot", root, "sh", "-c", command], timeout=timeout, check=check, env=env)


@contextlib.contextmanager
def cache_lock():
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, "lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def pristine_root():
    """The cached Debian 12 minimal root, made (debootstrap) if absent and
    its package lists refreshed when a day old; skips where the mirror
    cannot be reached."""
    mirror = debian_mirror()
    with cache_lock():
        if not os.path.isfile(os.path.join(PRISTINE, ".complete")):
            shutil.rmtree(PRISTINE, ignore_errors=True)
            making = tempfile.mkdtemp(prefix="bookworm.", dir=CACHE)
            # In a mount namespace of its own: what debootstrap mounts in
            # the root goes with it, even if it is killed.
            r = run(["unshare", "--mount", "--propagation", "private", "debootstrap",
                     "--variant=minbase", "bookworm", making, mirror], timeout=900, check=False)
            if r.returncode != 0:
                shutil.rmtree(making, ignore_errors=True)
                pytest.skip(f"cannot make a Debian 12 root with debootstrap from {mirror} "
                            f"(no network?): {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
            # A root that is only half made is never used: complete, then named.
            open(os.path.join(making, ".complete"), "w").close()
            os.rename(making, PRISTINE)
        lists = os.path.join(PRISTINE, "var/lib/apt/lists")
        stamp = os.path.join(CACHE, "lists-updated")
        if not os.path.exists(stamp) or time.time() - os.stat(stamp).st_mtime > LISTS_MAX_AGE_S:
            shutil.copy("/etc/resolv.conf", os.path.join(PRISTINE, "etc/resolv.conf"))
            r = chroot_run(PRISTINE, "apt-get -q update", check=False)
            if r.returncode != 0 or not glob.glob(os.path.join(lists, "*_Packages*")):
                pytest.skip(f"apt-get update in the Debian 12 root failed (no network?): "
                            f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
            open(stamp, "w").close()
    return PRISTINE


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """The two .debs, built as README.md says: (gpuckpt's, gpuckpt-criu's)."""
    out = str(tmp_path_factory.mktemp("debs"))
    run(["cpack", "-G", "DEB", "-B", out], cwd=BUILD, timeout=600)
    gpuckpt_deb = glob.glob(os.path.join(out, "gpuckpt_*.deb"))
    assert len(gpuckpt_deb) == 1, os.listdir(out)
    criu_deb = run([os.path.join(SOURCE, "tools", "package-criu"), out], timeout=1800)
    criu_deb = criu_deb.stdout.strip().splitlines()[-1]
    assert os.path.isfile(criu_deb), criu_deb
    return gpuckpt_deb[0], criu_deb


def test_packages_follow_debians_policy(debs):
    for deb in debs:
        paths = [line.split()[-1] for line in run(["dpkg-deb", "-c", deb]).stdout.splitlines()]
        outside = [p for p in paths if not (p in ("./", "./usr/") or p.startswith("./usr/"))
                   or p.startswith("./usr/local")]
        assert not outside, f"{deb} installs outside /usr: {outside}"
        name = run(["dpkg-deb", "-f", deb, "Package"]).stdout.strip()
        assert f"./usr/share/doc/{name}/copyright" in paths, paths
        maintainer = run(["dpkg-deb", "-f", deb, "Maintainer"]).stdout.strip()
        assert "localhost" not in maintainer and "<" in maintainer, maintainer
        man = [p for p in paths if p.startswith("./usr/share/man/")
               and not p.endswith("/")]
        assert all(p.endswith(".gz") for p in man), man
    conflicts = run(["dpkg-deb", "-f", debs[1], "Conflicts"]).stdout.strip()
    assert conflicts == "criu", conflicts
    if shutil.which("lintian") is None:
        pytest.fail("lintian is not installed (tools/setup --test installs it)")
    r = run(["lintian", "--tag-display-limit", "0", "--display-info", *debs], check=False,
            timeout=600)
    tags = [line for line in r.stdout.splitlines() if line[:3] in ("E: ", "W: ", "I: ")]
    errors = [t for t in tags if t.startswith("E: ")]
    assert not errors, "\n".join(errors)
    unexplained = [t for t in tags if t.split()[2] not in LINTIAN_EXPLAINED]
    assert not unexplained, "\n".join(unexplained)
    assert r.returncode == 0 or not r.stderr.strip(), r.stderr


class Namespace:
    """A mount namespace of the test's own (held by a sleeping process):
    what is mounted in it goes with it, whatever happens."""

    def __init__(self):
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                        "sleep", "infinity"])
        me = os.readlink("/proc/self/ns/mnt")
        wait_for(lambda: os.readlink(f"/proc/{self.holder.pid}/ns/mnt") != me, 10,
                 "the mount namespace")

    def run(self, args, **kwargs):
        return run(["nsenter", "--target", str(self.holder.pid), "--mount", "--", *args],
                   **kwargs)

    def close(self):
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def fresh_root(tmp_path):
    """An overlay over the pristine root, with /proc, /sys, /dev and the
    apt archive cache mounted, in a namespace of its own; (namespace, path)."""
    lower = pristine_root()
    os.makedirs(ARCHIVES, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpuckpt-package-test.", dir="/var/tmp")
    ns = Namespace()
    daemon_pids = []
    try:
        upper, ovl, root = (os.path.join(work, d) for d in ("upper", "ovl", "root"))
        for d in (upper, ovl, root):
            os.mkdir(d)
        ns.run(["mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={lower},upperdir={upper},workdir={ovl}", root])
        ns.run(["mount", "-t", "proc", "proc", os.path.join(root, "proc")])
        ns.run(["mount", "--rbind", "/sys", os.path.join(root, "sys")])
        ns.run(["mount", "--rbind", "/dev", os.path.join(root, "dev")])
        ns.run(["mount", "--bind", ARCHIVES, os.path.join(root, "var/cache/apt/archives")])
        ns.run(["cp", "/etc/resolv.conf", os.path.join(root, "etc/resolv.conf")])
        yield ns, root, daemon_pids
    finally:
        for pid in daemon_pids:
            kill_if_alive(pid)
        ns.close()
        shutil.rmtree(work, ignore_errors=True)


def root_of(pid):
    try:
        return os.readlink(f"/proc/{pid}/root")
    except OSError:
        return None


def test_packages_install_and_run_on_a_fresh_debian(fresh_root, debs):
    ns, root, to_kill = fresh_root

    def sh(command, **kwargs):
        env = ["env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C.UTF-8"]
        return ns.run([*env, "chroot", root, "sh", "-c", command], **kwargs).stdout

    # apt resolves what the packages depend on, from Debian's mirror.
    # (The root is mounted in the namespace only: copied from inside it.)
    ns.run(["mkdir", os.path.join(root, "tmp", "debs")])
    ns.run(["cp", *debs, os.path.join(root, "tmp", "debs")])
    sh("apt-get install -y -q --no-install-recommends /tmp/debs/*.deb", timeout=900)
    listed = sh("dpkg-query -L gpuckpt | while read -r p; do [ -f \"$p\" ] && echo \"$p\"; done; true")
    assert_product_only({os.path.relpath(p, PREFIX) for p in listed.split()
                         if p.startswith(PREFIX + "/")}, "the gpuckpt package")
    depends = sh("dpkg-query -W -f '${Depends}' gpuckpt")
    for dep in ("fuse3", "gpuckpt-criu (>= 4.1)", "librocksdb"):
        assert dep in depends, f"gpuckpt's Depends lacks {dep}: {depends}"
    version = run([GPUCKPTFS, "--version"]).stdout.strip()
    assert sh("gpuckptfs --version").strip() == version
    assert sh("criu --version").startswith("Version: 4.1")
    # Under /usr, in place of Debian's criu; crit with its module in
    # Debian python3's own directory.
    assert sh("command -v criu").strip() == "/usr/sbin/criu"
    assert sh("dpkg-query -S /usr/sbin/criu").startswith("gpuckpt-criu:")
    assert sh("ls /usr/lib/criu").split() == ["amdgpu_plugin.so", "cuda_plugin.so",
                                              "gpuckpt-patches"]
    assert not sh("find /usr/local -type f").split(), "a package installed into /usr/local"
    assert ".TH" in sh("zcat /usr/share/man/man8/gpuckptfs.8.gz | head -n 40")
    unit = sh("cat /usr/lib/systemd/system/gpuckptfs.service")
    assert "ExecStart=/usr/bin/gpuckptfs " in unit, unit

    # The installed gpuckptfs mounts a store, with the packaged CRIU.
    sh(f"mkdir -p {MOUNT} && gpuckptfs --all-processes {MOUNT}", timeout=120)
    # The daemon: the gpuckptfs whose root is this one (not another
    # mount's daemon on this machine).
    to_kill += [int(p) for p in run(["pgrep", "-x", "gpuckptfs"], check=False).stdout.split()
                if root_of(int(p)) == root]
    assert to_kill, "gpuckptfs mounted but runs no daemon"
    names = sh(f"ls {MOUNT}").split()
    for name in ("README", "checkpoints", "ctl", "restore", "metrics"):
        assert name in names, f"{name} not in {MOUNT}: {names}"
    assert "gpuckptfs" in sh(f"cat {MOUNT}/README")

    pid = int(sh("setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"))
    to_kill.append(pid)
    wait_for(lambda: str(pid) in sh(f"ls {MOUNT}").split(), 10, f"{MOUNT}/{pid}")
    sh(f"echo checkpoint > {MOUNT}/{pid}/ctl", timeout=300)
    checkpoint = f"{MOUNT}/checkpoints/{pid}-1"
    manifest = json.loads(sh(f"cat {checkpoint}/manifest.json"))
    assert manifest["extra"]["criu_version"].startswith("4.1")
    assert manifest["written_by"] == "gpuckpt " + version.split(" ", 1)[1]
    shown = json.loads(sh(f"crit show {checkpoint}/images/pstree.img"))
    assert [e["pid"] for e in shown["entries"]] == [pid]
    assert os.path.exists(f"/proc/{pid}"), "the checkpointed process did not run on"

    sh(f"fusermount3 -u {MOUNT}")
    os.kill(pid, signal.SIGKILL)
