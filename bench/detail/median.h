// The median the bench tools report (the upper middle of an even count). Header-only.
#pragma once

#include <algorithm>
#include <vector>

namespace troupe::bench {

/// The median of `v` (0 for none).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace troupe::bench
