#include "fs/node_handler.h"

namespace gpuckpt {

Result<std::vector<ProcessInfo>> NodeContext::Processes() const {
  return engine->processes().List();
}

Result<ProcessInfo> NodeContext::Process(int pid) const { return engine->processes().Get(pid); }

Result<std::vector<std::string>> NodeContext::CheckpointsOf(int pid) const {
  // Only what the process's owner (or root) made for that owner: an import
  // claiming the pid of somebody else's job is not among them.
  GPUCKPT_ASSIGN_OR_RETURN(ProcessInfo process, Process(pid));
  GPUCKPT_ASSIGN_OR_RETURN(auto list, trees->Snapshots());
  std::vector<std::string> ids;
  for (const auto& s : list)
    if (IsCheckpointOfProcess(s, pid, process.creds.ruid)) ids.push_back(s.id);
  return ids;
}

Result<NodeId> NodeHandler::Child(const NodeId&, const std::string&, const Caller&) {
  return Status::InvalidArgument("not a directory");
}

Result<NodeEntries> NodeHandler::Children(const NodeId&, const Caller&) {
  return Status::InvalidArgument("not a directory");
}

Result<std::string> NodeHandler::Content(const NodeId&, const Caller&) {
  return Status::InvalidArgument("not a generated file");
}

Result<std::unique_ptr<FileReader>> NodeHandler::Open(const NodeId&) {
  return Status::InvalidArgument("not an image file");
}

Result<std::string> NodeHandler::Target(const NodeId&) {
  return Status::InvalidArgument("not a symlink");
}

struct stat DirStat(mode_t perms) {
  struct stat st {};
  st.st_mode = S_IFDIR | perms;
  st.st_nlink = 2;
  return st;
}

struct stat FileStat(mode_t perms, uint64_t size) {
  struct stat st {};
  st.st_mode = S_IFREG | perms;
  st.st_nlink = 1;
  st.st_size = static_cast<off_t>(size);
  st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  return st;
}

void SetTime(struct stat* st, int64_t ns) {
  st->st_mtim.tv_sec = ns / 1000000000;
  st->st_mtim.tv_nsec = ns % 1000000000;
  st->st_ctim = st->st_mtim;
  st->st_atim = st->st_mtim;
}

Status NoEntry(const std::string& name) { return Status::NotFound("no entry '" + name + "'"); }

bool ParseDecimal(const std::string& name, int* value) {
  if (name.empty() || name.size() > 9 || name[0] == '0') return false;
  for (char c : name)
    if (c < '0' || c > '9') return false;
  *value = std::stoi(name);
  return true;
}

}  // namespace gpuckpt
