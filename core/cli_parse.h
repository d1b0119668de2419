// The command-line parsing every binary shares (dlrm_server, dlrm_train,
// dlrm_client): a --version flag, parse errors that name the config file a
// bad key came from, the one name of each flag several binaries share and
// the one --config, and the exit status of a failed run.
// Header-only, so that core does not link CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/version.h"

namespace dlrm {

// The names of the flags for concepts several binaries share: one name each
// (the one most binaries used), then the old spelling the others had,
// still accepted as a deprecated alias (CLI11 takes either; --help shows
// both). Give them to add_option as the name.
// Samples per step (per request, per call).
inline constexpr char kBatchFlag[] = "--batch,--batch-size";
// Steps to run (timed steps per repetition in a benchmark).
inline constexpr char kStepsFlag[] = "--steps,--iters";
// The Zipf exponent of synthetic ids.
inline constexpr char kAlphaFlag[] = "--alpha,--zipf-alpha";
// Synthetic ids' vocabulary per table and its drift (data::SyntheticOptions
// vocabulary and drift).
inline constexpr char kVocabularyFlag[] = "--vocabulary";
inline constexpr char kDriftFlag[] = "--drift";
inline constexpr char kVocabularyHelp[] =
    "Synthetic ids: distinct ids per table, drawn Zipf and scattered by a "
    "fixed permutation; a static table of fewer rows takes them modulo its "
    "rows, a dynamic table as they are (0 = no vocabulary: ids are rows)";
inline constexpr char kDriftHelp[] =
    "Synthetic ids under --vocabulary: Zipf rank positions the vocabulary "
    "moves per sample (new ids become the hottest, old ones fade; 0 = none)";

// Adds --version to `app`: prints "<program> <kVersionString>" and exits 0.
inline void AddVersionFlag(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", program + " " + kVersionString,
                       "Print the version and exit");
}

// Adds option `name` bound to `value`, its default shown in --help: the
// add_option(...)->capture_default_str() most flags are. `app` may be a
// subcommand. Returns the option, for ->check() and the like.
template <typename T>
CLI::Option* AddDefaulted(CLI::App& app, const std::string& name, T& value,
                          const std::string& help) {
  return app.add_option(name, value, help)->capture_default_str();
}

// Adds --config, the model config of every binary that builds or shapes a
// model, bound to *spec: a preset, one of `presets` (core/config.h's
// PresetNames()), or a text-format ModelConfig file (LoadModelConfig).
// `role` ends the help with what this binary does with it. Returns the
// option, for ->required() or ->capture_default_str().
inline CLI::Option* AddConfigFlag(CLI::App& app, std::string* spec,
                                  const std::vector<std::string>& presets,
                                  const std::string& role) {
  std::string names;
  for (const std::string& p : presets) names += (names.empty() ? "" : ", ") + p;
  return app.add_option("--config", *spec,
                        "Model config: a preset (" + names +
                            ") or a text-format ModelConfig file" +
                            (role.empty() ? "" : "; " + role));
}

// Parses argv into `app` as CLI11_PARSE does; returns -1 to go on, else the
// exit code for main() (0 after --help or --version, which print to
// stdout; non-zero after an error, printed to stderr as
// "<program>: <error>"). An error in a config file (set_config) names the
// file: "--server-config x.toml: unknown key \"listen-port\" (keys are the
// long flag names)" rather than CLI11's "INI was not able to parse
// listen-port".
inline int ParseCommandLine(CLI::App& app, int argc, char** argv,
                            const std::string& program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {
    std::string file, flag = "config file";
    if (const CLI::Option* config = app.get_config_ptr(); config != nullptr) {
      flag = config->get_name();
      for (const std::string& r : config->results()) {
        file += (file.empty() ? "" : ", ") + r;
      }
    }
    std::string what = e.what();
    const std::string extras = "INI was not able to parse ";
    if (what.rfind(extras, 0) == 0) {
      what = "unknown key \"" + what.substr(extras.size()) +
             "\" (keys are the long flag names; see --help)";
    }
    std::fprintf(stderr, "%s: %s %s: %s\n", program.c_str(), flag.c_str(),
                 file.c_str(), what.c_str());
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

// main()'s exit status after `status`: 0 when it is OK; else 1, after
// "`program`: <status>" on stderr.
inline int ExitStatus(const absl::Status& status, const char* program) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
  return 1;
}

}  // namespace dlrm
