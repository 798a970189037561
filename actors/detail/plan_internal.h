// Private to actors/plan.cc (resolving and validating a plan) and actors/plan_parse.cc (reading
// it from TOML): the exception both throw (PlanError), the integer bounds the parser checks with a
// line and resolve_plan checks again for plans built in code, and the message helpers they share.
// Runs on the caller's thread; no shared state.
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "actors/plan.h"
#include "base/check.h"
#include "base/result.h"

namespace troupe::actors::detail::plan_internal {

/// Thrown inside actors/plan*.cc only; the public functions turn it into an Error.
class PlanError : public InputError {
 public:
  PlanError(PlanErrc code, const std::string& message) : InputError(message), code_(code) {}
  PlanErrc code() const { return code_; }

 private:
  PlanErrc code_;
};

/// Inclusive limits of an integer setting; shared by the parser (which names the line) and
/// resolve_plan (which judges plans built in code).
struct Bound {
  int64_t min, max;
};
inline constexpr int64_t kHuge = int64_t{1} << 20;  // above this, messages say ">= min" only
inline constexpr Bound kStageCount{1, 4096};
inline constexpr Bound kShardCount{0, 4096};
inline constexpr Bound kThreads{1, 1024};
inline constexpr Bound kBlockSize{1, 4096};
inline constexpr Bound kKvBlocks{1, int64_t{1} << 40};
inline constexpr Bound kLayerIdx{0, int64_t{1} << 24};
inline constexpr Bound kExpertId{0, INT32_MAX};
inline constexpr Bound kHeartbeatMs{10, 600000};
inline constexpr Bound kLeaseMs{20, 3600000};
inline constexpr Bound kReplaceWaitMs{0, 86400000};
inline constexpr Bound kMemoryLimitMb{0, int64_t{1} << 40};
inline constexpr Bound kImageCacheMb{0, int64_t{1} << 30};

struct SchedField {
  const char* name;
  int64_t SchedulerConfig::*field;
  Bound bound;
};
inline constexpr SchedField kSchedFields[] = {
    {"max_tokens_per_step", &SchedulerConfig::max_tokens_per_step, {1, int64_t{1} << 24}},
    {"max_sequences", &SchedulerConfig::max_sequences, {1, kHuge}},
    {"max_queue", &SchedulerConfig::max_queue, {0, int64_t{1} << 30}},
    {"microbatches", &SchedulerConfig::microbatches, {1, 1024}},
    {"max_model_len", &SchedulerConfig::max_model_len, {1, int64_t{1} << 24}},
};

inline std::string where(const std::string& source, int64_t line) {
  return line > 0 ? source + ":" + std::to_string(line) : source;
}

inline std::string expect_text(Bound b) {
  if (b.max >= kHuge) return "an integer >= " + std::to_string(b.min);
  return "an integer in [" + std::to_string(b.min) + ", " + std::to_string(b.max) + "]";
}

inline std::string plural(int64_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

inline Error to_error(const PlanError& e) {
  return make_error(static_cast<int>(e.code()), e.what());
}

}  // namespace troupe::actors::detail::plan_internal
