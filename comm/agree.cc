// AgreeOnStatus: an all-gather of codes and message lengths, then the first
// failing rank's message by broadcast.
#include "comm/agree.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace dlrm::comm {

Agreement AgreeOnStatus(Communicator& comm, const absl::Status& local,
                        const std::vector<int64_t>& extra,
                        std::vector<int64_t>* all_extra,
                        absl::string_view who) {
  const int world = comm.world_size();
  // Word 0: the status code; word 1: the message's length; then `extra`.
  constexpr int kHead = 2;
  const int64_t width = kHead + static_cast<int64_t>(extra.size());
  const absl::string_view text = local.message();
  std::vector<int64_t> mine(width, 0);
  mine[0] = static_cast<int64_t>(local.code());
  mine[1] = static_cast<int64_t>(text.size());
  std::copy(extra.begin(), extra.end(), mine.begin() + kHead);
  std::vector<int64_t> all(static_cast<size_t>(width) * world);
  Agreement agreed;
  agreed.communicator =
      comm.AllGather(mine.data(), width, all.data(), DataType::kInt64);
  if (!agreed.communicator.ok()) return agreed;
  if (all_extra != nullptr) {
    all_extra->clear();
    for (int r = 0; r < world; ++r) {
      const auto begin = all.begin() + width * r + kHead;
      all_extra->insert(all_extra->end(), begin, begin + extra.size());
    }
  }
  for (int r = 0; r < world; ++r) {
    const int64_t* theirs = &all[static_cast<size_t>(width) * r];
    if (theirs[0] == 0) continue;
    // The first rank that failed tells the others its message; every rank
    // takes part, so the broadcast happens whatever this rank's outcome.
    std::string message = r == comm.rank() ? std::string(text) : std::string();
    message.resize(static_cast<size_t>(theirs[1]));
    if (theirs[1] > 0) {
      agreed.communicator =
          comm.Broadcast(message.data(), theirs[1], DataType::kUint8, r);
      if (!agreed.communicator.ok()) return agreed;
    }
    agreed.verdict =
        !local.ok() ? local
                    : absl::Status(static_cast<absl::StatusCode>(theirs[0]),
                                   absl::StrCat(who, " ", r, ": ", message));
    return agreed;
  }
  return agreed;
}

}  // namespace dlrm::comm
