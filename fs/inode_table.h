// InodeTable: the FUSE inode numbers of the nodes the kernel knows about.
//
// Each node gets a number on its first lookup and keeps it while the
// kernel holds references (exact lookup counts: a forget that takes more
// than was given is a bug, and aborts). The root is FUSE_ROOT_ID forever.
// Numbers are never reused within a process, so the generation stays 0;
// and since a checkpoint's nodes include its key (NodeId::key), a
// checkpoint made under the id of a removed one never gets the removed
// one's numbers, which the kernel may still hold (an open file, a cwd).
//
// Thread-safe (one mutex, held only for map operations).
#ifndef GPUCKPT_FS_INODE_TABLE_H_
#define GPUCKPT_FS_INODE_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>

#include "core/base/mutex.h"
#include "fs/node_id.h"

namespace gpuckpt {

class InodeTable {
 public:
  InodeTable();

  // The number of `node`, adding one lookup reference.
  uint64_t Ref(const NodeId& node) EXCLUDES(mu_);
  // Drops `count` lookup references.
  void Forget(uint64_t ino, uint64_t count) EXCLUDES(mu_);
  std::optional<NodeId> Get(uint64_t ino) const EXCLUDES(mu_);

 private:
  struct Entry {
    NodeId node;
    uint64_t lookups = 0;
  };
  mutable Mutex mu_;
  uint64_t next_ino_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Entry> by_ino_ GUARDED_BY(mu_);
  std::map<NodeId, uint64_t> by_node_ GUARDED_BY(mu_);
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_INODE_TABLE_H_
