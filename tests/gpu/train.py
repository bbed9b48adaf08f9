#!/usr/bin/env python3
"""train.py: a deterministic PyTorch training run, checkpointed mid-run.

    train.py --steps N --log FILE --ready FILE [--step-ms MS] [--data-mib MIB] [--seed S] [--stall]

Trains a small MLP on synthetic data that is generated on the GPU from the
seed (labels from a fixed random "teacher"), one step about every --step-ms
(100 ms: a checkpoint taken after ready lands mid-run). Everything is seeded
and deterministic (torch.use_deterministic_algorithms, no TF32, cuBLAS with
CUBLAS_WORKSPACE_CONFIG=:4096:8), so two runs on the same GPU give the same
losses bit for bit. Device memory: the data set (--data-mib, 384 MiB) plus
the model, Adam's state and the allocator's cache: about 0.5-0.6 GiB.

After --warmup steps (5: cuBLAS and the caching allocator are set up by
then) it writes its pid to the ready file (temp + rename). When all steps
are done it writes FILE: one line per step, "STEP LOSS" with the loss as
float.hex() (exact), then exits 0. An exception after ready ends the log
with an "error: ..." line and exit 1.

--stall measures how long the run was stalled, from its own point of view,
with the protocol of tests/workloads/workload.h and the meter of
stall_meter.py: on SIGUSR2 it writes FILE.stall (temp + rename), the
longest stall in seconds since the previous SIGUSR2 ("0.934512\n"). Two
clocks, the larger counts: a thread that wakes every 1 ms keeps the longest
gap between two wake-ups (a CPU freeze: CRIU stops every thread; GIL
hand-offs add up to a few ms), and the main loop keeps the longest time
between two completed steps less the fixed pause (a GPU block: loss.item()
waits for the step's kernels, and the driver's lock holds them; resolution
about one step, --step-ms). A GPU block shows only when the step it held
up ends, which may be after the SIGUSR2 sent right after the unlock: so the
answer waits until a step has ended after the signal (at most 10 s, then it
answers with what it has). SIGUSR2 is blocked in every thread (before torch
starts any) and taken only by that thread; without --stall it stays pending
and does nothing. Read it across leave-running checkpoints only: across a
kill and restore the gap is the time the process did not exist.

Why the log is written at the end, from memory, and never held open:

CRIU records the size of every regular file the process has open and, on
restore, refuses a file whose size differs ("bad size"). A log appended to
while running would break restores: with `checkpoint` (leave running) the
original keeps appending after the dump; after a first restore the restored
run appends too; so the file never has the size the checkpoint recorded.
Here the lines live in the process's memory, which the checkpoint captures
with the rest of the state: a restored run carries the lines from before the
checkpoint and adds the ones after it, and at the end writes the whole log
(temp file + rename). Whatever the mode and however often a checkpoint is
restored, each run that reaches the end leaves a log that must be
byte-identical to an uninterrupted run's. For the same reason stdout and
stderr are pointed at /dev/null once ready: a warning printed after the dump
into a redirected output file would change its size.
"""

import argparse
import os
import signal
import sys
import threading
import time
import traceback

# Before torch starts any thread, so that every thread inherits it: SIGUSR2
# is taken only by the stall meter (--stall); its default action would end
# the process.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})

# Must be set before cuBLAS starts (deterministic GEMMs need a fixed
# workspace); the caller may set it too.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402  (after the environment above)

FEATURES = 1024
CLASSES = 16
HIDDEN = 2048
BATCH = 4096


def write_atomically(path, text, sync=True):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.rename(tmp, path)


def silence_output():
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--step-ms", type=float, default=100.0)
    p.add_argument("--data-mib", type=int, default=384)
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--stall", action="store_true")
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error("--steps must be more than --warmup")
    if not torch.cuda.is_available():
        print("train.py: torch.cuda.is_available() is False", file=sys.stderr)
        return 2

    meter = None
    if a.stall:
        # Imported only here: the suite runs a copy of this file alone,
        # without --stall.
        from stall_meter import StallMeter
        meter = StallMeter(a.log + ".stall", a.step_ms / 1000.0, write_atomically)
        threading.Thread(target=meter.run, name="stall-meter", daemon=True).start()

    torch.manual_seed(a.seed)
    torch.cuda.manual_seed_all(a.seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(2)
    dev = torch.device("cuda:0")

    # The data set lives on the GPU: the checkpoint must carry it.
    rows = (a.data_mib << 20) // (FEATURES * 4)
    rows -= rows % BATCH
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    x = torch.randn(rows, FEATURES, device=dev, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, device=dev, generator=gen)
    y = (x @ teacher).argmax(dim=1)

    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = rows // BATCH
    print(
        "train.py: pid %d, %s, %d rows, %d steps, %.0f MiB allocated"
        % (os.getpid(), torch.cuda.get_device_name(dev), rows, a.steps,
           torch.cuda.memory_allocated(dev) / 2**20),
        flush=True,
    )

    lines = []
    ready = False
    try:
        for step in range(a.steps):
            b = step % batches
            xb = x[b * BATCH:(b + 1) * BATCH]
            yb = y[b * BATCH:(b + 1) * BATCH]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            lines.append("%d %s\n" % (step, float(loss.item()).hex()))
            if meter is not None:
                meter.step_done()
            if step + 1 == a.warmup:
                silence_output()
                write_atomically(a.ready, "%d\n" % os.getpid())
                ready = True
            # A fixed pause per step, not a schedule: after a restore the
            # clocks have moved on, and a schedule would run steps back to
            # back to catch up.
            time.sleep(a.step_ms / 1000.0)
    except BaseException:  # noqa: BLE001  (the log says what happened)
        if not ready:
            raise
        lines.append("error: " + traceback.format_exc().replace("\n", " | ") + "\n")
        write_atomically(a.log, "".join(lines))
        return 1
    write_atomically(a.log, "".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
