// What CPU a benchmark ran on, for its header line: the model name, and the family, model and
// per-core L1d and L2 sizes that tell its microarchitecture apart where a hypervisor names them
// all "AMD EPYC" (docs/benchmarks.md "Engine, session 45": a Zen 4 and a Zen 5 host differ 2x in
// their peaks and in how the kernels' prefetches work).
#pragma once

#include <fstream>
#include <string>

namespace troupe::bench {

/// The value of the first /proc/cpuinfo line starting with `key`, or "" where there is none.
inline std::string cpuinfo_field(const std::string& key) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (line.rfind(key, 0) == 0 && colon != std::string::npos &&
        line.find_first_not_of(" \t", key.size()) == colon)
      return colon + 2 <= line.size() ? line.substr(colon + 2) : std::string();
  }
  return "";
}

/// A cache's size as sysfs gives it for CPU 0 ("32K"), or "?".
inline std::string cache_size(int index) {
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
  std::string s;
  return f >> s ? s : "?";
}

/// "AMD EPYC (family 25, model 17; L1d 32K, L2 1024K per core)"; "unknown" without /proc/cpuinfo.
inline std::string cpu_description() {
  const std::string name = cpuinfo_field("model name");
  if (name.empty()) return "unknown";
  // sysfs index0 is the L1 data cache and index2 the L2 on x86 Linux.
  return name + " (family " + cpuinfo_field("cpu family") + ", model " + cpuinfo_field("model") +
         "; L1d " + cache_size(0) + ", L2 " + cache_size(2) + " per core)";
}

}  // namespace troupe::bench
