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

Status StoreView::CheckRemovable(const NodeId& node) const {
  // (Tests of the checkpoint tree alone run without an engine.)
  return context_.engine != nullptr ? context_.engine->CheckRemovable(node.snapshot) : Status::Ok();
}

Status StoreView::RemoveSnapshot(const NodeId& node, const Caller& caller) {
  if (node.kind != NodeKind::kSnapshotDir) return Status::InvalidArgument("not a checkpoint");
  // A lazily restored tree's memory still comes from it. Asked after the
  // visibility check, so that another user's checkpoint reads as absent.
  if (context_.engine != nullptr) {
    GPUCKPT_RETURN_IF_ERROR(
        trees_.VisibleHead(node.snapshot, node.key, caller, /*device_view=*/false).status());
    GPUCKPT_RETURN_IF_ERROR(CheckRemovable(node));
  }
  GPUCKPT_RETURN_IF_ERROR(trees_.Remove(node.snapshot, node.key, caller).status());
  // (Tests of the checkpoint tree alone run without an engine.)
  if (context_.engine != nullptr) context_.engine->NoteRemoved(node.snapshot, node.key);
  return Status::Ok();
}

}  // namespace gpuckpt
