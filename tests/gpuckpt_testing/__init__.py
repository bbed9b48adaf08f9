"""gpuckpt_testing: what the integration tests (tests/integration), the GPU
tests (tests/gpu) and the benchmarks (tests/bench, tests/gpu/gpu_bench)
share, a module a job:

  build        where the programs under test are (GPUCKPTFS, WORKLOAD_BIN,
               the CLI, CRIU) and the repository
  messages     failed checks, a benchmark that cannot go on, lines on stderr
  processes    waits, kills, /proc, sessions, reaping restored orphans
  filetools    reading, comparing and measuring files and filesystems
  users        the ordinary test users, root, the GPU workloads' user
  workloads    self-checking workloads started and asked for their verdict
  mount        a gpuckptfs mount of a fresh store and what tests do on it
  podman       Podman on a storage of its own, for the container tests
  micro_ceph   a one-node Ceph cluster (tools/micro-ceph)
  gpu_host     the GPU machine: GPUs, the bundle of tests/gpu/prepare, its
               gpuckptfs daemon
  gpu_run      one run of a GPU test module: options, work dir, summary
  benchmarks   the benchmark drivers' work dir, page cache, machine facts

It is imported by its name, `from gpuckpt_testing import mount`, with
tests/ on the import path: pytest puts it there (tests/pytest.ini,
`pythonpath`), ctest sets PYTHONPATH, and the benchmark drivers run by path
set it for themselves (see tests/bench/README.md).
"""
