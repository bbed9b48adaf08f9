"""Files and filesystems: reading, comparing trees and files, sizes and
free space, packing logs."""

import difflib
import filecmp
import os
import stat
import subprocess
import tarfile


def read(path):
    with open(path) as f:
        return f.read()


def read_text(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def last_chars(path, n):
    """The last n characters of a file ("" when it cannot be read)."""
    return read_text(path)[-n:]


def last_lines(path, lines):
    """The last `lines` lines of a file (what reading it said when it
    cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return str(e)


def tree_differences(a, b):
    """Where the trees under `a` and `b` differ, as sorted paths relative to
    them: an entry in one tree only, one of another type in the other, a
    regular file with other bytes, a symlink to another target. [] where
    they are the same."""
    def entries(root):
        out = {}
        for d, dirs, names in os.walk(root):
            for n in dirs + names:
                full = os.path.join(d, n)
                mode = os.lstat(full).st_mode
                out[os.path.relpath(full, root)] = (stat.S_IFMT(mode), full)
        return out

    ea, eb = entries(a), entries(b)
    differ = set(ea) ^ set(eb)
    for name in set(ea) & set(eb):
        (kind, fa), (kind_b, fb) = ea[name], eb[name]
        if kind != kind_b:
            differ.add(name)
        elif stat.S_ISREG(kind) and not filecmp.cmp(fa, fb, shallow=False):
            differ.add(name)
        elif stat.S_ISLNK(kind) and os.readlink(fa) != os.readlink(fb):
            differ.add(name)
    return sorted(differ)


def first_difference(a, b, lines=4):
    """Where two text files first differ, and up to `lines` differing lines."""
    ta, tb = read_text(a).splitlines(), read_text(b).splitlines()
    where = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    diff = [d for d in difflib.unified_diff(ta, tb, lineterm="", n=0)
            if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    return f"{a} {b} differ: line {where + 1}; " + "|".join(diff[:lines])


def same_file(a, b):
    return subprocess.run(["cmp", "-s", a, b]).returncode == 0


def file_bytes(tree):
    """The bytes of the regular files under tree."""
    total = 0
    for d, _, names in os.walk(tree):
        for n in names:
            st = os.lstat(os.path.join(d, n))
            if (st.st_mode & 0o170000) == 0o100000:
                total += st.st_size
    return total


def free_bytes(path):
    """The bytes of the filesystem of `path` that an ordinary user may fill."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def used_bytes(path):
    """The bytes in use on the filesystem of `path`."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def du_bytes(path):
    return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def fstype(path):
    return subprocess.run(["df", "--output=fstype", path], capture_output=True,
                          text=True).stdout.split()[-1]


def pack(tarball, work, name):
    """tar.gz of work/name (the logs)."""
    with tarfile.open(tarball, "w:gz") as t:
        t.add(os.path.join(work, name), arcname=name)


def dmesg_tail(dest, lines):
    out = subprocess.run(["dmesg"], capture_output=True, text=True, errors="replace")
    with open(dest, "w") as f:
        f.write("\n".join(out.stdout.splitlines()[-lines:]) + "\n")
