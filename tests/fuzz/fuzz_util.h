// Helpers shared by the fuzz targets: an in-memory file with a path (the
// readers under test open paths), and an invariant check that aborts, so
// libFuzzer keeps the input that broke it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

namespace dlrm::fuzz {

// Aborts with `what` and the status when `status` is not OK: for states the
// code under test promises never to reach.
inline void CheckOk(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "invariant broken: %s: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

inline void Check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "invariant broken: %s\n", what);
  std::abort();
}

// Aborts with `what` and the status unless `status` is InvalidArgument: the
// one error a parser may return for bad bytes.
inline void CheckInvalidArgument(const absl::Status& status, const char* what) {
  if (absl::IsInvalidArgument(status)) return;
  std::fprintf(stderr, "invariant broken: %s: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

// A memfd holding `size` bytes, reachable as /proc/self/fd/N, so each input
// costs no disk I/O. Closed by the destructor.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("fuzz-input", MFD_CLOEXEC);
    Check(fd_ >= 0, "memfd_create");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd_, data + done, size - done);
      Check(n > 0, "write to memfd");
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { close(fd_); }

  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace dlrm::fuzz
