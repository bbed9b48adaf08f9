// NodeHandler: what one kind of node of the gpuckptfs tree answers (its
// children, attributes, contents, target), and the table of one handler
// per NodeKind that StoreView dispatches through. The handlers live by
// part of the tree: top_nodes.cc (the mount's top and its three lists of
// checkpoints), checkpoint_nodes.cc (a checkpoint's directory, manifest,
// files, device/<id>/ and archives/<id>.tar) and process_nodes.cc (a
// process's <pid>/).
//
// A handler is asked only about nodes of its own kind. What it does not
// answer (the children of a file, the contents of a directory) is
// kInvalidArgument, as the defaults below say.
//
// Thread-safe: handlers hold no state of their own; they share the
// NodeContext, whose parts are thread-safe.
#ifndef GPUCKPT_FS_NODE_HANDLER_H_
#define GPUCKPT_FS_NODE_HANDLER_H_

#include <sys/stat.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/engine/engine.h"
#include "fs/checkpoint_trees.h"
#include "fs/node_id.h"
#include "gpuckpt/store.h"

namespace gpuckpt {

// What the handlers share. Borrows all of it; StoreView owns the trees.
struct NodeContext {
  Store* store;
  Engine* engine;  // null in tests of the checkpoint tree alone
  CheckpointTrees* trees;

  // The processes the mount shows, and one of them, as the engine's
  // process table has them.
  Result<std::vector<ProcessInfo>> Processes() const;
  Result<ProcessInfo> Process(int pid) const;
  // The ids of process `pid`'s checkpoints as <pid>/checkpoints/ lists
  // them, oldest first.
  Result<std::vector<std::string>> CheckpointsOf(int pid) const;
};

using NodeEntries = std::vector<std::pair<std::string, NodeId>>;

class NodeHandler {
 public:
  explicit NodeHandler(const NodeContext* context) : context_(*context) {}
  virtual ~NodeHandler() = default;
  NodeHandler(const NodeHandler&) = delete;
  NodeHandler& operator=(const NodeHandler&) = delete;

  // The child `name` of directory `dir`, or kNotFound (also where `caller`
  // may not see it).
  virtual Result<NodeId> Child(const NodeId& dir, const std::string& name, const Caller& caller);
  // The children of directory `dir` that `caller` may list, in the order
  // a listing shows them.
  virtual Result<NodeEntries> Children(const NodeId& dir, const Caller& caller);
  // Attributes as `caller` may see them (st_ino left 0).
  virtual Result<struct stat> Attributes(const NodeId& node, const Caller& caller) = 0;
  // The bytes of a generated file.
  virtual Result<std::string> Content(const NodeId& node, const Caller& caller);
  // A reader of a checkpoint's file or archive.
  virtual Result<std::unique_ptr<FileReader>> Open(const NodeId& node);
  // The target of a symlink.
  virtual Result<std::string> Target(const NodeId& node);

 protected:
  const NodeContext& context_;
};

using NodeHandlers = std::array<std::unique_ptr<NodeHandler>, kNodeKindCount>;

// Makes a `Handler` the one of `kind`.
template <typename Handler, typename... Args>
void PutHandler(NodeKind kind, const NodeContext* context, NodeHandlers* handlers, Args... args) {
  (*handlers)[static_cast<size_t>(kind)] = std::make_unique<Handler>(context, args...);
}

// Each part of the tree puts its handlers in `handlers`, at their kinds.
void AddTopNodes(const NodeContext* context, NodeHandlers* handlers);
void AddCheckpointNodes(const NodeContext* context, NodeHandlers* handlers);
void AddProcessNodes(const NodeContext* context, NodeHandlers* handlers);

// Shared by the parts: attributes of generated directories and files, and
// of a checkpoint's stored entries.
struct stat DirStat(mode_t perms);
struct stat FileStat(mode_t perms, uint64_t size);
void SetTime(struct stat* st, int64_t ns);
Status NoEntry(const std::string& name);
// A decimal number without sign or leading zero, as pids and
// <pid>/checkpoints/<n> are written.
bool ParseDecimal(const std::string& name, int* value);

}  // namespace gpuckpt

#endif  // GPUCKPT_FS_NODE_HANDLER_H_
