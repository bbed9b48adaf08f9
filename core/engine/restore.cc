// Engine::Restore: find the images a path names (a checkpoint in the
// mount, or anything Engine::Import takes from outside it, which is
// imported first so that it dedups and shows under checkpoints/), check who
// may restore them, then serve them to `criu restore --stream` from the
// store.
//
// Who may do what:
//  - a checkpoint in the store: only its owner (the checkpointed process's
//    owner) may restore it, and root;
//  - a path from outside is resolved with the caller's rights (ActingAs),
//    so it tells nobody what lies in directories they cannot read; below
//    it, every directory, file and symlink must belong to the caller
//    (AddDirectoryOptions), and nothing is followed or opened blocking;
//  - a restore never gives the restored tasks more than the user who made
//    the checkpoint had, whoever asks (root included): every task's and
//    every thread's uids and gids must be that user's, with no capability,
//    and CRIU restores with that user's credentials (`--unprivileged`), so
//    a crafted image cannot open files the user could not. Only a
//    checkpoint root made is restored with whatever the images say;
//  - TCP connections are re-created in repair mode (CAP_NET_ADMIN for a
//    user's CRIU) only where gpuckpt's own dump recorded them: the
//    checkpoint is one, or a copy whose socket and connection images equal
//    one of the same user's (MayRestoreTcpConnections).
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "core/base/display_text.h"
#include "core/base/log.h"
#include "core/base/scope_exit.h"
#include "core/base/small_file.h"
#include "core/base/unique_fd.h"
#include "core/base/unix_socket_state.h"
#include "core/criu/image_streamer.h"
#include "core/criu/images.h"
#include "core/engine/engine_impl.h"
#include "core/engine/engine_internal.h"
#include "core/engine/lazy_restore.h"
#include "core/proc/acting_as.h"
#include "core/proc/cgroup_placement.h"

namespace gpuckpt {
namespace {

// How a lazy restore's result says it was lazy.
constexpr char kLazyYes[] = "lazy: yes";

// Image records gpuckpt parses are small; a bigger one is not CRIU's.
constexpr uint64_t kMaxParsedImage = 64u << 20;
Result<std::string> ReadStoredFile(Store* store, const std::string& id, const std::string& path) {
  return ReadSmallStoredFile(*store, id, path, kMaxParsedImage);
}

bool IsRootPid(const CriuTask& t) { return t.ppid == 0; }

// A tree dumped with a pid namespace of its own (a container's init,
// `unshare -p`) has pid 1 at its root, and its pids are those inside the
// namespace: CRIU restores it in a new pid namespace, where they are free
// whatever runs here, and its root gets a new pid outside.
bool HasOwnPidNamespace(const CriuTask& root) { return root.pid == 1; }

// The images that say which TCP connections CRIU re-creates in repair mode:
// the sockets (addresses, ports, options: files.img) and each connection's
// sequence numbers and queues (tcp-stream-<inode>.img).
bool IsTcpStreamImage(const std::string& name) { return name.starts_with("tcp-stream-"); }

// Whether `info` is a checkpoint gpuckpt's own dump made, not an import
// (every import records where it came from).
bool IsOwnDump(const SnapshotInfo& info) { return ManifestOrEmpty(info.extra_json).IsOwnDump(); }

// Whether CRIU, restoring the images `images` of `id` as the ordinary user
// `as`, gets CAP_NET_ADMIN for TCP repair mode: false when they hold no TCP
// connection. In repair mode a socket binds a port whoever else uses it
// and takes any sequence numbers, so the connections must be ones gpuckpt's
// own dump of that user's process recorded: `id` is such a checkpoint, or
// a copy whose socket and connection images equal, byte for byte, those of
// one (kPermissionDenied otherwise, saying what to do).
Result<bool> MayRestoreTcpConnections(Store* store, CheckpointCatalog& catalog,
                                      const std::string& id, const std::set<std::string>& images,
                                      const Caller& as) {
  std::vector<std::string> network;
  for (const auto& name : images)
    if (IsTcpStreamImage(name)) network.push_back(name);
  if (network.empty()) return false;
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store->Get(id));
  if (IsOwnDump(info)) return true;
  if (images.count("files.img") != 0) network.push_back("files.img");
  std::map<std::string, std::string> wanted;
  for (const auto& name : network) {
    GPUCKPT_ASSIGN_OR_RETURN(wanted[name], ReadStoredFile(store, id, "images/" + name));
  }
  // Only checkpoints of the same process tree (its root's pid) can hold
  // the same connections: the others' images are not read.
  const int root_pid = OwnerOf(info).pid;
  GPUCKPT_ASSIGN_OR_RETURN(auto own_dumps, catalog.OwnDumpsOf(root_pid, as.uid));
  for (const std::string& theirs_id : own_dumps) {
    if (theirs_id == id) continue;
    bool same = true;
    for (const auto& [name, bytes] : wanted) {
      auto theirs = ReadStoredFile(store, theirs_id, "images/" + name);
      if (!theirs.ok() || *theirs != bytes) {
        same = false;
        break;
      }
    }
    if (same) return true;
  }
  return Status::PermissionDenied(fmt::format(
      "{} holds TCP connections ({}), which CRIU re-creates in TCP repair mode; for uid {} "
      "gpuckpt does that only for connections its own checkpoint of their process recorded, and "
      "no checkpoint of theirs in the store has these: restore the checkpoint it was copied from",
      id, network.front(), as.uid));
}

// One thread's credentials as the checkpoint's core-<tid>.img records them.
struct ThreadCreds {
  uint32_t pid = 0;  // its process
  uint32_t tid = 0;
  Result<CriuCreds> creds;  // what could not be parsed is no identity at all
};

// Every thread's credentials in the checkpoint `id`, whose tasks are
// `tasks`: CRIU restores each thread's from its own core-<tid>.img.
Result<std::vector<ThreadCreds>> ReadThreadCreds(Store* store, const std::string& id,
                                                 const std::vector<CriuTask>& tasks) {
  std::vector<ThreadCreds> all;
  for (const auto& task : tasks) {
    std::set<uint32_t> ids(task.threads.begin(), task.threads.end());
    ids.insert(task.pid);
    for (uint32_t tid : ids) {
      const std::string path = "images/core-" + std::to_string(tid) + ".img";
      GPUCKPT_ASSIGN_OR_RETURN(std::string bytes, ReadStoredFile(store, id, path));
      all.push_back({task.pid, tid, ParseCoreCreds(bytes, path)});
    }
  }
  return all;
}

bool NoCapabilities(const CriuCreds& c) {
  auto empty = [](const std::vector<uint32_t>& caps) {
    return std::all_of(caps.begin(), caps.end(), [](uint32_t cap) { return cap == 0; });
  };
  return empty(c.cap_prm) && empty(c.cap_eff) && empty(c.cap_inh) && empty(c.cap_amb);
}

// The one ordinary user whose tree the images hold: every thread's uids
// are that user's (not root) and no thread holds a capability. nullopt for
// a tree with root's or several users' threads.
std::optional<uint32_t> SoleUserOf(const std::vector<ThreadCreds>& threads) {
  std::optional<uint32_t> user;
  for (const ThreadCreds& t : threads) {
    if (!t.creds.ok()) return std::nullopt;
    const CriuCreds& c = t.creds.value();
    if (c.uid == 0 || c.euid != c.uid || c.suid != c.uid || c.fsuid != c.uid) return std::nullopt;
    if (!NoCapabilities(c) || (user && *user != c.uid)) return std::nullopt;
    user = c.uid;
  }
  return user;
}

// Whom CRIU restores as: the restored tasks may be no more than this user,
// and every file, mapping, working directory and executable of the tree is
// reopened with their rights. Rights follow the data, not the requester:
//  - a user restores as themselves (their own checkpoints only);
//  - for root, a checkpoint an ordinary user made is restored as that
//    user, and so is one root made (older versions recorded root as the
//    maker of root's checkpoints of users' jobs; root's import of a copy of
//    root's files) whose images hold one ordinary user's tree: as the user
//    they say, with the groups this machine's user database gives that
//    user (a checkpoint gpuckpt dumped itself: the groups its images
//    recorded, which CRIU read from the running tree);
//  - only a tree that held root's or several users' threads comes back as
//    root, with whatever its images say.
Result<Caller> RestoreIdentity(const Caller& requester, const CheckpointManifest& manifest,
                               const std::string& id, const std::vector<ThreadCreds>& threads) {
  if (!requester.is_root()) return requester;
  const ManifestMaker maker = manifest.MakerOrOwner();
  if (maker.uid != 0) return Caller{.uid = maker.uid, .gid = maker.gid, .groups = maker.groups};
  const std::optional<uint32_t> user = SoleUserOf(threads);
  if (!user) return Caller{};
  if (manifest.IsOwnDump()) {
    // Every gid the dumped threads held, as CRIU read them.
    Caller as{.uid = *user, .gid = threads.front().creds->gid};
    for (const ThreadCreds& t : threads) {
      const CriuCreds& c = t.creds.value();
      std::vector<uint32_t> held = c.groups;
      held.insert(held.end(), {c.gid, c.egid, c.sgid, c.fsgid});
      for (uint32_t g : held)
        if (!as.InGroup(g)) as.groups.push_back(g);
    }
    return as;
  }
  auto as = UserCaller(*user);
  if (!as.ok())
    return Status::PermissionDenied(
        fmt::format("checkpoint {} holds a tree of uid {}, which is restored as that user: {}", id,
                    *user, as.status().message()));
  return *as;
}

// A restore as `as` (not root) is allowed only for images whose every task
// and every thread has `as`'s uids and gids and holds no capability: CRIU
// restores each thread's credentials from its own core-<tid>.img, and would
// otherwise hand out another user's identity or root's powers.
Status CheckImageCredentials(const std::string& id, const std::vector<ThreadCreds>& threads,
                             const Caller& as) {
  if (as.is_root()) return Status::Ok();
  for (const ThreadCreds& t : threads) {
    if (!t.creds.ok()) {
      return Status::PermissionDenied(
          fmt::format("thread {} of checkpoint {} has no credentials that can be checked ({})",
                      t.tid, id, t.creds.status().message()));
    }
    const CriuCreds& c = t.creds.value();
    const bool uids = c.uid == as.uid && c.euid == as.uid && c.suid == as.uid && c.fsuid == as.uid;
    const bool gids =
        as.InGroup(c.gid) && as.InGroup(c.egid) && as.InGroup(c.sgid) && as.InGroup(c.fsgid) &&
        std::all_of(c.groups.begin(), c.groups.end(), [&](uint32_t g) { return as.InGroup(g); });
    if (!uids || !gids) {
      return Status::PermissionDenied(fmt::format(
          "thread {} of process {} in checkpoint {} claims uid {} gid {}, but the checkpoint "
          "can only be restored as uid {} (whose tree it is)",
          t.tid, t.pid, id, c.uid, c.gid, as.uid));
    }
    if (!NoCapabilities(c)) {
      return Status::PermissionDenied(fmt::format(
          "thread {} of process {} in checkpoint {} claims capabilities, which uid {} does not "
          "have",
          t.tid, t.pid, id, as.uid));
    }
  }
  return Status::Ok();
}

// CRIU restores every task and thread with its old id: each must be free.
Status CheckIdsFree(const std::vector<CriuTask>& tasks) {
  for (const auto& task : tasks) {
    std::vector<uint32_t> ids = task.threads;
    ids.push_back(task.pid);
    for (uint32_t id : ids) {
      if (id == 0 || id > 1u << 22) continue;
      const std::string proc = "/proc/" + std::to_string(id);
      struct stat st {};
      if (stat(proc.c_str(), &st) == 0) {
        auto info = ReadProcess(static_cast<int>(id), ProcReadOptions{.read_gpu_devices = false});
        // A process killed a moment ago (checkpoint --kill) keeps its pid
        // until its parent reaps it.
        if (info.ok() && info->zombie())
          return Status::Busy(fmt::format(
              "pid {} is still held by the exited '{}', which its parent (pid {}) has not reaped "
              "yet: a restore needs the checkpoint's own pids; try again once it has",
              id, DisplayText(info->comm), info->ppid));
        const std::string who = info.ok() ? " by '" + DisplayText(info->comm) + "'" : "";
        return Status::Busy(fmt::format(
            "pid {} is in use{}: a restore needs the checkpoint's own pids; stop that process "
            "first",
            id, who));
      }
    }
  }
  return Status::Ok();
}

// The root directory of a tree with a mount namespace of its own, which
// CRIU's restore mounts as the new namespace's "/" (--root): the caller's
// --root, else the one the checkpoint recorded (checkpoint.cc); "" for a
// tree without one (CRIU then needs none). Only root restores into a
// directory of their choosing, and only a CRIU that runs as root (`as`:
// what root made) can make a mount namespace and mount it.
Result<std::string> RootDirFor(const RestoreRequest& request, const CheckpointManifest& manifest,
                               const Caller& as) {
  if (!request.root.empty() && !request.caller.is_root())
    return Status::PermissionDenied("restore --root is root's: it makes a mount namespace");
  std::string root = request.root;
  const bool mount_namespace = manifest.mount_namespace.has_value();
  // A container engine's checkpoint (runc's, under Podman or CRI-O) names
  // the container's bind mounts for the engine's restore, which maps each
  // to a path of the new container: CRIU alone cannot place them.
  if (mount_namespace && manifest.container)
    return Status::InvalidArgument(
        "this is a container engine's checkpoint: restore it with the engine, e.g. podman "
        "container restore --import <mount>/archives/<id>.tar");
  if (root.empty() && mount_namespace) {
    root = manifest.mount_namespace->root.value_or("");
    if (root.empty())
      return Status::InvalidArgument(
          "the checkpoint's process had a mount namespace of its own whose root directory is "
          "not known here: restore it with --root DIR");
  }
  if (root.empty()) return root;
  if (root[0] != '/')
    return Status::InvalidArgument("--root " + DisplayText(root) + " is not absolute");
  if (!as.is_root())
    return Status::PermissionDenied(
        "the checkpoint's process had a mount namespace of its own, which only a checkpoint "
        "root made can bring back (CRIU makes namespaces as root only)");
  struct stat st {};
  if (stat(root.c_str(), &st) != 0)
    return StatusFromErrno(errno, "the root directory " + DisplayText(root));
  if (!S_ISDIR(st.st_mode))
    return Status::InvalidArgument("the root directory " + DisplayText(root) +
                                   " is not a directory");
  return root;
}

// Stored images go to CRIU in blocks of kStreamBlock, StreamAhead() of them
// read ahead, each on its own thread: a block's chunks are looked up and
// checked one after another, so the blocks in flight are what uses the
// cores (3 were enough for two cores; a GPU host's restore of 32 GiB went
// at 0.9 GB/s with 3 on 16 cores).
constexpr size_t kStreamBlock = 4u << 20;
size_t StreamAhead() {
  static const size_t ahead = std::clamp<size_t>(std::thread::hardware_concurrency(), 3, 16);
  return ahead;
}

// A block of anonymous memory of its own mapping, unmapped when destroyed.
// Its pages are handed to CRIU's pipe by reference (vmsplice), so they must
// not change until CRIU has read them, and must never come back to the
// allocator while a pipe may still hold them (another restore would write
// other data into them): a mapping of its own, unmapped at the end, gives
// them up for good.
class MappedBlock {
 public:
  explicit MappedBlock(size_t size) : size_(size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~MappedBlock() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  MappedBlock(const MappedBlock&) = delete;
  MappedBlock& operator=(const MappedBlock&) = delete;
  char* data() const { return data_; }

 private:
  const size_t size_;
  char* data_;
};

// Hands `len` bytes at `data` to `fd`: by reference with vmsplice when `fd`
// is a pipe (`pipe_capacity` > 0; the bytes must then not change until read,
// see StreamFile), else with write(). *gone: CRIU closed its end (it read
// what it needed).
Status GiveToCriu(int fd, bool is_pipe, const char* data, size_t len, const std::string& name,
                  bool* gone) {
  size_t done = 0;
  while (done < len) {
    ssize_t w;
    if (is_pipe) {
      iovec iov{const_cast<char*>(data + done), len - done};
      w = vmsplice(fd, &iov, 1, 0);
    } else {
      w = write(fd, data + done, len - done);
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EPIPE) {
      *gone = true;
      return Status::Ok();
    }
    if (w < 0) return StatusFromErrno(errno, "serving " + name + " to CRIU");
    done += static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Writes a stored file into CRIU's pipe. The next blocks are read (looked
// up, decompressed, checked) on other threads while this one hands them
// over: one reader alone is slower than CRIU takes the pages in.
//
// Blocks go into the pipe by reference, which saves the copy into the pipe
// (on the one thread that feeds CRIU, the bottleneck of a restore: 4.7 GB/s
// against 2.4 GB/s with write() between two threads on the 2-core build
// machine). A block is reused only once CRIU has read all of it: a pipe of
// capacity C holds at most C bytes, so everything given more than C bytes
// ago has been read.
// The blocks StreamFile reads into. A block given to a pipe of capacity C
// is reused once C more bytes were given after it (CRIU has read it); one
// written to anything else, at once.
class StreamBlocks {
 public:
  // `pipe_capacity`: 0 when the descriptor is no pipe.
  explicit StreamBlocks(int pipe_capacity) : pipe_capacity_(pipe_capacity) {}

  // An idle block, else a new one.
  Result<MappedBlock*> Take(const std::string& name) {
    if (!idle_.empty()) {
      MappedBlock* block = idle_.back();
      idle_.pop_back();
      return block;
    }
    owned_.push_back(std::make_unique<MappedBlock>(kStreamBlock));
    if (owned_.back()->data() == nullptr) {
      return StatusFromErrno(errno, "memory for serving " + name);
    }
    return owned_.back().get();
  }

  // `block` was handed over, which made `total_given` bytes in all.
  void Given(MappedBlock* block, uint64_t total_given) {
    if (pipe_capacity_ <= 0) {
      idle_.push_back(block);
      return;
    }
    given_.push_back(GivenBlock{block, total_given});
    while (!given_.empty() &&
           given_.front().end + static_cast<uint64_t>(pipe_capacity_) <= total_given) {
      idle_.push_back(given_.front().memory);
      given_.pop_front();
    }
  }

 private:
  struct GivenBlock {
    MappedBlock* memory;
    uint64_t end;  // bytes given to CRIU once this block was
  };
  const int pipe_capacity_;
  std::vector<std::unique_ptr<MappedBlock>> owned_;  // all blocks
  std::vector<MappedBlock*> idle_;
  std::deque<GivenBlock> given_;  // handed over, perhaps not read yet, oldest first
};

// Writes a stored file into CRIU's pipe. The next blocks are read (looked
// up, decompressed, checked) on other threads while this one hands them
// over: one reader alone is slower than CRIU takes the pages in.
//
// Blocks go into the pipe by reference, which saves the copy into the pipe
// (on the one thread that feeds CRIU, the bottleneck of a restore: 4.7 GB/s
// against 2.4 GB/s with write() between two threads on the 2-core build
// machine). A block is reused only once CRIU has read all of it: a pipe of
// capacity C holds at most C bytes, so everything given more than C bytes
// ago has been read.
Status StreamFile(FileReader* reader, int fd, const std::string& name,
                  const std::function<void(size_t)>& on_written) {
  const int capacity = fcntl(fd, F_GETPIPE_SZ);
  const bool is_pipe = capacity > 0;
  struct Block {
    MappedBlock* memory = nullptr;
    std::future<Result<size_t>> read;
  };
  StreamBlocks blocks(is_pipe ? capacity : 0);  // destroyed last
  std::deque<Block> ahead;
  // Declared after the blocks: its futures are waited for before the
  // memory they read into goes away.
  ScopeExit wait_for_reads([&ahead] {
    for (auto& b : ahead)
      if (b.read.valid()) b.read.wait();
  });

  const uint64_t size = reader->entry().size;
  uint64_t next = 0;
  uint64_t total_given = 0;
  auto launch = [&]() -> Status {
    Block b;
    GPUCKPT_ASSIGN_OR_RETURN(b.memory, blocks.Take(name));
    b.read = std::async(std::launch::async, [reader, offset = next, buf = b.memory->data()] {
      return reader->Pread(offset, kStreamBlock, buf);
    });
    next += kStreamBlock;
    ahead.push_back(std::move(b));
    return Status::Ok();
  };
  while (next < size && ahead.size() < StreamAhead()) GPUCKPT_RETURN_IF_ERROR(launch());
  while (!ahead.empty()) {
    Block b = std::move(ahead.front());
    ahead.pop_front();
    Result<size_t> n = b.read.get();
    if (!n.ok()) return n.status().WithContext("image " + name);
    bool gone = false;
    GPUCKPT_RETURN_IF_ERROR(GiveToCriu(fd, is_pipe, b.memory->data(), *n, name, &gone));
    if (gone) return Status::Ok();
    total_given += *n;
    blocks.Given(b.memory, total_given);
    on_written(*n);
    if (next < size) GPUCKPT_RETURN_IF_ERROR(launch());
  }
  return Status::Ok();
}

// The names of a checkpoint's image files, relative to images/.
std::set<std::string> ImageNames(const std::vector<FileEntry>& files) {
  std::set<std::string> images;
  for (const auto& f : files) {
    if (f.type == FileType::kRegular && f.path.compare(0, 7, "images/") == 0)
      images.insert(f.path.substr(7));
  }
  return images;
}

// Opens the restore's CRIU logs in `work`; when CRIU runs as `as` (not
// root), it gets `work_paths`: it writes its log there and connects to the
// socket. The work dir's parent stays root's.
Result<std::unique_ptr<CriuLogs>> PrepareRestoreRunner(const std::string& work,
                                                       const std::vector<std::string>& work_paths,
                                                       const Caller& as) {
  // Made before the work dir is the user's, so the names are the daemon's.
  GPUCKPT_ASSIGN_OR_RETURN(
      auto criu_logs,
      CriuLogs::Create(work, "restore.log",
                       as.is_root() ? std::nullopt : std::optional<uint32_t>(as.uid), as.gid));
  if (!as.is_root()) GPUCKPT_RETURN_IF_ERROR(GiveTo(as.uid, as.gid, work_paths));
  return criu_logs;
}

// Streams the checkpoint's image files to `criu`, as it asks for them.
Status ServeImages(Store* store, const std::string& id, const std::set<std::string>& images,
                   ImageServeServer& server, const CriuProcess& criu,
                   OperationBoard::Ticket* ticket) {
  std::atomic<uint64_t> served_bytes{0};
  return server.Serve(
      [&](const std::string& name) { return images.count(name) > 0; },
      [&](const std::string& name, int fd) -> Status {
        GPUCKPT_ASSIGN_OR_RETURN(auto reader, store->OpenFile(id, "images/" + name));
        return StreamFile(reader.get(), fd, name,
                          [&](size_t n) { ticket->SetBytes(served_bytes.fetch_add(n) + n); });
      },
      criu.pidfd(), criu.pid());
}

// The pid of the restored tree's root. CRIU (perhaps the user's) wrote the
// pid file into the work dir: read as untrusted, and only believed when it
// names the tree's root, which CRIU restores with its old pid.
Result<int> ReadRestoredRootPid(const std::string& id, const std::string& pidfile, int root_pid) {
  auto pid_text = ReadSmallFileNoFollow(pidfile, 32);
  const int pid = pid_text.ok() ? std::atoi(pid_text->c_str()) : 0;
  if (pid <= 0) return Status::IOError("criu restored " + id + " but wrote no pid");
  if (root_pid == 1) {
    // In a new pid namespace the root's pid here is new: believed when that
    // process is the init of a namespace below ours.
    auto handle = ProcessHandle::Open(pid);
    auto ns_pids = handle.ok() ? handle->ReadNamespacePids() : handle.status();
    if (!ns_pids.ok() || ns_pids->size() < 2 || ns_pids->back() != 1)
      return Status::IOError(fmt::format(
          "criu restored {} but says its root is pid {}, which is no pid namespace's init", id,
          pid));
  } else if (pid != root_pid)
    return Status::IOError(
        fmt::format("criu restored {} but says its root is pid {}, not {}", id, pid, root_pid));
  return pid;
}

// The checkpoint's GPU stack and GPUs, as the manifest names them, and
// where the request maps them.
GpuRestoreOptions RestoreGpuOptions(const RestoreRequest& request,
                                    const CheckpointManifest& manifest) {
  GpuRestoreOptions gpu_options;
  gpu_options.gpu_map = request.gpu_map;
  gpu_options.checkpoint_stacks = manifest.gpu_backend;
  for (const auto& g : manifest.gpus) gpu_options.checkpoint_gpus.push_back(g.uuid);
  return gpu_options;
}

}  // namespace

Result<int> EngineImpl::Restore(const RestoreRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  RestoreNotes notes;
  auto pid = ResolveAndRestore(request, &notes);
  // A copy that could not be restored leaves nothing behind in the store:
  // the copy itself is where it was.
  if (!pid.ok() && notes.imported) {
    store_->Remove(notes.id).PermitUnchecked();
    catalog_.Remove(notes.id);
  }
  ReleaseFreeMemory();
  if (notes.imported) NoteStoreChanged();
  RecordRestoreEnd(request, notes, pid, start);
  // Shown under its new pid, GPU or not, so that its next checkpoint needs
  // no `track`; a tree that has already ended is simply not shown.
  if (pid.ok() && !processes_->Track(*pid).ok()) processes_->Invalidate();
  return pid;
}

Result<int> EngineImpl::ResolveAndRestore(const RestoreRequest& request, RestoreNotes* notes) {
  GPUCKPT_ASSIGN_OR_RETURN(notes->id, ResolveRestoreSource(request, &notes->imported));
  const std::string& id = notes->id;
  GPUCKPT_ASSIGN_OR_RETURN(SnapshotInfo info, store_->Get(id));
  Result<CheckpointManifest> manifest = DecodeManifest(info.extra_json);
  if (!manifest.ok()) return manifest.status().WithContext("checkpoint " + id);
  GPUCKPT_ASSIGN_OR_RETURN(std::string pstree, ReadStoredFile(store_, id, "images/pstree.img"));
  auto tasks = ParsePstreeImage(pstree);
  if (!tasks.ok())
    return Status::InvalidArgument("checkpoint " + id + ": " + tasks.status().message());
  auto root = std::find_if(tasks->begin(), tasks->end(), IsRootPid);
  if (root == tasks->end())
    return Status::InvalidArgument("checkpoint " + id + " names no root process");
  GPUCKPT_ASSIGN_OR_RETURN(const auto threads, ReadThreadCreds(store_, id, *tasks));
  GPUCKPT_ASSIGN_OR_RETURN(const Caller as,
                           RestoreIdentity(request.caller, *manifest, id, threads));
  GPUCKPT_RETURN_IF_ERROR(CheckImageCredentials(id, threads, as));
  if (!HasOwnPidNamespace(*root)) GPUCKPT_RETURN_IF_ERROR(CheckIdsFree(*tasks));
  // Whether CRIU needed --shell-job (an imported plain image dir is tried
  // as a standalone tree).
  const bool shell_job = manifest->shell_job.value_or(false);
  GPUCKPT_ASSIGN_OR_RETURN(std::string root_dir, RootDirFor(request, *manifest, as));
  GPUCKPT_ASSIGN_OR_RETURN(CriuGpuSetup gpu,
                           gpu_->SetupForRestore(RestoreGpuOptions(request, *manifest)));
  bool lazy = request.lazy.value_or(options_.lazy_restore);
  if (lazy) {
    const std::string why_not =
        WhyNotLazy({options_.mount_serves_images, HasOwnPidNamespace(*root) || !root_dir.empty(),
                    as.is_root()});
    lazy = why_not.empty();
    notes->lazy_note = lazy ? kLazyYes : "lazy: no (" + why_not + ")";
  }
  // A tree with its own pid namespace gets new pids outside, so no
  // process here is its: no status shows its restore, nothing waits.
  std::unique_ptr<OperationBoard::Ticket> ticket = OperationBoard::Unlisted();
  const int board_pid = HasOwnPidNamespace(*root) ? 0 : static_cast<int>(root->pid);
  if (board_pid != 0) {
    GPUCKPT_ASSIGN_OR_RETURN(ticket, board_.Begin(board_pid, "restore"));
    // CRIU reads about the checkpoint's logical size; `cat restore` shows
    // the caller how far it is meanwhile.
    ticket->SetExpectedBytes(info.logical_bytes);
    NoteRestoreInFlight(request.caller.uid, board_pid, id);
  }
  ScopeExit in_flight_ended([&] {
    if (board_pid != 0) ForgetRestoreInFlight(request.caller.uid, board_pid);
  });
  // The last moment the caller can give up: CRIU has not run.
  GPUCKPT_RETURN_IF_ERROR(CheckNotCancelled(request.caller, "the restore of " + id));
  auto pid = RestoreSnapshot(id, {shell_job, root_dir, request.join_cgroup, lazy}, gpu, as,
                             request.caller.pid, static_cast<int>(root->pid), request.caller.uid,
                             ticket.get(), notes);
  ticket->SetCheckpoint(id);
  if (pid.ok()) {
    ticket->SetResult(fmt::format("restore of {} ok as pid {}", id, *pid));
  } else {
    ticket->SetFailure(pid.status());
  }
  return pid;
}

void EngineImpl::RecordRestoreEnd(const RestoreRequest& request, const RestoreNotes& notes,
                                  const Result<int>& pid,
                                  std::chrono::steady_clock::time_point start) {
  const std::string& id = notes.id;
  const std::string& kept_log = notes.kept_log;
  const std::string& lazy_note = notes.lazy_note;
  metrics_.CountOperation("restore", pid.ok() ? "ok" : ResultLabel(pid.status().code()));
  const auto now = std::chrono::steady_clock::now();
  const double total_s = std::chrono::duration<double>(now - start).count();
  if (pid.ok()) {
    // criu_s against total_s: whether the time went to CRIU or to the
    // daemon after it.
    const double criu_s =
        std::chrono::duration<double>(notes.criu_exited.value_or(now) - start).count();
    spdlog::info(
        "restore uid={} id={} pid={} result=ok imported={} lazy={} criu_s={:.3f} total_s={:.3f}",
        request.caller.uid, LogValue(id), pid.value(), notes.imported, lazy_note == kLazyYes,
        criu_s, total_s);
  } else {
    LogOperationEnd(pid.status(), "restore uid={} id={} path={} result={} error={}{}",
                    request.caller.uid, LogValue(id.empty() ? "-" : id),
                    LogValue(DisplayText(request.path)), ResultLabel(pid.status().code()),
                    LogValue(pid.status().message()),
                    kept_log.empty() ? "" : " criu_log=" + LogValue(kept_log));
  }
  // The new pid first, alone on its line; then what the restore added to
  // the store, if anything.
  std::string said = pid.ok() ? "pid " + std::to_string(pid.value())
                              : "error: " + pid.status().message() +
                                    (kept_log.empty() ? "" : "\ncriu_log: " + kept_log);
  if (pid.ok() && notes.imported) said += "\nimported: " + id;
  if (pid.ok() && !lazy_note.empty()) said += "\n" + lazy_note;
  // A lazy one's: until its server ends, `cat restore` adds how far the
  // tree is in.
  SetLastResult(ResultFile::kRestore, request.caller.uid, std::move(said),
                pid.ok() && lazy_note == kLazyYes ? pid.value() : 0);
}

Result<int> EngineImpl::RestoreSnapshot(const std::string& id, const TreeSetup& setup,
                                        const CriuGpuSetup& gpu, const Caller& as, int restorer_pid,
                                        int root_pid, uint32_t caller_uid,
                                        OperationBoard::Ticket* ticket, RestoreNotes* notes) {
  const auto start = std::chrono::steady_clock::now();
  GPUCKPT_ASSIGN_OR_RETURN(auto files, store_->ListFiles(id));
  const std::set<std::string> images = ImageNames(files);
  GPUCKPT_ASSIGN_OR_RETURN(std::shared_ptr<WorkDir> work_dir, MakeWorkDir("restore-" + id));
  const std::string& work = work_dir->path();
  // Eager: the images are streamed to CRIU through a socket in the work
  // dir. Lazy: CRIU and its lazy-pages server read them from the mount,
  // where each is read from the store as it is asked for, and the server
  // must seek in the page images.
  const std::string images_dir =
      setup.lazy ? options_.mountpoint + "/checkpoints/" + id + "/images" : work + "/images";
  std::unique_ptr<ImageServeServer> server;
  std::vector<std::string> work_paths = {work};
  std::shared_ptr<CriuLogs> lazy_logs;
  if (setup.lazy) {
    // Made before the work dir is the user's, as the restore's own.
    GPUCKPT_ASSIGN_OR_RETURN(
        lazy_logs, CriuLogs::Create(work, "lazy-pages.log",
                                    as.is_root() ? std::nullopt : std::optional<uint32_t>(as.uid),
                                    as.gid, "lazy-pages.stderr"));
  } else {
    if (mkdir(images_dir.c_str(), 0700) != 0) return StatusFromErrno(errno, images_dir);
    GPUCKPT_ASSIGN_OR_RETURN(server, ImageServeServer::Listen(images_dir));
    work_paths.insert(work_paths.end(), {images_dir, server->socket_path()});
  }
  GPUCKPT_ASSIGN_OR_RETURN(auto criu_logs, PrepareRestoreRunner(work, work_paths, as));
  const std::string pidfile = work + "/restored.pid";
  GPUCKPT_ASSIGN_OR_RETURN(CriuCommand cmd,
                           RestoreCommand(id, images, setup, gpu, as, work, images_dir, pidfile));
  cmd.stderr_fd = criu_logs->stderr_fd();

  ticket->SetStage("restore");
  // Cgroups of the tree's own below the restorer's, not the daemon's, so
  // that stopping the daemon never kills it and the restorer's limits hold
  // (cgroup_placement.h): CRIU joins them before it runs, and everything it
  // restores starts there. Or the restorer's own, when asked.
  GPUCKPT_ASSIGN_OR_RETURN(auto cgroup, setup.join_cgroup
                                            ? JoinRestorerCgroup(restorer_pid)
                                            : MakeRestoreCgroup(restorer_pid, root_pid));
  cmd.join_cgroup_fds = cgroup->procs_fds();
  // The lazy-pages server first: the restore connects to its socket. It
  // runs in the tree's cgroups, so that no stop of the daemon's service
  // signals it, and it ends with the tree's job.
  std::optional<CriuProcess> lazy_server;
  if (setup.lazy) {
    GPUCKPT_ASSIGN_OR_RETURN(lazy_server, StartLazyServer(cmd, gpu, images_dir, work, *lazy_logs));
  }
  auto criu = criu_.Start(cmd);
  if (!criu.ok()) {
    if (lazy_server) StopLazyServer(*lazy_server);
    return criu.status();
  }
  Status served = server ? ServeImages(store_, id, images, *server, *criu, ticket) : Status::Ok();
  Result<int> exit = criu->Wait();
  notes->criu_exited = std::chrono::steady_clock::now();
  metrics_.ObserveStage("restore", "restore",
                        std::chrono::duration<double>(*notes->criu_exited - start).count());
  if (!served.ok() || !exit.ok() || *exit != 0) {
    // A failed restore killed what it had restored; its server may still
    // wait for a connection.
    if (lazy_server) StopLazyServer(*lazy_server);
    return RecordCriuFailure("criu restore of " + id, "restore-" + id, *criu_logs, served, exit,
                             ticket, &notes->kept_log);
  }
  auto pid = ReadRestoredRootPid(id, pidfile, root_pid);
  if (!pid.ok()) {
    if (lazy_server) StopLazyServer(*lazy_server);
    return pid.status();
  }
  if (!lazy_server) {
    work_dir->MarkSucceeded();
    return *pid;
  }
  // The server lives on until the tree is resident; its work dir and logs
  // with it.
  uint64_t page_bytes = 0;
  for (const FileEntry& f : files)
    if (f.path.starts_with("images/pages-")) page_bytes += f.size;
  // A daemon that dies before the tree is resident leaves this entry for
  // the next one to report.
  if (auto root = ReadProcess(*pid, ProcReadOptions{.read_gpu_devices = false}); root.ok()) {
    Status journaled =
        LazyJournal(LazyJournalDir()).Add({*pid, root->start_time, id, work_dir->path()});
    if (!journaled.ok())
      spdlog::warn("lazy restore id={} pid={}: not journaled: {}", LogValue(id), *pid,
                   LogValue(journaled.message()));
  }
  lazy_servers_.Adopt(id, *pid, caller_uid, page_bytes, start, std::move(*lazy_server),
                      [this, work_dir, lazy_logs, id](bool resident) -> std::string {
                        if (resident) {
                          work_dir->MarkSucceeded();
                          return "";
                        }
                        std::string kept = KeepCriuLog(*lazy_logs, "lazy-pages-" + id);
                        std::string why = CriuFailureCause(lazy_logs->Summary());
                        return kept.empty() ? why : why + " (log: " + kept + ")";
                      });
  return *pid;
}

void EngineImpl::LazyRestoreEnded(const LazyServers::Ended& ended) {
  const bool resident = ended.exit_code == 0;
  metrics_.ObserveLazyRestore(resident, ended.expected_bytes, ended.seconds);
  LazyJournal(LazyJournalDir()).Remove(ended.tree_pid);
  std::string line;
  if (resident) {
    spdlog::info(
        "lazy restore id={} pid={} result=resident bytes={} copied_by_daemon={} "
        "total_s={:.3f}",
        LogValue(ended.id), ended.tree_pid, ended.expected_bytes, ended.copied_bytes,
        ended.seconds);
    line = fmt::format("resident: all {:.1f} MB, in {:.1f} s", ended.expected_bytes / 1e6,
                       ended.seconds);
  } else {
    // Its server killed the tree's unfinished processes before it exited.
    spdlog::warn("lazy restore id={} pid={} result=killed total_s={:.3f} error={}",
                 LogValue(ended.id), ended.tree_pid, ended.seconds, LogValue(ended.why));
    line = "killed: its memory could not all come in: " + ended.why;
  }
  MutexLock lock(&mu_);
  auto it = last_results_.find({ResultFile::kRestore, ended.caller_uid});
  // Unless a later result of the caller's has taken the place.
  if (it == last_results_.end() || it->second.lazy_pid != ended.tree_pid) return;
  it->second.text += line + "\n";
  it->second.lazy_pid = 0;
}

Result<CriuProcess> EngineImpl::StartLazyServer(const CriuCommand& restore, const CriuGpuSetup& gpu,
                                                const std::string& images_dir,
                                                const std::string& work, const CriuLogs& logs) {
  CriuCommand cmd = restore;
  // As the restore runs: as root, since only root's trees are restored
  // lazily (WhyNotLazy), and with its plugins (a GPU tree's cuda_plugin).
  cmd.args = {"lazy-pages", "-D",       images_dir,       "-W", work, "-o", "lazy-pages.log",
              "-v2",        "--libdir", PluginDirFor(gpu)};
  // A CPU tree at work faults again microseconds after each fault is
  // served: the server waits 1 ms for that before a background transfer
  // (tools/criu-patches/0006), and where the faults come at a fixed stride
  // it transfers along that stride ahead of them (0007). Not a GPU tree's:
  // its driver faults without pause while it restores device memory, and
  // the background transfers going on from its last fault are what bring
  // its pages in ahead of it.
  if (gpu.stacks == GpuStacks::kNone) {
    cmd.environment.push_back("GPUCKPT_LAZY_FAULT_HOLD_MS=1");
    cmd.environment.push_back("GPUCKPT_LAZY_FOLLOW_STRIDES=1");
    // Its reads bypass the page cache (LazyServers::BypassesPageCache()),
    // and the daemon copies them into the tree itself (0008).
    cmd.environment.push_back("GPUCKPT_LAZY_COPY_BY_DAEMON=1");
    // Where --lazy-copy-batch-mib asks for it, its background transfers
    // come in batches the daemon reads and copies side by side (0009).
    if (options_.lazy_copy_batch_mib > 0)
      cmd.environment.push_back("GPUCKPT_LAZY_COPY_BATCH_MIB=" +
                                std::to_string(options_.lazy_copy_batch_mib));
  }
  cmd.stderr_fd = logs.stderr_fd();
  GPUCKPT_ASSIGN_OR_RETURN(CriuProcess server, criu_.Start(cmd));
  lazy_servers_.NoteStarting(server.pid(), /*through_page_cache=*/gpu.stacks != GpuStacks::kNone);
  // Ready once its socket listens: its file appears at bind(), and a
  // restore that connects before listen() is refused. Where the kernel
  // cannot tell, once the file is there (listen() follows at once). A
  // server that exits first failed.
  const std::string socket = work + "/lazy-pages.socket";
  for (int waited_ms = 0; waited_ms < 10000; waited_ms += 2) {
    Result<bool> listens = UnixSocketListens(socket);
    if (listens.ok() && *listens) return server;
    struct stat st;
    if (listens.status().code() == StatusCode::kUnavailable && lstat(socket.c_str(), &st) == 0)
      return server;
    struct pollfd exited = {server.pidfd(), POLLIN, 0};
    if (poll(&exited, 1, 2) > 0) {
      lazy_servers_.ForgetStarting(server.pid());
      Result<int> code = server.Wait();
      return Status::Internal("criu lazy-pages exited before it listened (exit " +
                              (code.ok() ? std::to_string(*code) : code.status().message()) +
                              "): " + CriuFailureCause(logs.Summary()));
    }
  }
  StopLazyServer(server);
  return Status::Internal("criu lazy-pages did not listen within 10 s");
}

void EngineImpl::StopLazyServer(CriuProcess& server) {
  // Only when no tree of its is running: a failed restore killed it.
  lazy_servers_.ForgetStarting(server.pid());
  kill(server.pid(), SIGKILL);
  server.Wait().status().PermitUnchecked();
}

Result<CriuCommand> EngineImpl::RestoreCommand(const std::string& id,
                                               const std::set<std::string>& images,
                                               const TreeSetup& setup, const CriuGpuSetup& gpu,
                                               const Caller& as, const std::string& work,
                                               const std::string& images_dir,
                                               const std::string& pidfile) {
  CriuCommand cmd;
  cmd.work_dir = work;
  cmd.args = {
      "restore",   "-d",    "-D",       images_dir,       "-W", work, "-o", "restore.log", "-v4",
      "--pidfile", pidfile, "--libdir", PluginDirFor(gpu)};
  // Eager: the images come through the image streamer's socket. Lazy:
  // from the mount, private anonymous memory from the lazy-pages server.
  cmd.args.push_back(setup.lazy ? "--lazy-pages" : "--stream");
  if (setup.shell_job) cmd.args.push_back("--shell-job");
  // A mount namespace's bind mounts of the host's files (checkpoint.cc)
  // come from where the dump found them (mnt[]).
  if (!setup.root_dir.empty())
    cmd.args.insert(cmd.args.end(), {"--root", setup.root_dir, "--external", "mnt[]"});
  // The TCP connections the dump took (checkpoint.cc) are restored too.
  cmd.args.push_back("--tcp-established");
  // The tree starts in cgroups made for it (RestoreSnapshot), and CRIU
  // leaves cgroups alone: those an image names are never believed (they
  // may be another user's session). Except for a tree with a mount
  // namespace of its own (root's alone, of a checkpoint root made): a
  // container's mounts bind its cgroups' directories, which its engine
  // removed when it stopped, so CRIU makes them again and puts the tasks
  // there (its default).
  if (setup.root_dir.empty()) cmd.args.push_back("--manage-cgroups=ignore");
  if (!as.is_root()) {
    cmd.args.push_back("--unprivileged");
    // CAP_SETPCAP as well: CRIU's restorer drops every capability missing
    // from the image's bounding set one by one, which needs it. The image's
    // credentials were checked to hold no capability at all.
    cmd.run_as = CriuCredentials{as.uid, as.gid, as.groups,
                                 /*keep_sys_ptrace=*/false, /*keep_setpcap=*/true};
    GPUCKPT_ASSIGN_OR_RETURN(cmd.run_as->keep_net_admin,
                             MayRestoreTcpConnections(store_, catalog_, id, images, as));
  }
  cmd.args.insert(cmd.args.end(), gpu.criu_args.begin(), gpu.criu_args.end());
  cmd.path_prepend = gpu.path_prepend;
  cmd.environment = gpu.environment;
  return cmd;
}

}  // namespace gpuckpt
