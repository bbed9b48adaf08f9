/* A stand-in libcuda.so.1 for the GPU-free tests of CudaDriver and
 * cuda-checkpoint (tests/unit/cuda_checkpoint_test.cc); it is loaded through
 * $GPUCKPT_LIBCUDA. It exports the calls gpuckpt resolves and keeps the CUDA
 * state of each pid in a small file, so that separate cuda-checkpoint runs
 * see the same state, as they would with the real driver.
 *
 * $FAKE_CUDA_STATE_DIR/<pid> holds "key=value" lines; a pid without that file
 * has no CUDA state (CUDA_ERROR_INVALID_VALUE, as the driver says). Keys:
 *   state=running|locked|checkpointed|failed
 *   restore_tid=N           what GetRestoreThreadId returns (default: pid)
 *   lock_timeout=N          written by Lock: the timeout it was given
 *   gpu_map=OLD=NEW,...     written by Restore: the pairs it was given
 *   lock_timeouts=N         the next N Lock calls time out (state kept)
 *   signal_on_checkpoint=1  Checkpoint sends SIGUSR1 to pid and waits until
 *                           the file <pid>.mapped appears (the test's child
 *                           maps new memory then, as the driver would)
 * Every checkpoint call is also appended to $FAKE_CUDA_STATE_DIR/<pid>.calls.
 *
 * Faults, from the environment of the process that loads this library:
 *   FAKE_CUDA_INIT_ERROR=N          cuInit returns N
 *   FAKE_CUDA_VERSION=N             cuDriverGetVersion (default 13000)
 *   FAKE_CUDA_DEVICE_COUNT=N        number of devices (default 2)
 *   FAKE_CUDA_LOCK_TIMEOUT=1        Lock returns CUDA_ERROR_TIMEOUT, state kept
 *   FAKE_CUDA_NOT_SUPPORTED=1       every checkpoint call: NOT_SUPPORTED
 *   FAKE_CUDA_FAIL_CHECKPOINT=N     Checkpoint returns N, state kept
 *   FAKE_CUDA_FAIL_RESTORE=N        Restore returns N, state kept
 * Built a second time with FAKE_CUDA_WITHOUT_CHECKPOINT_API: a driver too old
 * to have the cuCheckpointProcess* calls at all.
 *
 * Never use in production: it is a test double of the NVIDIA driver. */
#include <cuda.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#undef cuDeviceGetUuid
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);

static int initialized;

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? atoi(v) : dflt;
}

CUresult cuInit(unsigned int flags) {
  int err = env_int("FAKE_CUDA_INIT_ERROR", 0);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (err != 0) return (CUresult)err;
  initialized = 1;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
  if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
  *version = env_int("FAKE_CUDA_VERSION", 13000);
  return CUDA_SUCCESS;
}

struct error_text {
  CUresult code;
  const char *name;
  const char *text;
};

static const struct error_text kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct error_text *find_error(CUresult code) {
  for (size_t i = 0; i < sizeof(kErrors) / sizeof(kErrors[0]); ++i) {
    if (kErrors[i].code == code) return &kErrors[i];
  }
  return NULL;
}

CUresult cuGetErrorName(CUresult error, const char **str) {
  const struct error_text *e = find_error(error);
  if (str == NULL) return CUDA_ERROR_INVALID_VALUE;
  *str = e != NULL ? e->name : NULL;
  return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **str) {
  const struct error_text *e = find_error(error);
  if (str == NULL) return CUDA_ERROR_INVALID_VALUE;
  *str = e != NULL ? e->text : NULL;
  return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- devices: FAKE_CUDA_DEVICE_COUNT of them, device i has UUID bytes
 * 16*i .. 16*i+15 and (80 + i) GiB. */

CUresult cuDeviceGetCount(int *count) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *count = env_int("FAKE_CUDA_DEVICE_COUNT", 2);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= env_int("FAKE_CUDA_DEVICE_COUNT", 2)) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "NVIDIA Fake GPU %d", dev);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  for (int k = 0; k < 16; ++k) uuid->bytes[k] = (char)(16 * dev + k);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *bytes = (size_t)(80 + dev) << 30;
  return CUDA_SUCCESS;
}

#ifndef FAKE_CUDA_WITHOUT_CHECKPOINT_API

/* ---- the per-pid state file */

struct fake_process {
  char state[16];
  int restore_tid;
  long lock_timeout;
  char gpu_map[1024];
  int signal_on_checkpoint;
  int lock_timeouts;
};

static int state_path(int pid, const char *suffix, char *buf, size_t len) {
  const char *dir = getenv("FAKE_CUDA_STATE_DIR");
  if (dir == NULL || dir[0] == '\0') return -1;
  int n = snprintf(buf, len, "%s/%d%s", dir, pid, suffix);
  return n > 0 && (size_t)n < len ? 0 : -1;
}

/* 0 when pid has CUDA state (and *p holds it), -1 when not. */
static int load(int pid, struct fake_process *p) {
  char path[4096], line[1200];
  memset(p, 0, sizeof(*p));
  strcpy(p->state, "running");
  p->restore_tid = pid;
  if (state_path(pid, "", path, sizeof(path)) != 0) return -1;
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    char *eq = strchr(line, '=');
    if (eq == NULL) continue;
    *eq = '\0';
    const char *v = eq + 1;
    if (strcmp(line, "state") == 0) snprintf(p->state, sizeof(p->state), "%s", v);
    if (strcmp(line, "restore_tid") == 0) p->restore_tid = atoi(v);
    if (strcmp(line, "lock_timeout") == 0) p->lock_timeout = atol(v);
    if (strcmp(line, "gpu_map") == 0) snprintf(p->gpu_map, sizeof(p->gpu_map), "%s", v);
    if (strcmp(line, "signal_on_checkpoint") == 0) p->signal_on_checkpoint = atoi(v);
    if (strcmp(line, "lock_timeouts") == 0) p->lock_timeouts = atoi(v);
  }
  fclose(f);
  return 0;
}

static CUresult save(int pid, const struct fake_process *p) {
  char path[4096], tmp[4200];
  if (state_path(pid, "", path, sizeof(path)) != 0) return CUDA_ERROR_UNKNOWN;
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f == NULL) return CUDA_ERROR_UNKNOWN;
  fprintf(f,
          "state=%s\nrestore_tid=%d\nlock_timeout=%ld\ngpu_map=%s\nsignal_on_checkpoint=%d\n"
          "lock_timeouts=%d\n",
          p->state, p->restore_tid, p->lock_timeout, p->gpu_map, p->signal_on_checkpoint,
          p->lock_timeouts);
  if (fclose(f) != 0 || rename(tmp, path) != 0) return CUDA_ERROR_UNKNOWN;
  return CUDA_SUCCESS;
}

static void log_call(int pid, const char *call) {
  char path[4096];
  if (state_path(pid, ".calls", path, sizeof(path)) != 0) return;
  FILE *f = fopen(path, "a");
  if (f == NULL) return;
  fprintf(f, "%s\n", call);
  fclose(f);
}

/* Common checks of every checkpoint call; CUDA_SUCCESS with *p loaded. */
static CUresult begin(int pid, struct fake_process *p) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (env_int("FAKE_CUDA_NOT_SUPPORTED", 0) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (load(pid, p) != 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

static void format_uuid(const CUuuid *u, char *out) {
  const unsigned char *b = (const unsigned char *)u->bytes;
  sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
          b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
          b[15]);
}

/* Waits up to 10 s for the test's child to say it mapped its memory. */
static CUresult signal_and_wait(int pid) {
  char path[4096];
  if (state_path(pid, ".mapped", path, sizeof(path)) != 0) return CUDA_ERROR_UNKNOWN;
  if (kill(pid, SIGUSR1) != 0) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < 10000; ++i) {
    if (access(path, F_OK) == 0) return CUDA_SUCCESS;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  return CUDA_ERROR_UNKNOWN;
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
  struct fake_process p;
  CUresult r = begin(pid, &p);
  if (r != CUDA_SUCCESS) return r;
  if (strcmp(p.state, "running") == 0)
    *state = CU_PROCESS_STATE_RUNNING;
  else if (strcmp(p.state, "locked") == 0)
    *state = CU_PROCESS_STATE_LOCKED;
  else if (strcmp(p.state, "checkpointed") == 0)
    *state = CU_PROCESS_STATE_CHECKPOINTED;
  else
    *state = CU_PROCESS_STATE_FAILED;
  return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
  struct fake_process p;
  CUresult r = begin(pid, &p);
  if (r != CUDA_SUCCESS) return r;
  *tid = p.restore_tid;
  return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
  struct fake_process p;
  char call[64];
  CUresult r = begin(pid, &p);
  if (r != CUDA_SUCCESS) return r;
  snprintf(call, sizeof(call), "lock %u", args != NULL ? args->timeoutMs : 0);
  log_call(pid, call);
  if (strcmp(p.state, "running") != 0) return CUDA_ERROR_ILLEGAL_STATE;
  p.lock_timeout = args != NULL ? (long)args->timeoutMs : 0;
  if (env_int("FAKE_CUDA_LOCK_TIMEOUT", 0) != 0) {
    save(pid, &p);
    return CUDA_ERROR_TIMEOUT;
  }
  if (p.lock_timeouts > 0) {
    --p.lock_timeouts;
    save(pid, &p);
    return CUDA_ERROR_TIMEOUT;
  }
  strcpy(p.state, "locked");
  return save(pid, &p);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
  struct fake_process p;
  CUresult r = begin(pid, &p);
  (void)args;
  if (r != CUDA_SUCCESS) return r;
  log_call(pid, "checkpoint");
  if (strcmp(p.state, "locked") != 0) return CUDA_ERROR_ILLEGAL_STATE;
  if (env_int("FAKE_CUDA_FAIL_CHECKPOINT", 0) != 0) {
    return (CUresult)env_int("FAKE_CUDA_FAIL_CHECKPOINT", 0);
  }
  if (p.signal_on_checkpoint) {
    r = signal_and_wait(pid);
    if (r != CUDA_SUCCESS) return r;
  }
  strcpy(p.state, "checkpointed");
  return save(pid, &p);
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
  struct fake_process p;
  char uuid[64];
  CUresult r = begin(pid, &p);
  if (r != CUDA_SUCCESS) return r;
  log_call(pid, "restore");
  if (strcmp(p.state, "checkpointed") != 0) return CUDA_ERROR_ILLEGAL_STATE;
  if (env_int("FAKE_CUDA_FAIL_RESTORE", 0) != 0) {
    return (CUresult)env_int("FAKE_CUDA_FAIL_RESTORE", 0);
  }
  p.gpu_map[0] = '\0';
  if (args != NULL && args->gpuPairsCount > 0) {
    if (args->gpuPairs == NULL || args->gpuPairsCount > 8) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < args->gpuPairsCount; ++i) {
      if (i > 0) strcat(p.gpu_map, ",");
      format_uuid(&args->gpuPairs[i].oldUuid, uuid);
      strcat(p.gpu_map, uuid);
      strcat(p.gpu_map, "=");
      format_uuid(&args->gpuPairs[i].newUuid, uuid);
      strcat(p.gpu_map, uuid);
    }
  }
  strcpy(p.state, "locked");
  return save(pid, &p);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
  struct fake_process p;
  CUresult r = begin(pid, &p);
  (void)args;
  if (r != CUDA_SUCCESS) return r;
  log_call(pid, "unlock");
  if (strcmp(p.state, "locked") != 0) return CUDA_ERROR_ILLEGAL_STATE;
  strcpy(p.state, "running");
  return save(pid, &p);
}

#endif /* FAKE_CUDA_WITHOUT_CHECKPOINT_API */
