#!/usr/bin/env python3
"""criu_stats.py: reads CRIU's stats-dump image without crit.

    criu_stats.py STATS_DUMP [FIELD...]

Prints each FIELD (default: frozen_time) of the DumpStatsEntry, one per
line: the *_time fields (and irmap_resolve) in seconds with 6 decimals (CRIU
stores microseconds), the others as integers, "-" for a field the image does
not have. Exits 1 if the file is not a CRIU stats image.

The image (criu/include/magic.h, images/stats.proto): IMG_SERVICE_MAGIC
0x55105940, STATS_MAGIC 0x57093306, then one entry: a little-endian u32 size
and a protobuf StatsEntry, whose field 1 (dump) is a DumpStatsEntry.
"""

import struct
import sys

DUMP_FIELDS = {
    "freezing_time": 1, "frozen_time": 2, "memdump_time": 3, "memwrite_time": 4,
    "pages_scanned": 5, "pages_skipped_parent": 6, "pages_written": 7, "irmap_resolve": 8,
    "pages_lazy": 9, "page_pipes": 10, "page_pipe_bufs": 11, "shpages_scanned": 12,
    "shpages_skipped_parent": 13, "shpages_written": 14,
}
MICROSECONDS = {"freezing_time", "frozen_time", "memdump_time", "memwrite_time", "irmap_resolve"}


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def fields(b):
    """Field number -> value (int for varints, bytes otherwise); last wins."""
    i, out = 0, {}
    while i < len(b):
        key, i = varint(b, i)
        wire = key & 7
        if wire == 0:
            v, i = varint(b, i)
        elif wire == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            v, i = b[i:i + n], i + n
        else:
            raise ValueError("unexpected wire type %d" % wire)
        out[key >> 3] = v
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    names = argv[2:] or ["frozen_time"]
    for name in names:
        if name not in DUMP_FIELDS:
            print("criu_stats.py: unknown field %s" % name, file=sys.stderr)
            return 2
    b = open(argv[1], "rb").read()
    if len(b) < 12:
        return 1
    magic, kind, size = struct.unpack_from("<III", b)
    if (magic, kind) != (0x55105940, 0x57093306):
        print("criu_stats.py: %s is not a CRIU stats image" % argv[1], file=sys.stderr)
        return 1
    dump = fields(fields(b[12:12 + size]).get(1, b""))
    for name in names:
        v = dump.get(DUMP_FIELDS[name])
        if v is None:
            print("-")
        elif name in MICROSECONDS:
            print("%.6f" % (v / 1e6))
        else:
            print(v)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
