// The version of this build: the project's version and, when the source was
// a git checkout at configure time, `git describe --tags --always --dirty`.
// The values are defined in version.cc, which CMake writes at configure time
// (core/version.cc.in), so that a new `git describe` recompiles that one file
// and the files that print the version compile alike in every checkout (the
// image's compile reuses the host build's ccache entries,
// docs/deployment.md "Tests").
#pragma once

namespace dlrm {

// The project version, e.g. "0.1.0".
extern const char kVersion[];
// `git describe` at configure time, e.g. "56a9fe3-dirty"; empty when the
// source was not a git checkout.
extern const char kGitDescribe[];
// What --version prints after the program's name: "0.1.0 (git 56a9fe3)",
// or "0.1.0" without git.
extern const char kVersionString[];

}  // namespace dlrm
