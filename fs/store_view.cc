#include "fs/store_view.h"

#include <cstdlib>

#include "core/base/log.h"

namespace gpuckpt {

StoreView::StoreView(Store* store, Engine* engine)
    : trees_(store), context_{store, engine, &trees_} {
  AddTopNodes(&context_, &handlers_);
  AddCheckpointNodes(&context_, &handlers_);
  AddProcessNodes(&context_, &handlers_);
  for (const auto& handler : handlers_) {
    // A kind without a handler is a mistake of this build, found at the
    // first mount of any test.
    if (handler == nullptr) {
      spdlog::critical("gpuckptfs: a node kind has no handler");
      std::abort();
    }
  }
}

Status StoreView::RemoveSnapshot(const NodeId& node, const Caller& caller) {
  if (node.kind != NodeKind::kSnapshotDir) return Status::InvalidArgument("not a checkpoint");
  GPUCKPT_RETURN_IF_ERROR(trees_.Remove(node.snapshot, node.key, caller).status());
  // (Tests of the checkpoint tree alone run without an engine.)
  if (context_.engine != nullptr) context_.engine->NoteRemoved(node.snapshot, node.key);
  return Status::Ok();
}

}  // namespace gpuckpt
