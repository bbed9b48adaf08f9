// A process's nodes: <pid>/ with its ctl, status, status.json and
// checkpoints/ of links to its checkpoints. They belong to the process's
// owner, and are absent (kNotFound) to anyone else but root.
#include <optional>
#include <string>
#include <vector>

#include "core/base/time_text.h"
#include "fs/node_handler.h"
#include "fs/status_render.h"

namespace gpuckpt {
namespace {

constexpr char kPidCtlHelp[] =
    "commands: checkpoint [--kill] [--name NAME] [--lock-timeout MS] [--no-space-check]\n"
    "                     [--every DURATION|off] [--keep-last N] [--keep-within DURATION]\n"
    "                     [--owner-keep-last N] [--owner-keep-within DURATION]\n";

class ProcessNode : public NodeHandler {
 public:
  using NodeHandler::NodeHandler;

  Result<struct stat> Attributes(const NodeId& node, const Caller& caller) override {
    GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo p, context_.Process(node.pid));
    if (!caller.is_root() && p.creds.ruid != caller.uid)
      return Status::NotFound("no process " + std::to_string(node.pid));
    GPUCKPT_ASSIGN_OR_RETURN(struct stat st, Shape(node));
    st.st_uid = p.creds.ruid;
    st.st_gid = p.creds.rgid;
    // A process's files are of the moment they are read (its state,
    // memory, the operation in flight).
    SetTime(&st, UnixNowNs());
    return st;
  }

 protected:
  // The node's type, mode and size.
  virtual Result<struct stat> Shape(const NodeId& node) = 0;
};

class PidDirNode : public ProcessNode {
 public:
  using ProcessNode::ProcessNode;

  Result<NodeId> Child(const NodeId& dir, const std::string& name, const Caller&) override {
    if (name == "ctl") return MakeNode(NodeKind::kPidCtl, dir.pid);
    if (name == "status") return MakeNode(NodeKind::kPidStatus, dir.pid);
    if (name == "status.json") return MakeNode(NodeKind::kPidStatusJson, dir.pid);
    if (name == "checkpoints") return MakeNode(NodeKind::kPidCheckpoints, dir.pid);
    return NoEntry(name);
  }

  Result<NodeEntries> Children(const NodeId& dir, const Caller&) override {
    return NodeEntries{{"checkpoints", MakeNode(NodeKind::kPidCheckpoints, dir.pid)},
                       {"ctl", MakeNode(NodeKind::kPidCtl, dir.pid)},
                       {"status", MakeNode(NodeKind::kPidStatus, dir.pid)},
                       {"status.json", MakeNode(NodeKind::kPidStatusJson, dir.pid)}};
  }

 protected:
  Result<struct stat> Shape(const NodeId&) override { return DirStat(0700); }
};

class PidCtlNode : public ProcessNode {
 public:
  using ProcessNode::ProcessNode;
  Result<std::string> Content(const NodeId&, const Caller&) override {
    return std::string(kPidCtlHelp);
  }

 protected:
  Result<struct stat> Shape(const NodeId&) override { return FileStat(0600, 0); }
};

// <pid>/status and <pid>/status.json: the engine's report of the process,
// with its checkpoints as <pid>/checkpoints/ lists them.
class PidStatusNode : public ProcessNode {
 public:
  // `json`: status.json, else status.
  PidStatusNode(const NodeContext* context, bool json) : ProcessNode(context), json_(json) {}

  Result<std::string> Content(const NodeId& node, const Caller&) override {
    GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo p, context_.Process(node.pid));
    const ProcessStatusReport report = context_.engine->ProcessStatus(p);
    std::optional<std::vector<std::string>> checkpoints;
    if (auto ids = context_.CheckpointsOf(node.pid); ids.ok()) checkpoints = std::move(*ids);
    return json_ ? StatusJsonFile(report, checkpoints) : StatusFile(report, checkpoints);
  }

 protected:
  Result<struct stat> Shape(const NodeId&) override { return FileStat(0400, 0); }

 private:
  const bool json_;
};

// <pid>/checkpoints/: 1, 2, ... oldest first, and latest.
class PidCheckpointsNode : public ProcessNode {
 public:
  using ProcessNode::ProcessNode;

  Result<NodeId> Child(const NodeId& dir, const std::string& name, const Caller&) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto ids, context_.CheckpointsOf(dir.pid));
    int n = 0;
    if ((name == "latest" && !ids.empty()) ||
        (ParseDecimal(name, &n) && static_cast<size_t>(n) <= ids.size()))
      return MakeNode(NodeKind::kPidCheckpointLink, dir.pid, name);
    return NoEntry(name);
  }

  Result<NodeEntries> Children(const NodeId& dir, const Caller&) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto ids, context_.CheckpointsOf(dir.pid));
    NodeEntries out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string name = std::to_string(i + 1);
      out.push_back({name, MakeNode(NodeKind::kPidCheckpointLink, dir.pid, name)});
    }
    if (!ids.empty())
      out.push_back({"latest", MakeNode(NodeKind::kPidCheckpointLink, dir.pid, "latest")});
    return out;
  }

 protected:
  Result<struct stat> Shape(const NodeId&) override { return DirStat(0500); }
};

// <pid>/checkpoints/<n|latest>: ../../checkpoints/<id>.
class PidCheckpointLinkNode : public ProcessNode {
 public:
  using ProcessNode::ProcessNode;

  Result<std::string> Target(const NodeId& node) override {
    GPUCKPT_ASSIGN_OR_RETURN(auto ids, context_.CheckpointsOf(node.pid));
    if (ids.empty()) return Status::NotFound("no checkpoint");
    if (node.path == "latest") return "../../checkpoints/" + ids.back();
    const size_t n = std::stoul(node.path);
    if (n < 1 || n > ids.size()) return Status::NotFound("no checkpoint " + node.path);
    return "../../checkpoints/" + ids[n - 1];
  }

 protected:
  Result<struct stat> Shape(const NodeId& node) override {
    GPUCKPT_ASSIGN_OR_RETURN(std::string target, Target(node));
    struct stat st {};
    st.st_mode = S_IFLNK | 0777;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(target.size());
    return st;
  }
};

}  // namespace

void AddProcessNodes(const NodeContext* context, NodeHandlers* handlers) {
  PutHandler<PidDirNode>(NodeKind::kPidDir, context, handlers);
  PutHandler<PidCtlNode>(NodeKind::kPidCtl, context, handlers);
  PutHandler<PidStatusNode>(NodeKind::kPidStatus, context, handlers, /*json=*/false);
  PutHandler<PidStatusNode>(NodeKind::kPidStatusJson, context, handlers, /*json=*/true);
  PutHandler<PidCheckpointsNode>(NodeKind::kPidCheckpoints, context, handlers);
  PutHandler<PidCheckpointLinkNode>(NodeKind::kPidCheckpointLink, context, handlers);
}

}  // namespace gpuckpt
