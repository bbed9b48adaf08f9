#!/usr/bin/env python3
"""ddp_train.py: a deterministic two-GPU PyTorch DDP run, checkpointed mid-run.

    ddp_train.py --steps N --log PREFIX --ready PREFIX [--world W] [--port P]
                 [--step-ms MS] [--data-mib MIB] [--seed S] [--warmup K]
                 [--one-gpu]

The launcher (this process) starts one process per GPU with
torch.multiprocessing (start method spawn, as mp.spawn does) and waits for
them; it uses no GPU itself. Rank r trains a DistributedDataParallel copy of
a small MLP on GPU r (torch.cuda.set_device(r)), on its own shard of a
synthetic data set generated on the GPU from the seed; NCCL all-reduces the
gradients and, every step, the loss. NCCL runs with the transports the
driver cannot checkpoint off (NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1,
NCCL_NVLS_ENABLE=0; set here unless the caller set them), so the ranks talk
through loopback sockets, which CRIU dumps and restores with the tree; and
PyTorch's TCPStore runs without libuv, whose io_uring CRIU cannot
checkpoint.

--one-gpu puts every rank on GPU 0, for machines with one GPU: NCCL refuses
two ranks on one GPU, so the ranks all-reduce through gloo instead (over
loopback sockets too, GLOO_SOCKET_IFNAME=lo unless the caller set it),
which copies the CUDA tensors through host memory.
Everything is seeded and deterministic (as in train.py), so two runs give
the same losses bit for bit.

After --warmup steps rank r writes its pid to PREFIX.rank<r> of --ready
(temp + rename). At the end rank r writes the log PREFIX.rank<r> of
--log: one line per step, "STEP MEAN_LOSS LOCAL_LOSS" (float.hex(), exact;
the mean over all ranks is the all-reduced one), then "params SUM" (the sum
of its parameters, equal on every rank), and exits 0; the launcher exits 0
when every rank did. A failure ends that rank's log with an "error: ..."
line (also before ready) and the launcher exits 1.

Output: each rank points its stdout and stderr at /dev/null once ready, and
the launcher once all are: CRIU refuses to restore an open file whose size
changed since the dump, so nothing the job holds open may grow after a
checkpoint (train.py says more). A rank's facts (GPU, NCCL version) go to
PREFIX.rank<r>.info of --log; a launcher that saw a rank fail writes
PREFIX.launcher.
"""

import argparse
import faulthandler
import os
import sys
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# The TCPStore of torch.distributed runs on libuv by default, and the libuv
# in PyTorch 2.11 holds an io_uring instance (UV_USE_IO_URING=0 did not stop
# it), which CRIU cannot checkpoint (gpuckpt refuses such a tree, saying
# so): the store runs on its older backend (use_libuv=0 below, and for
# env:// rendezvous USE_LIBUV=0).
os.environ.setdefault("USE_LIBUV", "0")
for _name, _value in (("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1"),
                      ("NCCL_NVLS_ENABLE", "0")):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402  (after the environment above)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

FEATURES = 1024
CLASSES = 16
HIDDEN = 2048
BATCH = 2048  # per rank


def write_atomically(path, text):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def silence_output():
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def rank_main(rank, a):
    log = "%s.rank%d" % (a.log, rank)
    lines = []
    faulthandler.enable()  # a crash in native code says where, until ready
    try:
        torch.manual_seed(a.seed)
        torch.cuda.manual_seed_all(a.seed)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_num_threads(2)
        gpu = 0 if a.one_gpu else rank
        torch.cuda.set_device(gpu)
        dev = torch.device("cuda", gpu)
        init_method = "tcp://127.0.0.1:%d?use_libuv=0" % a.port
        if a.one_gpu:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            dist.init_process_group("gloo", init_method=init_method, rank=rank,
                                    world_size=a.world)
        else:
            dist.init_process_group("nccl", init_method=init_method, rank=rank,
                                    world_size=a.world, device_id=dev)

        # The data set lives on the GPU: the checkpoint must carry it. Each
        # rank generates all of it from the seed and trains on its shard.
        rows = (a.data_mib << 20) // (FEATURES * 4)
        rows -= rows % (BATCH * a.world)
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
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        batches = rows // (BATCH * a.world)
        write_atomically(log + ".info", "rank %d pid %d, GPU %d %s, %s (nccl %s), %d rows, "
                         "%.0f MiB allocated\n" % (
            rank, os.getpid(), gpu, torch.cuda.get_device_name(dev), dist.get_backend(),
            ".".join(map(str, torch.cuda.nccl.version())), rows,
            torch.cuda.memory_allocated(dev) / 2**20))

        for step in range(a.steps):
            first = ((step % batches) * a.world + rank) * BATCH
            xb, yb = x[first:first + BATCH], y[first:first + BATCH]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean /= a.world
            lines.append("%d %s %s\n" % (step, float(mean.item()).hex(), float(loss.item()).hex()))
            if step + 1 == a.warmup:
                silence_output()
                write_atomically("%s.rank%d" % (a.ready, rank), "%d\n" % os.getpid())
            # A fixed pause per step, not a schedule (train.py says why).
            time.sleep(a.step_ms / 1000.0)
        total = sum(float(p.detach().double().sum().item()) for p in model.parameters())
        lines.append("params %s\n" % total.hex())
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (the log says what happened)
        lines.append("error: " + traceback.format_exc().replace("\n", " | ") + "\n")
        write_atomically(log, "".join(lines))
        sys.exit(1)
    write_atomically(log, "".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29561)
    p.add_argument("--step-ms", type=float, default=100.0)
    p.add_argument("--data-mib", type=int, default=256)
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--one-gpu", action="store_true",
                   help="every rank on GPU 0, all-reducing through gloo")
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error("--steps must be more than --warmup")
    # No torch.cuda call here: it would start CUDA in the launcher, which
    # must hold no GPU (a rank without its GPU says so in its log).
    print("ddp_train.py: launcher pid %d, %d ranks, %d steps" % (os.getpid(), a.world, a.steps),
          flush=True)
    context = mp.start_processes(rank_main, args=(a,), nprocs=a.world, join=False,
                                 start_method="spawn")
    ready = ["%s.rank%d" % (a.ready, r) for r in range(a.world)]
    silenced = False
    try:
        while not context.join(timeout=0.2):
            # Quiet once every rank is (they go quiet then too): until then,
            # what goes wrong is printed.
            if not silenced and all(os.path.exists(f) for f in ready):
                silence_output()
                silenced = True
    except Exception:  # noqa: BLE001  (a rank failed)
        write_atomically(a.log + ".launcher", traceback.format_exc())
        if not silenced:
            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
