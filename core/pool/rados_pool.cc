#include "core/pool/rados_pool.h"

#include <rados/librados.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <functional>

// What Ceph 16.2 does, found against a real cluster (tests/unit/rados_pool_test.cc
// checks each of these):
//
// - A pool over its quota (or on a full OSD): librados holds back a write
//   until the pool has room again, so that it would fail only once
//   op_timeout has passed, as ETIMEDOUT. Writes here carry
//   LIBRADOS_OPERATION_FULL_TRY instead, and the OSD refuses at once, with
//   EDQUOT for a quota and ENOSPC for a full OSD, those that would make the
//   pool larger (more bytes or another object); a write that does not grow
//   it, and a delete, go through, so that a full pool can be emptied. The
//   pool is marked full a few seconds after it has reached its quota, once
//   its usage has reached the monitor. The lock calls take no flags: on a
//   full pool they wait, up to op_timeout.
// - omap_cmp compares a key the map does not hold as if it held the empty
//   value: with `expected` "x" it fails (ECANCELED, from the operation and
//   in the compare's own result), with "" it succeeds. On an object that
//   does not exist the operation fails with ENOENT. A failed compare leaves
//   the rest of the operation unapplied. The *IfEqual calls therefore
//   compare with omap_cmp only a non-empty `expected`; for "" they read the
//   key and apply the change at the object version read
//   (rados_write_op_assert_version: ERANGE or EOVERFLOW when it moved on).
// - Taking a lock again with the same cookie fails with EEXIST unless
//   LIBRADOS_LOCK_FLAG_MAY_RENEW is given, which takes the lock or renews
//   its lease (MUST_RENEW, also there, fails with ENOENT for a lock not
//   held: not what LockExclusive promises). Another cookie's, or another
//   client's, attempt fails with EBUSY until the holder's lease runs out;
//   unlocking a lock that this cookie of this client does not hold fails
//   with ENOENT.
// - Keys are passed with their lengths everywhere but in omap_get_vals2's
//   start_after, a C string: OmapList works around it (see there).

namespace gpuckpt {
namespace {

// The longest single librados read: its result is an int.
constexpr uint64_t kMaxReadPiece = 64ull << 20;

// ECANCELED is what a failed omap_cmp returns; StatusFromErrno knows
// nothing of compares.
Status PoolError(int ret, const std::string& pool, std::string_view operation,
                 std::string_view oid) {
  std::string context = "pool " + pool + ": " + std::string(operation);
  if (!oid.empty()) context += " " + std::string(oid);
  const int err = -ret;
  if (err == ECANCELED) return Status::Aborted(context + ": " + std::strerror(err));
  return StatusFromErrno(err, context);
}

// librados's timeouts are whole seconds; a fraction rounds up so that an
// operation is never given less than asked for.
std::string TimeoutSeconds(std::chrono::milliseconds timeout) {
  const auto ms = std::max<int64_t>(timeout.count(), 1);
  return std::to_string((ms + 999) / 1000);
}

// Owns a rados_write_op_t.
struct WriteOp {
  rados_write_op_t op = rados_create_write_op();
  WriteOp() = default;
  WriteOp(const WriteOp&) = delete;
  WriteOp& operator=(const WriteOp&) = delete;
  ~WriteOp() { rados_release_write_op(op); }
};

// Owns a rados_read_op_t.
struct ReadOp {
  rados_read_op_t op = rados_create_read_op();
  ReadOp() = default;
  ReadOp(const ReadOp&) = delete;
  ReadOp& operator=(const ReadOp&) = delete;
  ~ReadOp() { rados_release_read_op(op); }
};

// Owns a rados_omap_iter_t once an operation has filled it.
struct OmapIter {
  rados_omap_iter_t iter = nullptr;
  OmapIter() = default;
  OmapIter(const OmapIter&) = delete;
  OmapIter& operator=(const OmapIter&) = delete;
  ~OmapIter() {
    if (iter != nullptr) rados_omap_get_end(iter);
  }
};

using OmapEntries = std::vector<std::pair<std::string, std::string>>;

int DrainOmapIter(rados_omap_iter_t iter, OmapEntries* out) {
  for (;;) {
    char* key = nullptr;
    char* value = nullptr;
    size_t key_len = 0;
    size_t value_len = 0;
    const int ret = rados_omap_get_next2(iter, &key, &value, &key_len, &value_len);
    if (ret < 0) return ret;
    if (key == nullptr) return 0;
    out->emplace_back(std::string(key, key_len), std::string(value, value_len));
  }
}

// Pointer and length arrays of a list of byte strings, for the *2 calls.
struct KeyArrays {
  std::vector<const char*> data;
  std::vector<size_t> lengths;
  explicit KeyArrays(const std::vector<std::string>& keys) {
    for (const std::string& key : keys) {
      data.push_back(key.data());
      lengths.push_back(key.size());
    }
  }
};

}  // namespace

struct RadosPool::Handles {
  rados_t cluster = nullptr;
  rados_ioctx_t io = nullptr;
  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles() {
    if (io != nullptr) {
      rados_aio_flush(io);
      rados_ioctx_destroy(io);
    }
    if (cluster != nullptr) rados_shutdown(cluster);
  }
};

namespace {

// Reads the configuration and sets what gpuckpt needs on top of it: every
// wait bounded by op_timeout, and librados silent on our stderr (its log
// goes where the configuration says).
int ConfigureCluster(rados_t cluster, const PoolConnection& connection) {
  int ret = rados_conf_read_file(
      cluster, connection.conf_file.empty() ? nullptr : connection.conf_file.c_str());
  if (ret < 0) return ret;
  const std::string seconds = TimeoutSeconds(connection.op_timeout);
  const std::pair<const char*, const char*> settings[] = {
      {"rados_osd_op_timeout", seconds.c_str()},
      {"rados_mon_op_timeout", seconds.c_str()},
      {"client_mount_timeout", seconds.c_str()},
      {"log_to_stderr", "false"},
      {"err_to_stderr", "false"},
  };
  for (const auto& [name, value] : settings) {
    ret = rados_conf_set(cluster, name, value);
    if (ret < 0) return ret;
  }
  return 0;
}

}  // namespace

Result<std::unique_ptr<RadosPool>> RadosPool::Connect(const PoolConnection& connection) {
  auto handles = std::make_unique<Handles>();
  const std::string& pool = connection.pool;
  const std::string user =
      "client." + (connection.client_id.empty() ? std::string("admin") : connection.client_id);
  int ret = rados_create2(&handles->cluster, "ceph", user.c_str(), 0);
  if (ret < 0) {
    handles->cluster = nullptr;
    return PoolError(ret, pool, "create a cluster handle for", user);
  }
  ret = ConfigureCluster(handles->cluster, connection);
  if (ret < 0) {
    const std::string conf =
        connection.conf_file.empty() ? std::string("the default ceph.conf") : connection.conf_file;
    return PoolError(ret, pool, "read the configuration", conf);
  }
  ret = rados_connect(handles->cluster);
  if (ret < 0) return PoolError(ret, pool, "connect to the cluster as", user);
  ret = rados_ioctx_create(handles->cluster, pool.c_str(), &handles->io);
  if (ret == -ENOENT) {
    handles->io = nullptr;
    return Status::NotFound("pool " + pool + " does not exist");
  }
  if (ret < 0) {
    handles->io = nullptr;
    return PoolError(ret, pool, "open", "");
  }
  return std::unique_ptr<RadosPool>(new RadosPool(pool, std::move(handles)));
}

RadosPool::RadosPool(std::string pool, std::unique_ptr<Handles> handles)
    : pool_(std::move(pool)), handles_(std::move(handles)) {}

RadosPool::~RadosPool() = default;

// --- whole objects ---

namespace {

// Every write goes out with FULL_TRY: a full pool is an error at once, not
// a wait (see the top of this file).
int OperateWrite(const WriteOp& write, rados_ioctx_t io, const std::string& oid) {
  return rados_write_op_operate2(write.op, io, oid.c_str(), nullptr, LIBRADOS_OPERATION_FULL_TRY);
}

}  // namespace

Status RadosPool::WriteFull(const std::string& oid, std::string_view data) {
  WriteOp write;
  rados_write_op_write_full(write.op, data.data(), data.size());
  const int ret = OperateWrite(write, handles_->io, oid);
  if (ret < 0) return PoolError(ret, pool_, "write", oid);
  return Status::Ok();
}

Status RadosPool::CreateExclusive(const std::string& oid, std::string_view data) {
  WriteOp write;
  rados_write_op_create(write.op, LIBRADOS_CREATE_EXCLUSIVE, nullptr);
  rados_write_op_write_full(write.op, data.data(), data.size());
  const int ret = OperateWrite(write, handles_->io, oid);
  if (ret < 0) return PoolError(ret, pool_, "create", oid);
  return Status::Ok();
}

Result<std::string> RadosPool::Read(const std::string& oid, uint64_t offset, uint64_t length) {
  // Grows piece by piece, so that a length far beyond the object's end
  // does not allocate it.
  std::string out;
  while (out.size() < length) {
    const uint64_t want = std::min(length - out.size(), kMaxReadPiece);
    const size_t done = out.size();
    out.resize(done + want);
    const int ret = rados_read(handles_->io, oid.c_str(), out.data() + done, want, offset + done);
    if (ret < 0) return PoolError(ret, pool_, "read", oid);
    out.resize(done + static_cast<size_t>(ret));
    if (static_cast<uint64_t>(ret) < want) break;  // the end of the object
  }
  return out;
}

Result<std::string> RadosPool::ReadWhole(const std::string& oid, uint64_t max_bytes) {
  GPUCKPT_ASSIGN_OR_RETURN(std::optional<ObjectStat> stat, Stat(oid));
  if (!stat) return PoolError(-ENOENT, pool_, "read", oid);
  if (stat->size > max_bytes) {
    return Status::InvalidArgument("pool " + pool_ + ": read " + oid + ": it holds " +
                                   std::to_string(stat->size) + " bytes, more than the " +
                                   std::to_string(max_bytes) + " expected");
  }
  // A writer may have changed it since: what is read is capped all the same.
  return Read(oid, 0, stat->size);
}

Result<std::optional<RadosPool::ObjectStat>> RadosPool::Stat(const std::string& oid) {
  uint64_t size = 0;
  time_t mtime = 0;
  const int ret = rados_stat(handles_->io, oid.c_str(), &size, &mtime);
  if (ret == -ENOENT) return std::optional<ObjectStat>();
  if (ret < 0) return PoolError(ret, pool_, "stat", oid);
  return std::optional<ObjectStat>(ObjectStat{size, static_cast<int64_t>(mtime)});
}

Status RadosPool::Remove(const std::string& oid) {
  // A write operation rather than rados_remove, for FULL_TRY: deleting is
  // how a full pool gets room again.
  WriteOp write;
  rados_write_op_remove(write.op);
  const int ret = OperateWrite(write, handles_->io, oid);
  if (ret < 0) return PoolError(ret, pool_, "remove", oid);
  return Status::Ok();
}

Result<std::vector<std::string>> RadosPool::ListObjects(std::string_view prefix) {
  rados_list_ctx_t list = nullptr;
  int ret = rados_nobjects_list_open(handles_->io, &list);
  if (ret < 0) return PoolError(ret, pool_, "list objects", "");
  std::vector<std::string> names;
  for (;;) {
    const char* entry = nullptr;
    size_t entry_len = 0;
    ret = rados_nobjects_list_next2(list, &entry, nullptr, nullptr, &entry_len, nullptr, nullptr);
    if (ret < 0) break;
    std::string_view name(entry, entry_len);
    if (name.starts_with(prefix)) names.emplace_back(name);
  }
  rados_nobjects_list_close(list);
  if (ret != -ENOENT) return PoolError(ret, pool_, "list objects", "");  // ENOENT: the end
  return names;
}

// --- many operations in flight ---

struct RadosPool::Batch::State {
  // One operation issued: what it needs until it completes.
  struct Op {
    rados_completion_t completion = nullptr;
    std::unique_ptr<WriteOp> write;  // writes only
    std::string oid;
    std::string data;            // what a write sends
    std::string* out = nullptr;  // where a read lands
  };

  const std::string& pool;
  rados_ioctx_t io;
  size_t max_in_flight;
  std::deque<std::unique_ptr<Op>> in_flight;  // oldest first
  Status first_error;

  State(const std::string& pool_name, rados_ioctx_t ioctx, unsigned max)
      : pool(pool_name), io(ioctx), max_in_flight(std::max(1u, max)) {}

  void NoteError(Status status) {
    if (first_error.ok()) first_error = std::move(status);
  }

  // Waits for the oldest operation and takes in its result. Oldest first
  // keeps it simple; operations of one batch are alike, so they finish in
  // about the order they were issued.
  void CompleteOldest() {
    std::unique_ptr<Op> op = std::move(in_flight.front());
    in_flight.pop_front();
    rados_aio_wait_for_complete(op->completion);
    const int ret = rados_aio_get_return_value(op->completion);
    rados_aio_release(op->completion);
    const bool is_read = op->out != nullptr;
    if (ret < 0) {
      NoteError(PoolError(ret, pool, is_read ? "read" : "write", op->oid));
      if (is_read) op->out->clear();
      return;
    }
    if (is_read) op->out->resize(static_cast<size_t>(ret));  // fewer at the object's end
  }

  void MakeRoom() {
    while (in_flight.size() >= max_in_flight) CompleteOldest();
  }

  // Keeps `op` until it completes, or takes in its failure to start.
  void Issued(std::unique_ptr<Op> op, int ret) {
    if (ret < 0) {
      rados_aio_release(op->completion);
      NoteError(PoolError(ret, pool, op->out != nullptr ? "read" : "write", op->oid));
      return;
    }
    in_flight.push_back(std::move(op));
  }

  std::unique_ptr<Op> NewOp(std::string oid) {
    auto op = std::make_unique<Op>();
    op->oid = std::move(oid);
    rados_aio_create_completion2(nullptr, nullptr, &op->completion);
    return op;
  }
};

RadosPool::Batch::Batch(std::unique_ptr<State> state) : state_(std::move(state)) {}

RadosPool::Batch::~Batch() { Wait().PermitUnchecked(); }

void RadosPool::Batch::WriteFull(std::string oid, std::string data) {
  state_->MakeRoom();
  std::unique_ptr<State::Op> op = state_->NewOp(std::move(oid));
  op->data = std::move(data);
  op->write = std::make_unique<WriteOp>();
  rados_write_op_write_full(op->write->op, op->data.data(), op->data.size());
  // FULL_TRY as for WriteFull: a full pool fails the write at once.
  const int ret = rados_aio_write_op_operate(op->write->op, state_->io, op->completion,
                                             op->oid.c_str(), nullptr, LIBRADOS_OPERATION_FULL_TRY);
  state_->Issued(std::move(op), ret);
}

void RadosPool::Batch::Read(std::string oid, uint64_t offset, uint64_t length, std::string* out) {
  out->clear();
  if (length > INT_MAX) {  // librados returns the count read as an int
    state_->NoteError(Status::InvalidArgument("pool " + state_->pool + ": read " + oid + ": " +
                                              std::to_string(length) +
                                              " bytes at once are too many for one read"));
    return;
  }
  state_->MakeRoom();
  std::unique_ptr<State::Op> op = state_->NewOp(std::move(oid));
  op->out = out;
  out->resize(length);
  const int ret =
      rados_aio_read(state_->io, op->oid.c_str(), op->completion, out->data(), length, offset);
  state_->Issued(std::move(op), ret);
}

Status RadosPool::Batch::Wait() {
  while (!state_->in_flight.empty()) state_->CompleteOldest();
  Status status = std::move(state_->first_error);
  state_->first_error = Status::Ok();
  return status;
}

std::unique_ptr<RadosPool::Batch> RadosPool::NewBatch(unsigned max_in_flight) {
  return std::unique_ptr<Batch>(
      new Batch(std::make_unique<Batch::State>(pool_, handles_->io, max_in_flight)));
}

// --- object maps ---

Result<OmapEntries> RadosPool::OmapGet(const std::string& oid,
                                       const std::vector<std::string>& keys) {
  OmapEntries entries;
  if (keys.empty()) return entries;
  KeyArrays arrays(keys);
  ReadOp read;
  OmapIter iter;
  int prval = 0;
  rados_read_op_omap_get_vals_by_keys2(read.op, arrays.data.data(), keys.size(),
                                       arrays.lengths.data(), &iter.iter, &prval);
  const int ret = rados_read_op_operate(read.op, handles_->io, oid.c_str(), 0);
  if (ret == -ENOENT) return entries;  // no object: no keys
  if (ret < 0) return PoolError(ret, pool_, "get omap keys of", oid);
  if (prval < 0) return PoolError(prval, pool_, "get omap keys of", oid);
  const int drained = DrainOmapIter(iter.iter, &entries);
  if (drained < 0) return PoolError(drained, pool_, "get omap keys of", oid);
  return entries;
}

namespace {

struct OmapPage {
  OmapEntries entries;
  bool more = false;
};

// One omap_get_vals2 call: up to `max` entries after `start_after`, which
// librados takes as a C string.
Result<OmapPage> ReadOmapPage(rados_ioctx_t io, const std::string& pool, const std::string& oid,
                              const std::string& start_after, uint64_t max) {
  OmapPage page;
  ReadOp read;
  OmapIter iter;
  unsigned char more = 0;
  int prval = 0;
  rados_read_op_omap_get_vals2(read.op, start_after.c_str(), "", max, &iter.iter, &more, &prval);
  const int ret = rados_read_op_operate(read.op, io, oid.c_str(), 0);
  if (ret == -ENOENT) return page;  // no object: an empty map
  if (ret < 0) return PoolError(ret, pool, "list omap of", oid);
  if (prval < 0) return PoolError(prval, pool, "list omap of", oid);
  const int drained = DrainOmapIter(iter.iter, &page.entries);
  if (drained < 0) return PoolError(drained, pool, "list omap of", oid);
  page.more = more != 0;
  return page;
}

}  // namespace

Result<OmapEntries> RadosPool::OmapList(const std::string& oid, const std::string& start_after,
                                        unsigned max) {
  if (max == 0) return OmapEntries();
  const size_t nul = start_after.find('\0');
  if (nul == std::string::npos) {
    GPUCKPT_ASSIGN_OR_RETURN(OmapPage page,
                             ReadOmapPage(handles_->io, pool_, oid, start_after, max));
    return std::move(page.entries);
  }
  // librados would cut start_after at its NUL byte. Listing from that cut
  // instead returns the keys between the cut and start_after too: they are
  // dropped, and asked for again as many more as were dropped, until `max`
  // are left or the map ends.
  const std::string cut = start_after.substr(0, nul);
  uint64_t ask = max;
  size_t last_count = 0;
  for (;;) {
    GPUCKPT_ASSIGN_OR_RETURN(OmapPage page, ReadOmapPage(handles_->io, pool_, oid, cut, ask));
    const size_t count = page.entries.size();
    std::erase_if(page.entries, [&](const auto& entry) { return entry.first <= start_after; });
    if (page.entries.size() >= max || !page.more) {
      page.entries.resize(std::min<size_t>(page.entries.size(), max));
      return std::move(page.entries);
    }
    if (count <= last_count) {
      // The OSD caps a page (osd_max_omap_entries_per_request): more keys
      // between the cut and start_after than that cannot be skipped.
      return Status::Unavailable("pool " + pool_ + ": list omap of " + oid +
                                 ": too many keys share start_after's bytes before its NUL");
    }
    last_count = count;
    ask = max + (count - page.entries.size());
  }
}

Status RadosPool::OmapSet(const std::string& oid, const OmapEntries& entries) {
  std::vector<const char*> keys, values;
  std::vector<size_t> key_lens, value_lens;
  for (const auto& [key, value] : entries) {
    keys.push_back(key.data());
    key_lens.push_back(key.size());
    values.push_back(value.data());
    value_lens.push_back(value.size());
  }
  WriteOp write;
  rados_write_op_omap_set2(write.op, keys.data(), values.data(), key_lens.data(), value_lens.data(),
                           entries.size());
  const int ret = OperateWrite(write, handles_->io, oid);
  if (ret < 0) return PoolError(ret, pool_, "set omap keys of", oid);
  return Status::Ok();
}

Status RadosPool::OmapRemove(const std::string& oid, const std::vector<std::string>& keys) {
  KeyArrays arrays(keys);
  WriteOp write;
  // Without it, removing keys of an absent object would create it.
  rados_write_op_assert_exists(write.op);
  rados_write_op_omap_rm_keys2(write.op, arrays.data.data(), arrays.lengths.data(), keys.size());
  const int ret = OperateWrite(write, handles_->io, oid);
  if (ret < 0) return PoolError(ret, pool_, "remove omap keys of", oid);
  return Status::Ok();
}

namespace {

// Adds the change an *IfEqual makes to a write operation.
using AddChange = std::function<void(rados_write_op_t)>;

constexpr char kNoSuchObject[] = ": no such object";

Status IfEqualAborted(const std::string& pool, std::string_view operation, const std::string& oid,
                      std::string_view why) {
  return Status::Aborted("pool " + pool + ": " + std::string(operation) + " " + oid +
                         std::string(why));
}

// The change, prefixed in the same operation by omap_cmp of `key` with a
// non-empty `expected`: a different value and a missing key both fail it.
Status ChangeIfEqualByCompare(rados_ioctx_t io, const std::string& pool, std::string_view operation,
                              const std::string& oid, const std::string& key,
                              const std::string& expected, const AddChange& add_change) {
  WriteOp write;
  int cmp_result = 0;
  rados_write_op_omap_cmp2(write.op, key.data(), LIBRADOS_CMPXATTR_OP_EQ, expected.data(),
                           key.size(), expected.size(), &cmp_result);
  add_change(write.op);
  const int ret = OperateWrite(write, io, oid);
  if (ret == -ENOENT) return IfEqualAborted(pool, operation, oid, kNoSuchObject);
  if (ret < 0) return PoolError(ret, pool, operation, oid);
  if (cmp_result < 0) return PoolError(cmp_result, pool, operation, oid);
  return Status::Ok();
}

// An I/O context of the same pool for one call alone: rados_get_last_version
// reports the last operation of its context, which on the shared one may
// be another thread's.
struct PrivateIoctx {
  rados_ioctx_t io = nullptr;
  PrivateIoctx() = default;
  PrivateIoctx(const PrivateIoctx&) = delete;
  PrivateIoctx& operator=(const PrivateIoctx&) = delete;
  ~PrivateIoctx() {
    if (io != nullptr) rados_ioctx_destroy(io);
  }
};

// A changing object moves its version on between our read and our write;
// past this many attempts the compare gives up (kAborted).
constexpr int kVersionAttempts = 16;

// The change if `key` holds the empty value. omap_cmp cannot tell that
// from a missing key (see the top of this file), so the key is read, and
// the change is applied only at the object version that read saw.
Status ChangeIfEmptyByVersion(rados_t cluster, rados_ioctx_t shared, const std::string& pool,
                              std::string_view operation, const std::string& oid,
                              const std::string& key, const AddChange& add_change) {
  PrivateIoctx own;
  int ret = rados_ioctx_create2(cluster, rados_ioctx_get_id(shared), &own.io);
  if (ret < 0) {
    own.io = nullptr;
    return PoolError(ret, pool, operation, oid);
  }
  for (int attempt = 0; attempt < kVersionAttempts; ++attempt) {
    ReadOp read;
    OmapIter iter;
    int prval = 0;
    const char* keys[] = {key.data()};
    const size_t key_lens[] = {key.size()};
    rados_read_op_omap_get_vals_by_keys2(read.op, keys, 1, key_lens, &iter.iter, &prval);
    ret = rados_read_op_operate(read.op, own.io, oid.c_str(), 0);
    if (ret == -ENOENT) return IfEqualAborted(pool, operation, oid, kNoSuchObject);
    if (ret < 0) return PoolError(ret, pool, operation, oid);
    if (prval < 0) return PoolError(prval, pool, operation, oid);
    OmapEntries entries;
    ret = DrainOmapIter(iter.iter, &entries);
    if (ret < 0) return PoolError(ret, pool, operation, oid);
    if (entries.empty()) return IfEqualAborted(pool, operation, oid, ": no such key");
    if (!entries.front().second.empty()) {
      return IfEqualAborted(pool, operation, oid, ": the key holds another value");
    }
    WriteOp write;
    rados_write_op_assert_version(write.op, rados_get_last_version(own.io));
    add_change(write.op);
    ret = OperateWrite(write, own.io, oid);
    if (ret == -ERANGE || ret == -EOVERFLOW) continue;  // the object changed since the read
    if (ret == -ENOENT) return IfEqualAborted(pool, operation, oid, kNoSuchObject);
    if (ret < 0) return PoolError(ret, pool, operation, oid);
    return Status::Ok();
  }
  return IfEqualAborted(pool, operation, oid, ": it kept changing under the compare");
}

}  // namespace

Status RadosPool::OmapReplaceIfEqual(const std::string& oid, const std::string& key,
                                     const std::string& expected, const std::string& value) {
  const AddChange set = [&](rados_write_op_t op) {
    const char* keys[] = {key.data()};
    const char* values[] = {value.data()};
    const size_t key_lens[] = {key.size()};
    const size_t value_lens[] = {value.size()};
    rados_write_op_omap_set2(op, keys, values, key_lens, value_lens, 1);
  };
  constexpr std::string_view kOperation = "replace omap key of";
  if (expected.empty()) {
    return ChangeIfEmptyByVersion(handles_->cluster, handles_->io, pool_, kOperation, oid, key,
                                  set);
  }
  return ChangeIfEqualByCompare(handles_->io, pool_, kOperation, oid, key, expected, set);
}

Status RadosPool::OmapRemoveIfEqual(const std::string& oid, const std::string& key,
                                    const std::string& expected) {
  const AddChange remove = [&](rados_write_op_t op) {
    const char* keys[] = {key.data()};
    const size_t key_lens[] = {key.size()};
    rados_write_op_omap_rm_keys2(op, keys, key_lens, 1);
  };
  constexpr std::string_view kOperation = "remove omap key of";
  if (expected.empty()) {
    return ChangeIfEmptyByVersion(handles_->cluster, handles_->io, pool_, kOperation, oid, key,
                                  remove);
  }
  return ChangeIfEqualByCompare(handles_->io, pool_, kOperation, oid, key, expected, remove);
}

// --- advisory locks ---

Status RadosPool::LockExclusive(const std::string& oid, const std::string& name,
                                const std::string& cookie, std::chrono::seconds lease) {
  struct timeval duration {};
  duration.tv_sec = static_cast<time_t>(lease.count());
  const int ret = rados_lock_exclusive(handles_->io, oid.c_str(), name.c_str(), cookie.c_str(),
                                       "gpuckpt", &duration, LIBRADOS_LOCK_FLAG_MAY_RENEW);
  if (ret == -EEXIST || ret == -EBUSY) {
    return Status::Busy("pool " + pool_ + ": lock " + name + " of " + oid +
                        ": held by another holder");
  }
  if (ret < 0) return PoolError(ret, pool_, "lock " + name + " of", oid);
  return Status::Ok();
}

Status RadosPool::Unlock(const std::string& oid, const std::string& name,
                         const std::string& cookie) {
  const int ret = rados_unlock(handles_->io, oid.c_str(), name.c_str(), cookie.c_str());
  if (ret < 0) return PoolError(ret, pool_, "unlock " + name + " of", oid);
  return Status::Ok();
}

}  // namespace gpuckpt
