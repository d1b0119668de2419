// TorchRec's managed-collision modules (MCHManagedCollisionModule) and a
// dynamic table's map (docs/torchrec.md "Dynamic tables"): the buffers the
// export writes for a map, and the map the import rebuilds from them. Used
// by model/torchrec.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "embedding/dynamic_ids.h"
#include "embedding/dynamic_store.h"
#include "model/safetensors.h"
#include "model/torchrec.h"

namespace dlrm::model {

// The buffers of dynamic table `k`'s MCHManagedCollisionModule, in the
// order the module registers them (its state_dict's order), appended to
// `out`.
void AddMcTensors(const TableConfig& t, int k,
                  std::vector<TorchRecTensor>* out);

// The MCHManagedCollisionModule buffers of a dynamic table's map, in
// McBuffer's layout (docs/torchrec.md "Dynamic tables").
struct McState {
  std::vector<int64_t> segments, iter, sorted_ids, rows, last_access, counts;
};
McState McStateOf(const embedding::DynamicIdMap& map);
// The buffer `mc` of `s`.
const std::vector<int64_t>& McData(const McState& s, McBuffer mc);

// A dynamic table's map rebuilt from its managed-collision buffers, and
// per row of ours the TorchRec row whose weights it takes (-1: it keeps
// its own).
struct RebuiltMap {
  embedding::DynamicIdMap map;
  std::vector<int64_t> source;
};

// Rebuilds dynamic table `k`'s map (a store of `store`'s options) from the
// buffers `tensors` names in `file` (CheckTorchRecStateDict checked their
// keys, shapes and dtypes). InvalidArgument naming the tensor when they are
// not a map TorchRec could hold.
absl::StatusOr<RebuiltMap> RebuildMap(
    const SafetensorsFile& file, const std::vector<TorchRecTensor>& tensors,
    int k, const embedding::DynamicStore& store, TorchRecImportReport* report);

}  // namespace dlrm::model
