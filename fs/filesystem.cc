#define FUSE_USE_VERSION 312
#include "fs/filesystem.h"

#include <fuse3/fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/base/mutex.h"
#include "core/base/scope_exit.h"
#include "core/proc/mount_table.h"
#include "fs/command_runner.h"
#include "fs/commands.h"
#include "fs/graceful_stop.h"
#include "fs/inode_table.h"
#include "fs/kernel_readahead.h"
#include "fs/lazy_page_copy.h"
#include "fs/store_view.h"
#include "fs/stream_read_ahead.h"

namespace gpuckpt {
namespace {

// Kernel caches of names and attributes. Everything under checkpoints/ is
// immutable once published, so this only bounds how long a new checkpoint
// takes to show in a cached listing.
constexpr double kCacheSeconds = 1.0;

// Commands one uid may run at once (each on a thread of its own); the next
// write is refused with EBUSY until one ends.
constexpr size_t kMaxCommandsPerUid = 64;

// The kernel shares a cached name among all users, and only a lookup sees
// who asks: checkpoints/<id>, device/<id>, archives/<id>.tar and <pid> are
// never cached, so that every path through them is looked up again as the
// caller (to whom someone else's is absent); nor are the control files,
// each caller's own (DoLookup).
double EntrySeconds(const NodeId& node) {
  const bool per_caller = node.kind == NodeKind::kSnapshotDir ||
                          node.kind == NodeKind::kDeviceSnapshotDir ||
                          node.kind == NodeKind::kArchive || node.kind == NodeKind::kPidDir ||
                          StoreView::IsControl(node.kind);
  return per_caller ? 0 : kCacheSeconds;
}

// What a change to the tree is refused with: inside a checkpoint, its
// device/<id>, or to its archives/<id>.tar, whose contents never change,
// EROFS; elsewhere, where the names are gpuckpt's (processes, control
// files, checkpoints made by commands, device/ and archives/ themselves),
// EPERM. Status has neither, hence errno values here.
int RefusalErrno(const NodeId& where) {
  const bool read_only = StoreView::InCheckpoint(where.kind) ||
                         StoreView::InDeviceView(where.kind) ||
                         StoreView::InArchiveView(where.kind);
  return read_only ? EROFS : EPERM;
}

// The caller of a request, as the kernel reports it. Supplementary groups
// are read from /proc only where a decision needs them (restore, import).
Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  Caller c;
  c.uid = ctx->uid;
  c.gid = ctx->gid;
  c.pid = ctx->pid;
  return c;
}

// A checkpoint's directory open in a process: the checkpoint's key and the
// process's pid.
struct OpenCheckpoint {
  uint64_t key = 0;
  int pid = 0;
  auto operator<=>(const OpenCheckpoint&) const = default;
};

class Filesystem {
 public:
  // `read_ahead`: where a lazy restore's server is read ahead for (null:
  // it is not), as `read_ahead_options` say; borrowed, outlives the
  // filesystem.
  Filesystem(Store* store, Engine* engine, JobThreads* read_ahead,
             StreamReadAhead::Options read_ahead_options)
      : store_(store),
        engine_(engine),
        read_ahead_(read_ahead),
        read_ahead_options_(read_ahead_options),
        view_(store, engine),
        commands_(kMaxCommandsPerUid) {}
  // Handles the kernel never released (the session ended while files were
  // open: a daemon stopped or unmounted lazily) go with the filesystem.
  ~Filesystem() {
    for (FileHandle* h : kernel_files_) delete h;
    for (DirHandle* h : kernel_dirs_) delete h;
  }

  static Filesystem* From(fuse_req_t req) {
    return static_cast<Filesystem*>(fuse_req_userdata(req));
  }

  Result<fuse_entry_param> DoLookup(fuse_ino_t parent, const char* name, const Caller& caller) {
    GPUCKPT_ASSIGN_OR_RETURN(NodeId dir, Node(parent));
    GPUCKPT_ASSIGN_OR_RETURN(NodeId child, view_.Child(dir, name, caller));
    // The kernel holds a file's lock through every write to it (and
    // through the truncation of a shell's `>`), which for a control file
    // lasts as long as the command runs: each caller (thread) gets a node
    // of its own, so that no caller's command ever holds another's write
    // (other users' and root's included).
    if (StoreView::IsControl(child.kind)) child.writer = caller.pid;
    GPUCKPT_ASSIGN_OR_RETURN(struct stat st, view_.Attributes(child, caller));
    fuse_entry_param e{};
    e.ino = inodes_.Ref(child);
    st.st_ino = e.ino;
    e.attr = st;
    e.attr_timeout = kCacheSeconds;
    e.entry_timeout = EntrySeconds(child);
    return e;
  }

  Result<struct stat> DoGetattr(fuse_ino_t ino, const Caller& caller) EXCLUDES(mu_) {
    GPUCKPT_ASSIGN_OR_RETURN(NodeId node, Node(ino));
    auto st = view_.Attributes(node, caller);
    if (!st.ok() && st.status().code() == StatusCode::kNotFound) {
      // A file of a removed checkpoint that is still open: fstat() works
      // on it, as on any unlinked file (no link count), until it is closed.
      MutexLock lock(&mu_);
      if (auto open = open_files_.find(ino); open != open_files_.end()) {
        struct stat removed = open->second.attributes;
        removed.st_nlink = 0;
        return removed;
      }
    }
    if (!st.ok()) return st.status();
    st->st_ino = ino;
    return *st;
  }

  Result<std::string> DoReadlink(fuse_ino_t ino) {
    GPUCKPT_ASSIGN_OR_RETURN(NodeId node, Node(ino));
    return view_.SymlinkTarget(node);
  }

  // A directory's listing is taken at opendir and served from the handle,
  // so offsets stay valid however long the reader takes.
  struct DirHandle {
    std::vector<std::pair<std::string, struct stat>> entries;
    std::optional<OpenCheckpoint> checkpoint;  // a checkpoint's own directory
  };
  Result<std::unique_ptr<DirHandle>> DoOpendir(fuse_ino_t ino, const Caller& caller) EXCLUDES(mu_) {
    GPUCKPT_ASSIGN_OR_RETURN(NodeId node, Node(ino));
    GPUCKPT_ASSIGN_OR_RETURN(auto children, view_.Children(node, caller));
    auto h = std::make_unique<DirHandle>();
    if (node.kind == NodeKind::kSnapshotDir) {
      h->checkpoint = OpenCheckpoint{node.key, caller.pid};
      MutexLock lock(&mu_);
      open_checkpoints_.insert(*h->checkpoint);
    }
    struct stat self {};
    self.st_mode = S_IFDIR;
    self.st_ino = ino;
    h->entries.push_back({".", self});
    h->entries.push_back({"..", self});
    for (auto& [name, id] : children) {
      struct stat st {};
      auto attrs = view_.Attributes(id, caller);
      st.st_mode = attrs.ok() ? attrs->st_mode : S_IFREG;
      // Without a lookup there is no inode number yet; readdir's d_ino is
      // informational, but must not be 0 (some tools skip such entries).
      st.st_ino =
          std::hash<std::string>{}(id.snapshot + "/" + std::to_string(id.key) + "/" + id.path +
                                   "/" + std::to_string(id.pid) + std::to_string(int(id.kind))) |
          1;
      h->entries.push_back({name, st});
    }
    return h;
  }

  void DoReleasedir(std::unique_ptr<DirHandle> h) EXCLUDES(mu_) {
    if (!h->checkpoint) return;
    MutexLock lock(&mu_);
    open_checkpoints_.erase(open_checkpoints_.find(*h->checkpoint));
  }

  struct FileHandle {
    NodeId node;
    std::unique_ptr<FileReader> reader;  // image files
    struct stat attributes {};           // image files, taken at open
    std::string content;                 // generated files, taken at open
    fuse_ino_t ino = 0;                  // image files: counted in open_files_
    int lazy_server_pid = 0;             // image files a lazy restore's server opened
  };
  void DoRelease(std::unique_ptr<FileHandle> h) EXCLUDES(mu_) {
    if (h->ino == 0) return;
    MutexLock lock(&mu_);
    auto open = open_files_.find(h->ino);
    if (open != open_files_.end() && --open->second.handles == 0) open_files_.erase(open);
  }
  static bool OpensForWriting(int flags) {
    return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
  }
  // What an open of `ino` with `flags` is refused with before anything is
  // read (0: none): only control files can be written, anything else is
  // EROFS, the one errno a reader of a read-only tree expects.
  int DoOpenRefusal(fuse_ino_t ino, int flags) {
    auto node = Node(ino);
    if (!node.ok()) return ErrnoFromStatus(node.status());
    return OpensForWriting(flags) && !StoreView::IsControl(node->kind) ? EROFS : 0;
  }
  bool LazyServerBypassesPageCache(int pid) const {
    return engine_ != nullptr && engine_->LazyServerBypassesPageCache(pid);
  }
  JobThreads* read_ahead() const { return read_ahead_; }
  const StreamReadAhead::Options& read_ahead_options() const { return read_ahead_options_; }

  Result<std::unique_ptr<FileHandle>> DoOpen(fuse_ino_t ino, int flags, const Caller& caller)
      EXCLUDES(mu_) {
    GPUCKPT_ASSIGN_OR_RETURN(NodeId node, Node(ino));
    const bool writing = OpensForWriting(flags);
    auto h = std::make_unique<FileHandle>();
    h->node = node;
    if (StoreView::IsSnapshotFile(node.kind)) {
      GPUCKPT_ASSIGN_OR_RETURN(h->attributes, DoGetattr(ino, caller));
      GPUCKPT_ASSIGN_OR_RETURN(h->reader, view_.OpenImage(node));
      h->ino = ino;
      MutexLock lock(&mu_);
      auto [open, added] = open_files_.try_emplace(ino, OpenFile{h->attributes, 0});
      ++open->second.handles;
    } else if (!writing) {
      GPUCKPT_ASSIGN_OR_RETURN(h->content, view_.GeneratedContent(node, caller));
    }
    return h;
  }

  // A write to a control file `node` is one command; it returns when
  // done, or soon after `interrupted` is set (the caller gave up). Run on
  // a command thread (commands()), never on a FUSE thread.
  Status DoWrite(const NodeId& node, std::string line, const Caller& caller_in,
                 std::shared_ptr<const std::atomic<bool>> interrupted) {
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    Caller caller = MakeCaller(caller_in.uid, caller_in.gid, caller_in.pid);
    caller.interrupted = std::move(interrupted);
    Status s = RunCommand(*engine_, node.kind, node.pid, line, caller);
    view_.Invalidate();
    return s;
  }

  // A command refused before it ran, recorded as a failed one is.
  void DoRefuse(const NodeId& node, const Status& refusal, const Caller& caller) {
    RecordRefusedCommand(*engine_, node.kind, node.pid, refusal, caller);
  }

  CommandRunner& commands() { return commands_; }

  // unlink and rmdir: the errno to reply (0: done). A checkpoint goes as a
  // whole, when its directory is removed; nothing else can be.
  int DoRemove(fuse_ino_t parent, const char* name, bool is_dir, const Caller& caller) {
    auto dir = Node(parent);
    if (!dir.ok()) return ErrnoFromStatus(dir.status());
    auto child = view_.Child(*dir, name, caller);
    if (!child.ok()) return ErrnoFromStatus(child.status());
    if (child->kind == NodeKind::kSnapshotDir) {
      if (!is_dir) return EISDIR;
      Status s = view_.RemoveSnapshot(*child, caller);
      return s.ok() ? 0 : ErrnoFromStatus(s);
    }
    // `rm -r checkpoints/<id>` opens the directory, removes what is in it,
    // and stops at the first failure, never reaching the rmdir that removes
    // the checkpoint. So the process that holds the checkpoint's directory
    // open may "remove" its entries, without effect; anyone else (`rm` of
    // one file, `rm -r` of images/) gets EROFS, and so does everything in
    // device/ (`rm -r device/<id>` removes no checkpoint).
    // Unless the checkpoint cannot go now: the rm then stops at its first
    // entry (EBUSY), before the kernel forgets the entries it "removed".
    if (StoreView::InCheckpoint(child->kind) && RemovingCheckpoint(child->key, caller.pid)) {
      Status removable = view_.CheckRemovable(*child);
      return removable.ok() ? 0 : ErrnoFromStatus(removable);
    }
    return RefusalErrno(*child);
  }

  // mkdir, mknod, create, symlink, link and rename: the tree's names are
  // gpuckpt's. The errno to reply for a new name in `parent` (and, for link
  // and rename, a change of `other`).
  int DoRefuseChange(fuse_ino_t parent, const Caller& caller,
                     std::optional<fuse_ino_t> other = std::nullopt) {
    int refusal = EPERM;
    for (std::optional<fuse_ino_t> ino : {std::optional<fuse_ino_t>(parent), other}) {
      if (!ino) continue;
      auto node = Node(*ino);
      if (!node.ok()) return ErrnoFromStatus(node.status());
      // As absent as to a lookup where the caller may not see it.
      auto attrs = view_.Attributes(*node, caller);
      if (!attrs.ok()) return ErrnoFromStatus(attrs.status());
      if (RefusalErrno(*node) == EROFS) refusal = EROFS;
    }
    return refusal;
  }

  // Only truncation of a control file to nothing (`echo x > ctl` opens with
  // O_TRUNC), which changes nothing: the errno to reply (0: `*st` is the
  // node's attributes).
  int DoSetattr(fuse_ino_t ino, const struct stat& attr, int to_set, const Caller& caller,
                struct stat* st) {
    auto node = Node(ino);
    if (!node.ok()) return ErrnoFromStatus(node.status());
    auto attrs = DoGetattr(ino, caller);
    if (!attrs.ok()) return ErrnoFromStatus(attrs.status());
    if (!StoreView::IsControl(node->kind) || to_set != FUSE_SET_ATTR_SIZE || attr.st_size != 0)
      return RefusalErrno(*node);
    *st = *attrs;
    return 0;
  }

  // An image file's bytes, where they lie (decoded chunks, zeros), for a
  // reply that sends them without copying them first; the pieces hold
  // what they point into, so a release of the file meanwhile (another
  // thread, once the kernel has the reply) takes nothing from under them.
  Result<FileReader::ReadPieces> DoReadImage(FileHandle* h, off_t offset, size_t size) {
    if (offset < 0) return Status::InvalidArgument("negative offset");
    return h->reader->Read(static_cast<uint64_t>(offset), size);
  }

  // Only the lazy-pages server that opened `h` may have the daemon copy
  // out of it (OpIoctl refuses other handles).
  static Status CheckServerOf(const FileHandle* h, int caller_pid) {
    if (caller_pid != h->lazy_server_pid)
      return Status::PermissionDenied("only the lazy-pages server that opened the image copies");
    return Status::Ok();
  }

  // A lazy restore's server asking the daemon to copy a range of the page
  // image `h` into its task (fs/lazy_page_copy.h): `request` with its
  // outcome filled in. Only the server that opened `h` (OpIoctl refuses
  // other handles), as `caller_pid`.
  Result<LazyCopyRequest> DoLazyCopy(FileHandle* h, int caller_pid, LazyCopyRequest request) {
    GPUCKPT_RETURN_IF_ERROR(CheckServerOf(h, caller_pid));
    GPUCKPT_RETURN_IF_ERROR(CheckLazyCopyRequest(request));
    GPUCKPT_ASSIGN_OR_RETURN(UniqueFd uffd, TakeServersUserfaultfd(caller_pid, request.uffd));
    GPUCKPT_ASSIGN_OR_RETURN(FileReader::ReadPieces read,
                             h->reader->Read(request.offset, request.len));
    // A background transfer's 4 MiB in parts of 1 MiB side by side, where
    // there are cores for it; a fault's 64 KiB on this thread.
    const LazyCopyOutcome outcome =
        CopyIntoTaskInParts(std::make_shared<const UniqueFd>(std::move(uffd)), request.dst,
                            std::make_shared<const FileReader::ReadPieces>(std::move(read)),
                            request.len, LazyCopyThreadsForThisMachine(), kLazyCopyPartBytes);
    if (outcome.copied > 0 && engine_ != nullptr)
      engine_->NoteLazyPagesCopied(caller_pid, outcome.copied,
                                   (request.flags & kLazyCopyFault) != 0);
    request.copied = outcome.in_place;
    request.error = outcome.error;
    return request;
  }

  // The same for a batch of ranges (the server's background transfer,
  // tools/criu-patches/0009): `batch` with each range's outcome filled in.
  Result<LazyCopyBatch> DoLazyCopyBatch(FileHandle* h, int caller_pid, LazyCopyBatch batch) {
    GPUCKPT_RETURN_IF_ERROR(CheckServerOf(h, caller_pid));
    GPUCKPT_RETURN_IF_ERROR(CheckLazyCopyBatch(batch));
    GPUCKPT_ASSIGN_OR_RETURN(UniqueFd uffd, TakeServersUserfaultfd(caller_pid, batch.uffd));
    const Status copied =
        CopyBatchIntoTask(std::make_shared<const UniqueFd>(std::move(uffd)), h->reader.get(),
                          &batch, LazyBatchThreadsForThisMachine(), LazyBatchCopiers());
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < batch.count; ++i) bytes += batch.ranges[i].copied;
    if (engine_ != nullptr) engine_->NoteLazyPagesCopiedInBatch(caller_pid, bytes);
    GPUCKPT_RETURN_IF_ERROR(copied);
    return batch;
  }

  // A generated file's bytes, copied into this thread's reusable buffer
  // (neither allocated nor zeroed per request; `*data` stays valid until
  // the thread's next read): once the kernel has the reply, the reader may
  // close the file and its release (on another thread) frees the handle
  // and its content while fuse_reply_buf() is still returning.
  Result<size_t> DoRead(FileHandle* h, off_t offset, size_t size, const char** data) {
    if (offset < 0) return Status::InvalidArgument("negative offset");
    thread_local std::unique_ptr<char[]> buffer;
    thread_local size_t capacity = 0;
    if (capacity < size) {
      buffer.reset(new char[size]);
      capacity = size;
    }
    *data = buffer.get();
    const size_t off = static_cast<size_t>(offset);
    if (off >= h->content.size()) return size_t{0};
    const size_t n = std::min(size, h->content.size() - off);
    std::memcpy(buffer.get(), h->content.data() + off, n);
    return n;
  }

  Result<struct statvfs> DoStatfs() {
    struct statvfs st {};
    if (statvfs(store_->dir().c_str(), &st) != 0)
      return StatusFromErrno(errno, "statfs " + store_->dir());
    return st;
  }

  InodeTable& inodes() { return inodes_; }

  // A handle given to the kernel (fi->fh), registered before the reply
  // that gives it, so that a release can never come first; and taken back
  // at its release (or when the reply failed).
  template <typename Handle>
  uint64_t GiveToKernel(std::unique_ptr<Handle> h) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    KernelHandles(h.get()).insert(h.get());
    return reinterpret_cast<uint64_t>(h.release());
  }
  template <typename Handle>
  std::unique_ptr<Handle> TakeFromKernel(uint64_t fh) EXCLUDES(mu_) {
    auto* h = reinterpret_cast<Handle*>(fh);
    MutexLock lock(&mu_);
    KernelHandles(h).erase(h);
    return std::unique_ptr<Handle>(h);
  }

 private:
  Result<NodeId> Node(fuse_ino_t ino) {
    auto node = inodes_.Get(ino);
    if (!node) return Status::NotFound("stale inode " + std::to_string(ino));
    return *node;
  }

  // Whether process `pid` holds the directory of checkpoint `key` open.
  bool RemovingCheckpoint(uint64_t key, int pid) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return open_checkpoints_.count(OpenCheckpoint{key, pid}) != 0;
  }

  Store* store_;
  Engine* engine_;
  JobThreads* const read_ahead_;
  const StreamReadAhead::Options read_ahead_options_;
  StoreView view_;
  InodeTable inodes_;
  // Never held across a call into view_ (the store) or libfuse.
  Mutex mu_;
  // Checkpoint directories open, by checkpoint key and the opener's pid
  // (once per handle); see DoRemove().
  std::multiset<OpenCheckpoint> open_checkpoints_ GUARDED_BY(mu_);
  // Image files open, by inode: their attributes at the first open, for
  // fstat() once their checkpoint is removed (see DoGetattr()).
  struct OpenFile {
    struct stat attributes;
    int handles;
  };
  std::unordered_map<fuse_ino_t, OpenFile> open_files_ GUARDED_BY(mu_);
  // The handles the kernel holds; see GiveToKernel().
  std::set<FileHandle*> kernel_files_ GUARDED_BY(mu_);
  std::set<DirHandle*> kernel_dirs_ GUARDED_BY(mu_);
  std::set<FileHandle*>& KernelHandles(FileHandle*) REQUIRES(mu_) { return kernel_files_; }
  std::set<DirHandle*>& KernelHandles(DirHandle*) REQUIRES(mu_) { return kernel_dirs_; }
  // Last: its destructor waits for the commands, which use everything above.
  CommandRunner commands_;
};

void ReplyError(fuse_req_t req, const Status& s) { fuse_reply_err(req, ErrnoFromStatus(s)); }

// Every callback goes through here: no exception ever crosses into libfuse
// (C code), and errors, an exception's too (kInternal, as a command's),
// reply through the one Status -> errno mapping.
template <typename Fn>
void Guard(fuse_req_t req, Fn&& fn) {
  try {
    fn();
  } catch (...) {
    ReplyError(req, Status::Internal("the request ended with an exception"));
  }
}

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guard(req, [&] {
    auto e = Filesystem::From(req)->DoLookup(parent, name, CallerOf(req));
    if (!e.ok()) return ReplyError(req, e.status());
    fuse_reply_entry(req, &*e);
  });
}

void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Filesystem::From(req)->inodes().Forget(ino, nlookup);
  fuse_reply_none(req);
}

void OpForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  auto& inodes = Filesystem::From(req)->inodes();
  for (size_t i = 0; i < count; ++i) inodes.Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  Guard(req, [&] {
    auto target = Filesystem::From(req)->DoReadlink(ino);
    if (!target.ok()) return ReplyError(req, target.status());
    fuse_reply_readlink(req, target->c_str());
  });
}

void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guard(req, [&] {
    auto h = Filesystem::From(req)->DoOpendir(ino, CallerOf(req));
    if (!h.ok()) return ReplyError(req, h.status());
    Filesystem* fs = Filesystem::From(req);
    fi->fh = fs->GiveToKernel(std::move(*h));
    if (fuse_reply_open(req, fi) != 0)  // the opener is gone
      fs->DoReleasedir(fs->TakeFromKernel<Filesystem::DirHandle>(fi->fh));
  });
}

void OpReaddir(fuse_req_t req, fuse_ino_t, size_t size, off_t offset, fuse_file_info* fi) {
  Guard(req, [&] {
    auto* h = reinterpret_cast<Filesystem::DirHandle*>(fi->fh);
    std::vector<char> buf(size);
    size_t used = 0;
    for (size_t i = static_cast<size_t>(std::max<off_t>(offset, 0)); i < h->entries.size(); ++i) {
      const auto& [name, st] = h->entries[i];
      const size_t n = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st,
                                         static_cast<off_t>(i + 1));
      if (n > size - used) break;
      used += n;
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Filesystem* fs = Filesystem::From(req);
  fs->DoReleasedir(fs->TakeFromKernel<Filesystem::DirHandle>(fi->fh));
  fuse_reply_err(req, 0);
}

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guard(req, [&] {
    if (int refusal = Filesystem::From(req)->DoOpenRefusal(ino, fi->flags); refusal != 0)
      return (void)fuse_reply_err(req, refusal);
    auto h = Filesystem::From(req)->DoOpen(ino, fi->flags, CallerOf(req));
    if (!h.ok()) return ReplyError(req, h.status());
    Filesystem* fs = Filesystem::From(req);
    if ((*h)->reader && fs->LazyServerBypassesPageCache(CallerOf(req).pid)) {
      // A lazy restore's server reads each page once, into its tree: kept
      // in the page cache too, they would take that memory twice (not a
      // GPU tree's: LazyServers::BypassesPageCache()).
      fi->direct_io = 1;
      // It may ask the daemon to copy the pages into its tree itself
      // (fs/lazy_page_copy.h).
      (*h)->lazy_server_pid = CallerOf(req).pid;
      // Nor does the kernel read ahead for it then: the daemon does
      // (fs/stream_read_ahead.h).
      if (JobThreads* threads = fs->read_ahead())
        (*h)->reader = std::make_unique<StreamReadAhead>(std::move((*h)->reader), threads,
                                                         fs->read_ahead_options());
    } else if ((*h)->reader) {
      fi->keep_cache = 1;  // contents never change once published
    } else {
      // Generated and control files change and report size 0: the kernel
      // must pass every read and write to us, not serve them by the size.
      fi->direct_io = 1;
    }
    fi->fh = fs->GiveToKernel(std::move(*h));
    if (fuse_reply_open(req, fi) != 0)  // the opener is gone
      fs->DoRelease(fs->TakeFromKernel<Filesystem::FileHandle>(fi->fh));
  });
}

// Replies with `read`'s pieces as they lie: one copy, into the kernel. A
// read of more pieces than a writev takes (chunks far smaller than a FUSE
// read) is gathered into one buffer first.
void ReplyPieces(fuse_req_t req, const FileReader::ReadPieces& read) {
  constexpr size_t kMaxPieces = 512;  // IOV_MAX is 1024, libfuse adds its header
  if (read.pieces.size() > kMaxPieces) {
    std::string gathered;
    gathered.reserve(read.size());
    for (const FileReader::Piece& p : read.pieces) gathered.append(p.data, p.size);
    fuse_reply_buf(req, gathered.data(), gathered.size());
    return;
  }
  std::vector<iovec> iov;
  iov.reserve(read.pieces.size());
  for (const FileReader::Piece& p : read.pieces)
    iov.push_back(iovec{const_cast<char*>(p.data), p.size});
  if (iov.empty()) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
}

void OpRead(fuse_req_t req, fuse_ino_t, size_t size, off_t offset, fuse_file_info* fi) {
  Guard(req, [&] {
    auto* h = reinterpret_cast<Filesystem::FileHandle*>(fi->fh);
    if (h->reader) {
      auto read = Filesystem::From(req)->DoReadImage(h, offset, size);
      if (!read.ok()) return ReplyError(req, read.status());
      return ReplyPieces(req, *read);
    }
    const char* data = nullptr;
    auto n = Filesystem::From(req)->DoRead(h, offset, size, &data);
    if (!n.ok()) return ReplyError(req, n.status());
    fuse_reply_buf(req, data, *n);
  });
}

void ReplyLazyCopyBatch(fuse_req_t req, Filesystem::FileHandle* h, const void* in_buf,
                        size_t in_size, size_t out_size) {
  if (in_size != sizeof(LazyCopyBatch) || out_size != sizeof(LazyCopyBatch))
    return (void)fuse_reply_err(req, EINVAL);
  LazyCopyBatch batch;
  std::memcpy(&batch, in_buf, sizeof(batch));
  const Caller caller = CallerOf(req);
  auto done = Filesystem::From(req)->DoLazyCopyBatch(h, caller.pid, batch);
  if (!done.ok()) {
    spdlog::warn("lazy copy of a batch pid={} ranges={}: {}", caller.pid, batch.count,
                 done.status().ToString());
    return ReplyError(req, done.status());
  }
  fuse_reply_ioctl(req, 0, &*done, sizeof(*done));
}

// Only kLazyCopyIoctl and kLazyCopyBatchIoctl, on an image a lazy restore's server opened: every
// other ioctl is ENOTTY, what a file that takes none answers. A directory's
// (FUSE_IOCTL_DIR) comes with a DirHandle, never looked at here.
void OpIoctl(fuse_req_t req, fuse_ino_t, unsigned int cmd, void*, fuse_file_info* fi,
             unsigned flags, const void* in_buf, size_t in_size, size_t out_size) {
  Guard(req, [&] {
    if ((cmd != kLazyCopyIoctl && cmd != kLazyCopyBatchIoctl) ||
        (flags & (FUSE_IOCTL_COMPAT | FUSE_IOCTL_DIR)) != 0)
      return (void)fuse_reply_err(req, ENOTTY);
    auto* h = reinterpret_cast<Filesystem::FileHandle*>(fi->fh);
    if (!h->reader || h->lazy_server_pid == 0) return (void)fuse_reply_err(req, ENOTTY);
    if (cmd == kLazyCopyBatchIoctl) return ReplyLazyCopyBatch(req, h, in_buf, in_size, out_size);
    if (in_size != sizeof(LazyCopyRequest) || out_size != sizeof(LazyCopyRequest))
      return (void)fuse_reply_err(req, EINVAL);
    LazyCopyRequest request;
    std::memcpy(&request, in_buf, sizeof(request));
    const Caller caller = CallerOf(req);
    auto done = Filesystem::From(req)->DoLazyCopy(h, caller.pid, request);
    if (!done.ok()) {
      spdlog::warn("lazy copy pid={} dst={:#x} len={}: {}", caller.pid, request.dst, request.len,
                   done.status().ToString());
      return ReplyError(req, done.status());
    }
    fuse_reply_ioctl(req, 0, &*done, sizeof(*done));
  });
}

void SetInterrupted(fuse_req_t, void* flag) {
  static_cast<std::atomic<bool>*>(flag)->store(true, std::memory_order_relaxed);
}

// The command runs on a thread of its own, which replies; the FUSE thread
// returns at once (a command may take minutes).
void OpWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t, fuse_file_info* fi) {
  Guard(req, [&] {
    Filesystem* fs = Filesystem::From(req);
    const NodeId node = reinterpret_cast<Filesystem::FileHandle*>(fi->fh)->node;
    const Caller caller = CallerOf(req);
    // A signal to the writer (Ctrl-C) makes the kernel send an INTERRUPT
    // for this request, and the writer waits for our reply however long
    // the command takes: the command then gives up. So does every command
    // when the daemon stops (CommandRunner::CancelAll()).
    auto interrupted = std::make_shared<std::atomic<bool>>(false);
    fuse_req_interrupt_func(req, SetInterrupted, interrupted.get());
    auto command = [fs, req, node, caller, interrupted, line = std::string(buf, size)] {
      Status s;
      try {
        s = fs->DoWrite(node, line, caller, interrupted);
      } catch (...) {
        s = Status::Internal("the command ended with an exception");
      }
      // No call after this: the flag goes with this command.
      fuse_req_interrupt_func(req, nullptr, nullptr);
      if (!s.ok()) return ReplyError(req, s);
      fuse_reply_write(req, line.size());
    };
    Status started = fs->commands().Start(caller.uid, interrupted, std::move(command));
    if (!started.ok()) {
      fuse_req_interrupt_func(req, nullptr, nullptr);
      fs->DoRefuse(node, started, caller);
      ReplyError(req, started);
    }
  });
}

// The kernel refreshes a file's attributes before it reads it (its page
// cache may be stale) and says through which open file: an image file's
// are those it had at open, still true of a removed checkpoint's, which
// its open files go on reading. Anything else (stat, a path) is asked
// about the node, and a removed checkpoint's are ENOENT.
void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guard(req, [&] {
    auto* h = fi != nullptr ? reinterpret_cast<Filesystem::FileHandle*>(fi->fh) : nullptr;
    if (h != nullptr && h->reader) return (void)fuse_reply_attr(req, &h->attributes, kCacheSeconds);
    auto st = Filesystem::From(req)->DoGetattr(ino, CallerOf(req));
    if (!st.ok()) return ReplyError(req, st.status());
    fuse_reply_attr(req, &*st, kCacheSeconds);
  });
}

// chmod, chown, truncate, utimens (touch).
void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  Guard(req, [&] {
    struct stat st {};
    const int err = Filesystem::From(req)->DoSetattr(ino, *attr, to_set, CallerOf(req), &st);
    if (err != 0) return (void)fuse_reply_err(req, err);
    fuse_reply_attr(req, &st, 0);
  });
}

void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guard(req, [&] {
    fuse_reply_err(req, Filesystem::From(req)->DoRemove(parent, name, false, CallerOf(req)));
  });
}

void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guard(req, [&] {
    fuse_reply_err(req, Filesystem::From(req)->DoRemove(parent, name, true, CallerOf(req)));
  });
}

// Nothing can be created, linked or renamed: these only say why not (the
// kernel would otherwise answer ENOSYS, "Function not implemented").
void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char*, mode_t) {
  Guard(req,
        [&] { fuse_reply_err(req, Filesystem::From(req)->DoRefuseChange(parent, CallerOf(req))); });
}

void OpMknod(fuse_req_t req, fuse_ino_t parent, const char*, mode_t, dev_t) {
  Guard(req,
        [&] { fuse_reply_err(req, Filesystem::From(req)->DoRefuseChange(parent, CallerOf(req))); });
}

void OpCreate(fuse_req_t req, fuse_ino_t parent, const char*, mode_t, fuse_file_info*) {
  Guard(req,
        [&] { fuse_reply_err(req, Filesystem::From(req)->DoRefuseChange(parent, CallerOf(req))); });
}

void OpSymlink(fuse_req_t req, const char*, fuse_ino_t parent, const char*) {
  Guard(req,
        [&] { fuse_reply_err(req, Filesystem::From(req)->DoRefuseChange(parent, CallerOf(req))); });
}

void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char*) {
  Guard(req, [&] {
    fuse_reply_err(req, Filesystem::From(req)->DoRefuseChange(newparent, CallerOf(req), ino));
  });
}

void OpRename(fuse_req_t req, fuse_ino_t parent, const char*, fuse_ino_t newparent, const char*,
              unsigned int) {
  Guard(req, [&] {
    fuse_reply_err(req, Filesystem::From(req)->DoRefuseChange(newparent, CallerOf(req), parent));
  });
}

void OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Filesystem* fs = Filesystem::From(req);
  fs->DoRelease(fs->TakeFromKernel<Filesystem::FileHandle>(fi->fh));
  fuse_reply_err(req, 0);
}

void OpStatfs(fuse_req_t req, fuse_ino_t) {
  Guard(req, [&] {
    auto st = Filesystem::From(req)->DoStatfs();
    if (!st.ok()) return ReplyError(req, st.status());
    fuse_reply_statfs(req, &*st);
  });
}

constexpr unsigned kReadAheadBytes = 8u << 20;

void OpInit(void*, fuse_conn_info* conn) {
  // Sequential readers (cat, cp, CRIU's restore) get the kernel's
  // read-ahead in large requests, served by several FUSE threads at once:
  // that is what keeps a cold store's disk and our workers busy.
  conn->max_readahead = kReadAheadBytes;
  conn->max_read = 0;  // no limit beyond the kernel's
  // Requests of up to 1 MiB (the kernel's max_pages follows max_write): a
  // quarter of the requests, and of the per-request index seeks, of 256 KiB.
  conn->max_write = 1u << 20;
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OpInit;
  ops.lookup = OpLookup;
  ops.forget = OpForget;
  ops.forget_multi = OpForgetMulti;
  ops.getattr = OpGetattr;
  ops.readlink = OpReadlink;
  ops.opendir = OpOpendir;
  ops.readdir = OpReaddir;
  ops.releasedir = OpReleasedir;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.ioctl = OpIoctl;
  ops.release = OpRelease;
  ops.write = OpWrite;
  ops.setattr = OpSetattr;
  ops.unlink = OpUnlink;
  ops.rmdir = OpRmdir;
  ops.mkdir = OpMkdir;
  ops.mknod = OpMknod;
  ops.create = OpCreate;
  ops.symlink = OpSymlink;
  ops.link = OpLink;
  ops.rename = OpRename;
  ops.statfs = OpStatfs;
  return ops;
}

}  // namespace

Status CheckNothingMountedAt(const std::string& resolved_mountpoint) {
  GPUCKPT_ASSIGN_OR_RETURN(auto mounts, ReadMountTable());
  for (const auto& m : mounts) {
    if (m.mountpoint != resolved_mountpoint) continue;
    return Status::Busy(resolved_mountpoint + " is already a mount point (" + m.type + " " +
                        m.source + "); unmount it first, or mount elsewhere");
  }
  return Status::Ok();
}

namespace {

// `value` as one value of a FUSE -o list: libfuse splits the list at
// commas and takes a backslash as an escape.
std::string FuseOptionValue(const std::string& value) {
  std::string escaped;
  for (char c : value) {
    if (c == ',' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return escaped;
}

std::vector<std::string> FuseArguments(const MountOptions& options) {
  // The kernel shows the type as "fuse." and the subtype.
  const std::string subtype = std::string(kGpuckptMountType).substr(std::strlen("fuse."));
  std::vector<std::string> arg_strings = {
      "gpuckptfs", "-o",
      "default_permissions,subtype=" + subtype + ",fsname=" + FuseOptionValue(options.source)};
  if (options.allow_other) arg_strings.back() += ",allow_other";
  if (options.debug) arg_strings.push_back("-d");
  return arg_strings;
}

// 8 MiB of read-ahead on the mount at `resolved_mountpoint`, so that a
// cold sequential reader has eight 1 MiB requests in flight instead of one
// of 128 KiB; `resolved` is why the mount point could not be resolved, if
// it could not. A mount without it still works: warned about, not fatal.
void RaiseReadAheadOrWarn(const Status& resolved, const char* resolved_mountpoint) {
  Status ra = resolved.ok()
                  ? SetMountReadAhead(resolved_mountpoint, kGpuckptMountType, kReadAheadBytes >> 10)
                  : resolved;
  if (!ra.ok()) {
    std::fprintf(stderr,
                 "gpuckptfs: warning: cold sequential reads keep the kernel's 128 KiB "
                 "read-ahead: %s\n",
                 ra.ToString().c_str());
  }
}

// How long a stop waits for lazily restored trees to be resident: within
// the service's TimeoutStopSec (contrib/gpuckptfs.service.in).
constexpr std::chrono::seconds kLazyStopWait{600};

// Serves the mounted session until it is unmounted or signalled.
Status RunSessionLoop(fuse_session* se) {
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(config, 0);
  fuse_loop_cfg_set_max_threads(config, 16);
  const int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  if (rc < 0) return Status::IOError(std::string("FUSE session ended with ") + std::strerror(-rc));
  return Status::Ok();
}

}  // namespace

Status ServeFilesystem(Store* store, Engine* engine, const MountOptions& options,
                       const std::function<void()>& on_mounted) {
  // Threads of their own, where asked for: made once and never stopped,
  // as LazyReadAheadThreads()'s (a queued read-ahead holds what it reads).
  // Threads asked for by count read ahead of the stream too, on any machine.
  JobThreads* read_ahead = nullptr;
  StreamReadAhead::Options read_ahead_options;
  if (options.lazy_read_ahead_threads < 0) {
    read_ahead = LazyReadAheadThreads();
    read_ahead_options = LazyReadAheadOptionsForThisMachine();
  } else if (options.lazy_read_ahead_threads > 0) {
    read_ahead = new JobThreads(static_cast<size_t>(options.lazy_read_ahead_threads));
  }
  Filesystem fs(store, engine, read_ahead, read_ahead_options);
  static const fuse_lowlevel_ops ops = MakeOps();

  std::vector<std::string> arg_strings = FuseArguments(options);
  std::vector<char*> argv;
  for (auto& a : arg_strings) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  // fuse_session_new replaces `args` by a copy it allocates: freed on the
  // way out, or a daemon that exits (on SIGTERM, unmounted) leaks it.
  struct ArgsCleanup {
    fuse_args* args;
    ~ArgsCleanup() { fuse_opt_free_args(args); }
  } args_cleanup{&args};

  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), &fs);
  if (se == nullptr) return Status::Unavailable("could not create the FUSE session");
  struct SessionCleanup {
    fuse_session* se;
    bool mounted = false;
    bool handlers = false;
    ~SessionCleanup() {
      if (handlers) fuse_remove_signal_handlers(se);
      if (mounted) fuse_session_unmount(se);
      fuse_session_destroy(se);
    }
  } cleanup{se};

  // Resolved before mounting: afterwards the path's last component is the
  // mount's root, which must not be asked anything before we serve it.
  char resolved_mountpoint[PATH_MAX];
  const bool resolved = realpath(options.mountpoint.c_str(), resolved_mountpoint) != nullptr;
  const int resolve_errno = resolved ? 0 : errno;
  if (resolved) GPUCKPT_RETURN_IF_ERROR(CheckNothingMountedAt(resolved_mountpoint));
  if (fuse_set_signal_handlers(se) != 0)
    return Status::Internal("could not install signal handlers");
  cleanup.handlers = true;
  if (fuse_session_mount(se, options.mountpoint.c_str()) != 0) {
    return Status::Unavailable("could not mount on " + options.mountpoint +
                               " (does it exist, and is /dev/fuse usable?)");
  }
  cleanup.mounted = true;
  // Before the kernel's INIT, which keeps the smaller of this and
  // max_readahead.
  RaiseReadAheadOrWarn(
      resolved ? Status::Ok() : StatusFromErrno(resolve_errno, "resolving " + options.mountpoint),
      resolved_mountpoint);
  // Before the session goes (cleanup): the commands still running reply
  // through it. They are asked to give up, as on their writers' Ctrl-C.
  ScopeExit finish_commands([&fs] {
    fs.commands().CancelAll();
    fs.commands().WaitForAll();
  });
  // A stop signal first waits, while the mount serves, for the lazily
  // restored trees whose memory still comes through it. Gone as soon as
  // the loop has returned (before the commands are waited for).
  std::unique_ptr<GracefulStop> graceful_stop;
  if (engine != nullptr) {
    GPUCKPT_ASSIGN_OR_RETURN(graceful_stop, GracefulStop::Install(engine, kLazyStopWait));
  }
  if (on_mounted) on_mounted();
  return RunSessionLoop(se);
}

}  // namespace gpuckpt
