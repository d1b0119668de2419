// dlrm_bench's output: the markdown table, the JSON rows and the bar
// chart (gnuplot or matplotlib), and the host it describes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "bench/dlrm_bench.h"

namespace dlrm::bench {

namespace fs = std::filesystem;

namespace {

std::string JsonNumbers(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", absl::StrFormat("%.1f", v[i]));
  }
  return out + "]";
}

std::string RateCell(const Row& row) {
  if (!row.note.empty()) return row.note;
  const auto [lo, hi] =
      std::minmax_element(row.samples_per_s.begin(), row.samples_per_s.end());
  if (row.projected) return absl::StrFormat("%.0f", *lo);
  return absl::StrFormat("%.0f [%.0f-%.0f]", Median(row.samples_per_s), *lo,
                         *hi);
}

std::string SpeedupCell(const Row& row, double base) {
  if (!row.note.empty() || base <= 0) return "-";
  return absl::StrFormat("%.2fx", Median(row.samples_per_s) / base);
}

}  // namespace

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonMap(const std::map<std::string, double>& m) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    absl::StrAppend(&out, first ? "" : ", ", JsonQuote(k), ": ",
                    absl::StrFormat("%.6g", v));
    first = false;
  }
  return out + "}";
}

// Output of `command` (trailing newline removed); empty on failure.
std::string CommandOutput(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  if (pclose(p) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) {
    out.pop_back();
  }
  return out;
}

Machine DescribeMachine() {
  Machine m;
  m.cores = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) m.cpu_model = line.substr(colon + 2);
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    double kb = 0;
    fields >> key >> kb;
    if (key == "MemTotal:") m.memory_gib = kb / (1 << 20);
    if (key == "MemAvailable:") m.available_gib = kb / (1 << 20);
  }
  return m;
}

void PrintSection(const std::string& title, const std::vector<Row>& rows,
                  double base) {
  std::printf("\n%s\n\n", title.c_str());
  std::printf(
      "| hardware | scenario | feed | samples/s median [min-max] | speedup "
      "over CPU |\n| --- | --- | --- | ---: | ---: |\n");
  for (const Row& row : rows) {
    std::printf("| %s | %s | %s | %s | %s |\n", row.hardware.c_str(),
                row.scenario.c_str(), row.feed.c_str(), RateCell(row).c_str(),
                SpeedupCell(row, base).c_str());
  }
}

std::string RowJson(const Row& row, double base) {
  std::string out = absl::StrCat("{\"hardware\": ", JsonQuote(row.hardware),
                                 ", \"scenario\": ", JsonQuote(row.scenario),
                                 ", \"feed\": ", JsonQuote(row.feed));
  if (!row.precision.empty()) {
    absl::StrAppend(&out, ", \"precision\": ", JsonQuote(row.precision),
                    ", \"isa\": ", JsonQuote(row.isa));
  }
  if (!row.note.empty()) {
    absl::StrAppend(
        &out, ", \"available\": false, \"note\": ", JsonQuote(row.note), "}");
    return out;
  }
  const auto [lo, hi] =
      std::minmax_element(row.samples_per_s.begin(), row.samples_per_s.end());
  absl::StrAppend(
      &out, absl::StrFormat(", \"samples_per_s\": {\"median\": %.1f, \"min\": "
                            "%.1f, \"max\": %.1f}, \"speedup_over_cpu\": %.4f",
                            Median(row.samples_per_s), *lo, *hi,
                            base > 0 ? Median(row.samples_per_s) / base : 0));
  if (row.projected) {
    absl::StrAppend(&out, ", \"model_ms\": ", JsonMap(row.model_ms),
                    ", \"bytes_per_step\": ", JsonMap(row.bytes_per_step));
  } else {
    absl::StrAppend(&out,
                    ", \"repetitions\": ", JsonNumbers(row.samples_per_s));
  }
  return out + "}";
}

// Writes the bar chart with gnuplot (else python3-matplotlib). Returns the
// PNG path, or FailedPrecondition naming what to install.
absl::StatusOr<std::string> WriteChart(const fs::path& dir,
                                       const std::vector<Row>& measured,
                                       const std::vector<Row>& projected) {
  const fs::path dat = dir / "chart.dat";
  const fs::path png = dir / "dlrm_bench.png";
  {
    std::ofstream out(dat);
    int i = 0;
    auto add = [&](const Row& row, int kind) {
      if (!row.note.empty()) return;
      std::string label = absl::StrCat(row.scenario, "\\n", row.feed);
      std::replace(label.begin(), label.end(), '"', '\'');
      out << i++ << " \"" << label << "\" " << Median(row.samples_per_s) << " "
          << kind << "\n";
    };
    for (const Row& row : measured) add(row, 0);
    for (const Row& row : projected) add(row, 1);
    if (!out)
      return absl::InternalError(absl::StrCat("cannot write ", dat.string()));
  }
  if (!CommandOutput("command -v gnuplot").empty()) {
    const fs::path script = dir / "chart.gp";
    std::ofstream gp(script);
    gp << "set terminal pngcairo size 1200,600 font 'sans,9'\n"
       << "set output '" << png.string() << "'\n"
       << "set title 'dlrm_bench: training samples/s (solid: measured, "
          "hatched: projected)' noenhanced\n"
       << "set ylabel 'samples/s'\nset logscale y\nset grid ytics\n"
       << "set style fill solid 0.8 border -1\nset boxwidth 0.6\n"
       << "set xtics rotate by -25 noenhanced\nset bmargin 9\n"
       << "set key top left\nset rmargin 14\nset offsets 0.5, 0.5, 0, 0\n"
       << "plot '" << dat.string()
       << "' using 1:($4==0?$3:1/0):xtic(2) with boxes lc rgb '#1f77b4' "
          "fs solid 0.8 title 'measured', \\\n  '' using 1:($4==1?$3:1/0) "
          "with boxes lc rgb '#d62728' fs pattern 4 border title "
          "'projected (not measured)'\n";
    gp.close();
    if (std::system(absl::StrCat("gnuplot '", script.string(), "'").c_str()) !=
        0) {
      return absl::InternalError("gnuplot failed (see its message above)");
    }
    return png.string();
  }
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0) {
    const fs::path script = dir / "chart.py";
    std::ofstream py(script);
    py << "import shlex, matplotlib\nmatplotlib.use('Agg')\n"
       << "import matplotlib.pyplot as plt\nrows = []\n"
       << "for line in open('" << dat.string() << "'):\n"
       << "    i, label, v, k = shlex.split(line)\n"
       << "    rows.append((label.replace('\\\\n', '\\n'), float(v), "
          "int(k)))\n"
       << "fig, ax = plt.subplots(figsize=(12, 6))\n"
       << "for i, (label, v, k) in enumerate(rows):\n"
       << "    ax.bar(i, v, color='#d62728' if k else '#1f77b4', "
          "hatch='//' if k else None, label=['measured', 'projected (not "
          "measured)'][k])\n"
       << "h, l = ax.get_legend_handles_labels()\n"
       << "d = dict(zip(l, h))\nax.legend(d.values(), d.keys())\n"
       << "ax.set_xticks(range(len(rows)))\n"
       << "ax.set_xticklabels([r[0] for r in rows], rotation=25, "
          "ha='right', fontsize=8)\n"
       << "ax.set_yscale('log')\nax.set_ylabel('samples/s')\n"
       << "fig.tight_layout()\nfig.savefig('" << png.string() << "')\n";
    py.close();
    if (std::system(absl::StrCat("python3 '", script.string(), "'").c_str()) !=
        0) {
      return absl::InternalError("python3-matplotlib failed");
    }
    return png.string();
  }
  return absl::FailedPreconditionError(
      "no chart: neither gnuplot nor python3-matplotlib is installed "
      "(apt-get install gnuplot-nox)");
}

}  // namespace dlrm::bench
