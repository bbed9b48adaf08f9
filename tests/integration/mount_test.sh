#!/usr/bin/env bash
# Integration test of gpuckptfs on a real FUSE mount: a tree imported with
# the gpuckpt CLI is served under checkpoints/<id>/images/, byte for byte,
# read-only, with its manifest; a second daemon on the same store is
# refused; unmounting stops the daemon.
#   mount_test.sh GPUCKPT GPUCKPTFS
set -euo pipefail
GPUCKPT=$1
GPUCKPTFS=$2

if [[ ! -w /dev/fuse ]]; then
  echo "SKIP: /dev/fuse is not usable here, so no real mount can be tested"
  exit 77
fi

work=$(mktemp -d /var/tmp/gpuckpt-mount-test.XXXXXX)
mnt=$work/mnt
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A snapshot's files appear under checkpoints/<id>/ as they were imported;
# the engine's checkpoints keep CRIU's files in images/.
mkdir -p "$work/src/images/sub" "$mnt"
head -c $((3 * 1024 * 1024 + 17)) /dev/urandom >"$work/src/images/pages-1.img"
head -c 100000 /dev/urandom >"$work/src/images/sub/core-1.img"
: >"$work/src/images/empty.img"
chmod 0640 "$work/src/images/sub/core-1.img"
ln -s sub/core-1.img "$work/src/images/link"

id=$("$GPUCKPT" --store "$work/store" import "$work/src" --name ckpt-a 2>/dev/null)
[[ $id == ckpt-a ]] || fail "import printed '$id'"

"$GPUCKPTFS" --store "$work/store" "$mnt" || fail "gpuckptfs did not mount"
mountpoint -q "$mnt" || fail "not mounted after gpuckptfs returned"
# Cold sequential reads get 8 MiB of kernel read-ahead, not the 128 KiB the
# kernel gives a FUSE mount by default.
dev=$(awk -v m="$(realpath "$mnt")" '$5 == m { d = $3 } END { print d }' /proc/self/mountinfo)
[[ $(cat "/sys/class/bdi/$dev/read_ahead_kb") == 8192 ]] ||
  fail "read-ahead of the mount (bdi $dev) is $(cat "/sys/class/bdi/$dev/read_ahead_kb" 2>&1) KiB"

# A second daemon, or the CLI, on the same store: refused with a clear line.
if msg=$("$GPUCKPTFS" --store "$work/store" "$work" 2>&1); then fail "second daemon mounted"; fi
grep -q "in use" <<<"$msg" || fail "second daemon's message: $msg"
if msg=$("$GPUCKPT" --store "$work/store" gc 2>&1); then fail "CLI changed a store in use"; fi
grep -q "in use" <<<"$msg" || fail "CLI's message: $msg"

[[ -f $mnt/README ]] || fail "no README"
[[ $(ls "$mnt/checkpoints") == ckpt-a ]] || fail "checkpoints/ lists: $(ls "$mnt/checkpoints")"
images=$mnt/checkpoints/ckpt-a/images
for f in pages-1.img sub/core-1.img empty.img; do
  cmp "$work/src/images/$f" "$images/$f" || fail "$f differs"
done
[[ $(readlink "$images/link") == sub/core-1.img ]] || fail "symlink target"
[[ $(stat -c %a "$images/sub/core-1.img") == 640 ]] || fail "mode not kept"
[[ $(stat -c %s "$images/pages-1.img") == $((3 * 1024 * 1024 + 17)) ]] || fail "size"
# Reads at an offset inside a chunk and across the end.
cmp <(tail -c 4097 "$work/src/images/pages-1.img") <(tail -c 4097 "$images/pages-1.img") || fail "tail read"
# Images are served only to root (the store's owner): the snapshot dir is 0700.
[[ $(stat -c %a "$mnt/checkpoints/ckpt-a") == 700 ]] || fail "snapshot dir is not 0700"
python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); assert m["id"]=="ckpt-a" and m["logical_bytes"]>3000000, m' \
  "$mnt/checkpoints/ckpt-a/manifest.json" || fail "manifest.json"
# du: what the checkpoint added (random data: about its size).
du_kb=$(du -sk "$images" | cut -f1)
((du_kb > 3000 && du_kb < 4000)) || fail "du of images is ${du_kb} KiB"
# Read-only.
if (echo x >"$images/pages-1.img") 2>/dev/null; then fail "write to an image succeeded"; fi
if touch "$images/new" 2>/dev/null; then fail "create in images succeeded"; fi
# cp -r of a checkpoint is byte-identical to the source.
cp -r "$images" "$work/copy"
diff -r "$work/src/images" "$work/copy" || fail "cp -r copy differs"

fusermount3 -u "$mnt"
for _ in $(seq 50); do pgrep -f "gpuckptfs --store $work/store" >/dev/null || break; sleep 0.1; done
pgrep -f "gpuckptfs --store $work/store" >/dev/null && fail "daemon still running after unmount"
# The store is free again.
"$GPUCKPT" --store "$work/store" fsck 2>/dev/null || fail "fsck after unmount"
echo "PASS: mount_test"
