#include "fs/inode_table.h"

#include <cstdio>
#include <cstdlib>

namespace gpuckpt {

namespace {
constexpr uint64_t kRootIno = 1;  // FUSE_ROOT_ID
}

InodeTable::InodeTable() : next_ino_(kRootIno + 1) {
  by_ino_[kRootIno] = Entry{NodeId{}, 1};
  by_node_[NodeId{}] = kRootIno;
}

uint64_t InodeTable::Ref(const NodeId& node) {
  MutexLock lock(&mu_);
  auto it = by_node_.find(node);
  if (it != by_node_.end()) {
    ++by_ino_[it->second].lookups;
    return it->second;
  }
  const uint64_t ino = next_ino_++;
  by_ino_[ino] = Entry{node, 1};
  by_node_[node] = ino;
  return ino;
}

void InodeTable::Forget(uint64_t ino, uint64_t count) {
  if (ino == kRootIno) return;
  MutexLock lock(&mu_);
  auto it = by_ino_.find(ino);
  if (it == by_ino_.end() || it->second.lookups < count) {
    std::fprintf(stderr, "gpuckptfs: forget of %llu references to inode %llu it does not hold\n",
                 static_cast<unsigned long long>(count), static_cast<unsigned long long>(ino));
    std::abort();  // a lookup count out of step with the kernel is a bug
  }
  it->second.lookups -= count;
  if (it->second.lookups == 0) {
    by_node_.erase(it->second.node);
    by_ino_.erase(it);
  }
}

std::optional<NodeId> InodeTable::Get(uint64_t ino) const {
  MutexLock lock(&mu_);
  auto it = by_ino_.find(ino);
  if (it == by_ino_.end()) return std::nullopt;
  return it->second.node;
}

}  // namespace gpuckpt
