// Criteo TSV samples from a stream (a file or stdin) for the CLI: lines with
// the label, as in train.txt, or without it, as in the Kaggle test.txt.
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/criteo.h"
#include "data/source.h"

namespace dlrm::clients {

// A BatchSource over Criteo TSV lines read from `in` (borrowed; must
// outlive the source). A line holds 1 + num_dense + num_sparse columns
// (label first) or num_dense + num_sparse (no label: the sample gets label
// 0); blank lines are skipped; values are reduced to rows, and expanded to
// multi-hot bags where options.multi_hot_sizes says, as data/criteo.h says.
// `name` names the stream in errors ("stdin:3: ..."). Next returns
// InvalidArgument for a malformed line. Rewind seeks back to the start, or
// is FailedPrecondition for a stream that cannot seek (a pipe).
// InvalidArgument from the factory for bad options.
absl::StatusOr<std::unique_ptr<data::BatchSource>> OpenCriteoStream(
    std::istream* in, std::string name, data::CriteoOptions options);

}  // namespace dlrm::clients
