#!/usr/bin/env python3
"""infer.py: an inference process holding a large model, for gpu_bench.

    infer.py RESULT --gb N [--stall] [--seed S] [--step-ms MS]

Builds a stack of fp16 linear layers (8192 x 8192, 128 MiB each) with at
least N GB (10^9 bytes) of weights on the GPU, from the seed, and runs a
forward pass of a small batch about every --step-ms (100 ms) until told to
stop. Weights are random normal numbers scaled like a trained layer's: as
hard to compress as real fp16 weights.

The protocol of tests/workloads/workload.h, so gpu_bench handles it like
gpu_memory: once built it writes its pid to RESULT.ready (temp + rename); on
SIGUSR1 it checks that every layer still holds the weights it was built
with (the sum of each layer's 16-bit words as integers, taken at start) and
that a forward pass gives, bit for bit, the output it gave at start, writes
"PASS" or "FAIL: why" to RESULT and exits. --stall: on SIGUSR2 it writes
RESULT.stall, the longest stall since the previous SIGUSR2 (the meter of
stall_meter.py, as train.py: a 1 ms thread for CPU freezes, and the gap
between forward passes, less the pause, for the driver's lock), once a
forward pass has ended after the signal (at most 10 s later): a pass held
up by the driver's lock counts even when it ends after the SIGUSR2 that
follows the unlock.
"""

import argparse
import math
import os
import signal
import sys
import threading
import time

# train.py and stall_meter.py sit beside this file, which python3 runs by
# its path. train.py blocks SIGUSR2 for the meter and sets up deterministic cuBLAS
# before torch starts; SIGUSR1 is blocked here too, and taken by the main
# loop between passes.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
from train import silence_output, write_atomically  # noqa: E402
from stall_meter import StallMeter  # noqa: E402

import torch  # noqa: E402

WIDTH = 8192
BATCH = 16


def layer_sums(layers):
    return [int(w.view(torch.int16).sum(dtype=torch.int64).item()) for w in layers]


def forward(layers, x):
    for w in layers:
        x = torch.tanh(x @ w)
    return x


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("result")
    p.add_argument("--gb", type=float, required=True)
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--step-ms", type=float, default=100.0)
    p.add_argument("--stall", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("infer.py: torch.cuda.is_available() is False", file=sys.stderr)
        return 2

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(2)
    dev = torch.device("cuda:0")
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    count = math.ceil(a.gb * 1e9 / (WIDTH * WIDTH * 2))
    layers = []
    for _ in range(count):
        w = torch.randn(WIDTH, WIDTH, device=dev, dtype=torch.float16, generator=gen)
        layers.append(w.mul_(1.0 / math.sqrt(WIDTH)))
    x = torch.randn(BATCH, WIDTH, device=dev, dtype=torch.float16, generator=gen)
    sums = layer_sums(layers)
    expected = forward(layers, x).cpu()
    print("infer.py: pid %d, %s, %d layers, %.2f GB of weights, %.0f MiB allocated"
          % (os.getpid(), torch.cuda.get_device_name(dev), count,
             count * WIDTH * WIDTH * 2 / 1e9, torch.cuda.memory_allocated(dev) / 2**20),
          flush=True)

    meter = None
    if a.stall:
        meter = StallMeter(a.result + ".stall", a.step_ms / 1000.0, write_atomically)
        threading.Thread(target=meter.run, name="stall-meter", daemon=True).start()
    silence_output()
    write_atomically(a.result + ".ready", "%d\n" % os.getpid())

    while signal.sigtimedwait([signal.SIGUSR1], 0) is None:
        forward(layers, x)
        torch.cuda.synchronize()
        if meter is not None:
            meter.step_done()
        time.sleep(a.step_ms / 1000.0)

    try:
        now = layer_sums(layers)
        bad = [i for i, (s, n) in enumerate(zip(sums, now)) if s != n]
        if bad:
            verdict = "FAIL: the weights of %d of %d layers changed (first: layer %d)" % (
                len(bad), count, bad[0])
        elif not torch.equal(forward(layers, x).cpu(), expected):
            verdict = "FAIL: a forward pass no longer gives the output it gave at start"
        else:
            verdict = "PASS"
    except Exception as e:  # noqa: BLE001  (the verdict says what happened)
        verdict = "FAIL: %s" % str(e).replace("\n", " ")
    write_atomically(a.result, verdict + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
