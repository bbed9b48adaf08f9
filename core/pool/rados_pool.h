// RadosPool: one connection to one Ceph RADOS pool, through librados's C
// API. Everything gpuckpt asks of the pool goes through it: whole objects,
// ranged reads, object maps (omap), exclusive creation and advisory locks.
// It knows nothing of chunks or snapshots (core/pool/pool_format.h does).
//
// Errors are values: every librados error becomes a Status whose message
// names the pool, the operation and the object, with the code of its errno
// (StatusFromErrno): ENOENT kNotFound, EEXIST kAlreadyExists, ENOSPC and
// EDQUOT kNoSpace (the pool or its OSDs are full), ETIMEDOUT kTimedOut
// (the cluster did not answer within PoolConnection::op_timeout),
// ECANCELED kAborted (a compare failed), EBUSY kBusy (a lock is held).
// An operation never blocks longer than op_timeout: an unreachable cluster
// is an error, not a hang. librados reconnects by itself once the cluster
// is back; nothing here needs to be reopened.
//
// Thread-safe: any number of threads may call any member at once (librados
// is thread-safe, and the object holds no mutable state of its own beyond
// the handles). Owns the librados cluster handle and I/O context; both are
// released by the destructor, which waits for operations in flight.
#ifndef GPUCKPT_CORE_POOL_RADOS_POOL_H_
#define GPUCKPT_CORE_POOL_RADOS_POOL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpuckpt/status.h"

namespace gpuckpt {

struct PoolConnection {
  // The RADOS pool; it must exist (gpuckpt does not create pools).
  std::string pool;
  // ceph.conf to read; empty: librados's default search (CEPH_CONF,
  // /etc/ceph/ceph.conf, ~/.ceph/ceph.conf, ./ceph.conf).
  std::string conf_file;
  // The client's name without "client.": its key is found as the
  // configuration says. Empty: "admin".
  std::string client_id;
  // How long one operation (or connecting) may take before it fails with
  // kTimedOut. Default: 30 s.
  std::chrono::milliseconds op_timeout{30000};
};

class RadosPool {
 public:
  // Connects to the cluster and opens the pool. kNotFound when the pool
  // does not exist; kTimedOut when no monitor answers in time.
  static Result<std::unique_ptr<RadosPool>> Connect(const PoolConnection& connection);
  ~RadosPool();
  RadosPool(const RadosPool&) = delete;
  RadosPool& operator=(const RadosPool&) = delete;

  const std::string& pool_name() const { return pool_; }

  // --- whole objects ---
  // Replaces the object's data with `data` (creating it). Durable on every
  // replica when it returns OK.
  Status WriteFull(const std::string& oid, std::string_view data);
  // Creates the object holding `data`; kAlreadyExists when it exists. The
  // create and the write are one atomic operation.
  Status CreateExclusive(const std::string& oid, std::string_view data);
  // `length` bytes from `offset` (fewer at the end of the object).
  Result<std::string> Read(const std::string& oid, uint64_t offset, uint64_t length);
  // The whole object; kInvalidArgument when it is larger than `max_bytes`
  // (so that a planted object cannot make the reader allocate its size).
  Result<std::string> ReadWhole(const std::string& oid, uint64_t max_bytes);
  struct ObjectStat {
    uint64_t size = 0;
    int64_t mtime_unix_s = 0;  // last modification, by the OSD's clock
  };
  // nullopt when the object does not exist.
  Result<std::optional<ObjectStat>> Stat(const std::string& oid);
  // kNotFound when it does not exist.
  Status Remove(const std::string& oid);
  // Names of all objects whose name starts with `prefix`, in no order.
  Result<std::vector<std::string>> ListObjects(std::string_view prefix);

  // --- many operations in flight ---
  // Writes and reads issued asynchronously, at most `max_in_flight` at once;
  // Wait() returns when all have completed, with the first error (the
  // others still complete). A Batch borrows the pool; destroying one waits
  // for what it issued. Used from one thread at a time.
  class Batch {
   public:
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    // Blocks while max_in_flight operations are outstanding.
    void WriteFull(std::string oid, std::string data);
    // Fills `*out` (which must live until Wait()) with up to `length` bytes
    // from `offset`; fewer at the end of the object.
    void Read(std::string oid, uint64_t offset, uint64_t length, std::string* out);
    Status Wait();

   private:
    friend class RadosPool;
    struct State;
    explicit Batch(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };
  std::unique_ptr<Batch> NewBatch(unsigned max_in_flight);

  // --- object maps (omap): keys and values are arbitrary bytes ---
  // The values of those of `keys` the object's map holds (absent keys, and
  // an absent object, are simply missing from the result).
  Result<std::vector<std::pair<std::string, std::string>>> OmapGet(
      const std::string& oid, const std::vector<std::string>& keys);
  // Up to `max` entries with keys after `start_after` ("" from the start),
  // in key order; fewer than `max` means the end was reached.
  Result<std::vector<std::pair<std::string, std::string>>> OmapList(const std::string& oid,
                                                                    const std::string& start_after,
                                                                    unsigned max);
  // Sets the entries (creating the object); one atomic operation.
  Status OmapSet(const std::string& oid,
                 const std::vector<std::pair<std::string, std::string>>& entries);
  // Removes the keys (absent ones are no error; an absent object is).
  Status OmapRemove(const std::string& oid, const std::vector<std::string>& keys);
  // Sets `key` to `value` only if it holds `expected` now; kAborted when
  // it does not (a different value, or no such key). One atomic operation.
  Status OmapReplaceIfEqual(const std::string& oid, const std::string& key,
                            const std::string& expected, const std::string& value);
  // Removes `key` only if it holds `expected` now; kAborted otherwise.
  Status OmapRemoveIfEqual(const std::string& oid, const std::string& key,
                           const std::string& expected);

  // --- advisory locks (cls_lock), held for a lease ---
  // Takes the exclusive lock `name` on object `oid` for `lease` under
  // `cookie` (which identifies this holder: taking it again with the same
  // cookie renews the lease). kBusy when another holder has it and its
  // lease has not run out. The object is created if needed.
  Status LockExclusive(const std::string& oid, const std::string& name, const std::string& cookie,
                       std::chrono::seconds lease);
  // kNotFound when this cookie does not hold it (say, its lease ran out and
  // another holder took it).
  Status Unlock(const std::string& oid, const std::string& name, const std::string& cookie);

 private:
  struct Handles;
  RadosPool(std::string pool, std::unique_ptr<Handles> handles);
  std::string pool_;
  std::unique_ptr<Handles> handles_;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_POOL_RADOS_POOL_H_
