// Sampler and StopMatcher (see sampler.h for the order of operations and the RNG contract).
// Hot path: one pass to copy/penalize, one for the max, then work only on the survivors; top-k
// and top-p select with a bounded heap or nth_element instead of sorting the vocabulary.
#include "compute/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <utility>

#include "base/check.h"
#include "base/rng.h"

namespace troupe::compute {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// TODO: a compute::Errc (STYLE.md "Errors") once the folder has one; 0 = unspecified for now.
constexpr int kBadSamplingParams = 0;
// select_top() keeps a bounded heap up to this k, and uses nth_element over all tokens above it.
constexpr int64_t kMaxHeapK = 4096;

Error bad_param(std::string message) { return make_error(kBadSamplingParams, std::move(message)); }

}  // namespace

// ---- SamplingParams ----

Status SamplingParams::validate() const {
  const std::pair<const char*, float> floats[] = {{"temperature", temperature},
                                                  {"top_p", top_p},
                                                  {"min_p", min_p},
                                                  {"repetition_penalty", repetition_penalty},
                                                  {"presence_penalty", presence_penalty},
                                                  {"frequency_penalty", frequency_penalty}};
  for (const auto& [name, v] : floats)
    if (!std::isfinite(v)) return bad_param(strfmt("%s must be a finite number, got %g", name, v));
  if (temperature < 0)
    return bad_param(strfmt("temperature must be >= 0 (0 = greedy), got %g", temperature));
  if (top_k < 0) return bad_param(strfmt("top_k must be >= 0 (0 = off), got %d", top_k));
  if (!(top_p > 0 && top_p <= 1))
    return bad_param(strfmt("top_p must be in (0, 1] (1 = off), got %g", top_p));
  if (!(min_p >= 0 && min_p <= 1))
    return bad_param(strfmt("min_p must be in [0, 1] (0 = off), got %g", min_p));
  if (!(repetition_penalty > 0))
    return bad_param(
        strfmt("repetition_penalty must be > 0 (1 = off), got %g", repetition_penalty));
  if (penalty_last_n < -1)
    return bad_param(strfmt("penalty_last_n must be >= -1 (-1 = all), got %d", penalty_last_n));
  for (size_t i = 0; i < stop_token_ids.size(); ++i)
    if (stop_token_ids[i] < 0)
      return bad_param(strfmt("stop_token_ids[%zu] must be >= 0, got %d", i, stop_token_ids[i]));
  for (size_t i = 0; i < stop_strings.size(); ++i)
    if (stop_strings[i].empty()) return bad_param(strfmt("stop_strings[%zu] is empty", i));
  if (!grammar.empty() && ignore_eos)
    return bad_param(
        "ignore_eos cannot be used with a grammar: a constrained reply ends with "
        "an end-of-generation token once the grammar is complete");
  return Ok{};
}

bool SamplingParams::is_stop_token(int32_t token_id, std::span<const int32_t> eos_token_ids) const {
  if (std::find(stop_token_ids.begin(), stop_token_ids.end(), token_id) != stop_token_ids.end())
    return true;
  return !ignore_eos &&
         std::find(eos_token_ids.begin(), eos_token_ids.end(), token_id) != eos_token_ids.end();
}

// ---- Sampler: construction and RNG ----

Sampler::Sampler(SamplingParams params) : params_(std::move(params)) {
  Status ok = params_.validate();
  TROUPE_CHECK(ok.has_value(), "Sampler: invalid SamplingParams: %s", ok.error().message.c_str());
  rng_ = seeded_state(params_.seed);
}

Result<Sampler> Sampler::create(SamplingParams params) {
  Status ok = params.validate();
  if (!ok) return ok.error();
  return Sampler(std::move(params));
}

SamplerState Sampler::seeded_state(uint64_t seed) {
  SamplerState st;
  for (uint64_t& w : st.s) w = splitmix64(seed);
  return st;
}

Status Sampler::set_state(const SamplerState& state) {
  if (state.s[0] == 0 && state.s[1] == 0 && state.s[2] == 0 && state.s[3] == 0)
    return bad_param("SamplerState is all zeros (not a valid xoshiro256** state)");
  rng_ = state;
  return Ok{};
}

// xoshiro256** 1.0 (base/rng.h).
uint64_t Sampler::next_u64() { return xoshiro256ss_next(rng_.s); }

// ---- Sampler: steps 1-2 ----

void Sampler::penalize(std::span<float> logits, std::span<const int32_t> history) {
  const SamplingParams& p = params_;
  if (p.penalty_last_n == 0) return;
  if (p.repetition_penalty == 1 && p.presence_penalty == 0 && p.frequency_penalty == 0) return;
  const size_t window = p.penalty_last_n < 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(p.penalty_last_n));
  const std::span<const int32_t> recent = history.last(window);
  const auto vocab = static_cast<int64_t>(logits.size());
  if (counts_.size() < logits.size()) counts_.resize(logits.size(), 0);
  for (int32_t id : recent)
    if (id >= 0 && id < vocab) ++counts_[id];
  // Second pass: each distinct token is penalized once (at its first occurrence) and its count
  // reset, which keeps counts_ all zero between calls without clearing the whole vocabulary.
  for (int32_t id : recent) {
    if (id < 0 || id >= vocab || counts_[id] == 0) continue;
    const int32_t count = counts_[id];
    counts_[id] = 0;
    float& l = logits[id];
    if (p.repetition_penalty != 1) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
  }
}

void Sampler::prepare(std::span<const float> logits, std::span<const int32_t> history) {
  TROUPE_CHECK(!logits.empty(), "Sampler: empty logits row");
  TROUPE_CHECK(logits.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               "Sampler: vocab of %zu does not fit token ids", logits.size());
  work_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) work_[i] = std::isnan(logits[i]) ? -kInf : logits[i];
  penalize(work_, history);
}

// ---- Sampler: steps 3-6 ----

namespace {

int32_t argmax(std::span<const float> v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<int32_t>(best);
}

// Bits of a float mapped to an int32 with the same order (self-inverse). -0 sorts below +0.
inline int32_t order_key(int32_t bits) { return bits ^ ((bits >> 31) & 0x7FFFFFFF); }

// The largest value (REQUIRES: no NaN). Compares integer keys: GCC vectorizes that, but not a
// float max under trapping math.
float max_of(std::span<const float> v) {
  int32_t best = order_key(std::bit_cast<int32_t>(-kInf));
  for (float x : v) {
    const int32_t key = order_key(std::bit_cast<int32_t>(x));
    best = key > best ? key : best;
  }
  return std::bit_cast<float>(order_key(best));
}

// exp(x) for x <= 0 (or -inf): relative error below 3e-7, and 0 below -87. Ours rather than
// libm's so that draws do not depend on the glibc version of the node that replays a request.
// Branch-free with integer masks (GCC will not if-convert float selects under trapping math),
// so loops over the vocabulary vectorize.
inline float exp_nonpos(float x) {
  constexpr uint32_t kMinus87Bits = 0xC2AE0000;  // -87.0f; exp(-87) ~ 1.6e-38 is still normal
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // All ones, unless x < -87 or -inf (or a negative NaN): for x <= 0 the bits grow with -x.
  const uint32_t keep = static_cast<uint32_t>(bits > kMinus87Bits) - 1u;
  const float xc = std::bit_cast<float>((bits & keep) | (kMinus87Bits & ~keep));
  constexpr float kLog2e = 1.44269504f;
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer: n in [-126, 0].
  constexpr float kRound = 12582912.0f;
  const float n = (xc * kLog2e + kRound) - kRound;
  constexpr float kLn2Hi = 0.693359375f;  // exact in 9 bits, so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= 0.35
  // Taylor series to r^6: truncation error < 1e-7 relative on |r| <= 0.35.
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t scale_bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  const float y = p * std::bit_cast<float>(scale_bits);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(y) & keep);
}

// Top-p histogram: tokens bucketed by their distance below the maximum logit, 1/32 nat per
// bucket, with everything at 88 nats or more (weight 0) in the last. The bucket never decreases
// as the logit decreases, so every token of bucket b ranks above every token of bucket b + 1.
constexpr float kBucketsPerNat = 32;
constexpr float kMaxNats = 88;
constexpr size_t kNumBuckets = static_cast<size_t>(kMaxNats * kBucketsPerNat) + 1;

inline size_t logit_bucket(float max_logit, float logit) {
  return static_cast<size_t>(std::min(max_logit - logit, kMaxNats) * kBucketsPerNat);
}

}  // namespace

// Field by field: assigning a whole Candidate built in a register pair stalls on store
// forwarding in the branch-free compaction loops.
inline void Sampler::set_candidate(Candidate& c, size_t id, float logit, float weight) {
  c.id = static_cast<int32_t>(id);
  c.logit = logit;
  c.weight = weight;
}

// Draw order: higher logit first, then lower id. A strict total order, so the sets it selects do
// not depend on the selection algorithm.
bool Sampler::better(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

void Sampler::select_top(int64_t k) {
  const auto by_rank = [](const Candidate& a, const Candidate& b) { return better(a, b); };
  cands_.clear();
  const auto n = static_cast<int32_t>(work_.size());
  if (k <= kMaxHeapK) {
    // Bounded heap whose front is the worst kept candidate. Ids arrive in increasing order, so
    // a new token with a logit equal to the front's is worse and is skipped.
    int32_t i = 0;
    for (; i < n && static_cast<int64_t>(cands_.size()) < k; ++i) {
      if (work_[i] == -kInf) continue;
      cands_.emplace_back(i, work_[i], 0);
      std::push_heap(cands_.begin(), cands_.end(), by_rank);
    }
    float threshold = cands_.empty() ? kInf : cands_.front().logit;
    for (; i < n; ++i) {
      if (work_[i] > threshold) [[unlikely]] {
        std::pop_heap(cands_.begin(), cands_.end(), by_rank);
        cands_.back() = Candidate(i, work_[i], 0);
        std::push_heap(cands_.begin(), cands_.end(), by_rank);
        threshold = cands_.front().logit;
      }
    }
    std::sort_heap(cands_.begin(), cands_.end(), by_rank);
  } else {
    cands_.resize(static_cast<size_t>(n));
    size_t num_cands = 0;  // branch-free compaction
    for (int32_t i = 0; i < n; ++i) {
      set_candidate(cands_[num_cands], i, work_[i], 0);
      num_cands += work_[i] != -kInf;
    }
    cands_.resize(num_cands);
    if (static_cast<int64_t>(cands_.size()) > k) {
      std::nth_element(cands_.begin(), cands_.begin() + k, cands_.end(), by_rank);
      cands_.resize(static_cast<size_t>(k));
    }
    std::sort(cands_.begin(), cands_.end(), by_rank);
  }
}

// REQUIRES: cands_ non-empty and in draw order. Keeps the shortest prefix whose mass reaches
// top_p of the total (all of it if rounding keeps the sum short).
void Sampler::cut_top_p_sorted() {
  const float max_logit = cands_.front().logit;
  double z = 0;
  for (Candidate& c : cands_) z += c.weight = exp_nonpos(c.logit - max_logit);
  const double target = static_cast<double>(params_.top_p) * z;
  double cum = 0;
  for (size_t i = 0; i < cands_.size(); ++i) {
    cum += cands_[i].weight;
    if (cum >= target) {
      cands_.resize(i + 1);
      return;
    }
  }
}

Sampler::Candidate Sampler::nucleus_edge(std::vector<Candidate>& v, double base, double target) {
  const auto by_rank = [](const Candidate& a, const Candidate& b) { return better(a, b); };
  // Weighted quickselect: halve [lo, hi) until it is small, keeping the half where the nucleus
  // ends; `base` is the mass of everything better than v[lo].
  size_t lo = 0, hi = v.size();
  while (hi - lo > 64) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(v.begin() + lo, v.begin() + mid, v.begin() + hi, by_rank);
    double left = 0;
    for (size_t i = lo; i < mid; ++i) left += v[i].weight;
    if (base + left >= target) {
      hi = mid;
    } else {
      base += left;
      lo = mid;
    }
  }
  std::sort(v.begin() + lo, v.begin() + hi, by_rank);
  for (size_t i = lo; i < hi; ++i) {
    base += v[i].weight;
    if (base >= target) return v[i];
  }
  return v[hi - 1];
}

// Top-p over the whole vocabulary without sorting it: a histogram of mass finds the bucket
// where the nucleus ends, a weighted quickselect inside that bucket finds its last token, and a
// final pass collects the nucleus in id order.
void Sampler::select_nucleus(float max_logit) {
  const size_t n = work_.size();
  token_weights_.resize(n);
  for (size_t i = 0; i < n; ++i) token_weights_[i] = exp_nonpos(work_[i] - max_logit);
  bucket_mass_.assign(kNumBuckets, 0.0);
  for (size_t i = 0; i < n; ++i)
    bucket_mass_[logit_bucket(max_logit, work_[i])] += token_weights_[i];
  double z = 0;
  for (double m : bucket_mass_) z += m;
  const double target = static_cast<double>(params_.top_p) * z;
  double base = 0;  // mass of the buckets before `edge_bucket`, summed in the same order as z
  size_t edge_bucket = 0;
  while (edge_bucket < kNumBuckets && base + bucket_mass_[edge_bucket] < target)
    base += bucket_mass_[edge_bucket++];
  // Collect the tokens up to the edge bucket in id order (branch-free: which tokens pass is
  // data-dependent), then the edge bucket's apart. If rounding kept the total short of top_p
  // (edge_bucket == kNumBuckets), every token with weight is kept.
  cands_.resize(n);
  size_t num_cands = 0;
  for (size_t i = 0; i < n; ++i) {
    const float w = token_weights_[i];
    set_candidate(cands_[num_cands], i, work_[i], w);
    num_cands += (w > 0) & (logit_bucket(max_logit, work_[i]) <= edge_bucket);
  }
  cands_.resize(num_cands);
  boundary_.clear();
  for (const Candidate& c : cands_)
    if (logit_bucket(max_logit, c.logit) == edge_bucket) boundary_.push_back(c);
  if (boundary_.empty()) return;
  const Candidate edge = nucleus_edge(boundary_, base, target);
  std::erase_if(cands_, [&](const Candidate& c) { return better(edge, c); });
}

// min-p in log space: p / p_max >= min_p <=> logit - max >= log(min_p). Keeps the order.
void Sampler::cut_min_p(float max_logit) {
  const float log_min_p = std::log(params_.min_p);
  std::erase_if(cands_, [&](const Candidate& c) { return !(c.logit - max_logit >= log_min_p); });
}

bool Sampler::truncate() {
  const SamplingParams& p = params_;
  const float max_logit = max_of(work_);
  if (max_logit == -kInf) return false;
  const auto n = static_cast<int64_t>(work_.size());
  const bool use_top_k = p.top_k > 0 && p.top_k < n;
  const bool use_top_p = p.top_p < 1;
  if (max_logit == kInf) {
    // Only the +inf tokens can have mass; they are equally likely (logit 0 each).
    cands_.clear();
    for (int32_t i = 0; i < n; ++i)
      if (work_[i] == kInf) cands_.push_back({i, 0.0f, 0});
    if (use_top_k && static_cast<int64_t>(cands_.size()) > p.top_k) cands_.resize(p.top_k);
    if (use_top_p) cut_top_p_sorted();
    return true;
  }
  if (use_top_k) {
    select_top(p.top_k);
    if (use_top_p) cut_top_p_sorted();
  } else if (use_top_p) {
    select_nucleus(max_logit);
  } else {
    // No truncation by rank: keep the min-p survivors (or every token above -inf) in id order.
    const float log_min_p = p.min_p > 0 ? std::log(p.min_p) : -kInf;
    cands_.resize(static_cast<size_t>(n));
    size_t num_cands = 0;  // branch-free compaction
    for (int32_t i = 0; i < n; ++i) {
      const float v = work_[i];
      set_candidate(cands_[num_cands], i, v, 0);
      num_cands += (v != -kInf) & (v - max_logit >= log_min_p);
    }
    cands_.resize(num_cands);
    return true;
  }
  if (p.min_p > 0) cut_min_p(max_logit);
  return true;
}

// ---- Sampler: steps 7-8 ----

double Sampler::weigh() {
  float max_logit = -kInf;
  for (const Candidate& c : cands_) max_logit = std::max(max_logit, c.logit);
  const float temperature = params_.temperature;
  for (Candidate& c : cands_) c.weight = exp_nonpos((c.logit - max_logit) / temperature);
  double total = 0;
  for (const Candidate& c : cands_) total += c.weight;
  return total;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  prepare(logits, history);
  if (params_.temperature == 0) return argmax(work_);
  // Drawn before anything can return early: one RNG step per sampled token, always.
  const double u = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  if (!truncate()) return 0;
  const double target = u * weigh();
  double cum = 0;
  size_t last_positive = 0;
  for (size_t i = 0; i < cands_.size(); ++i) {
    if (cands_[i].weight <= 0) continue;
    cum += cands_[i].weight;
    last_positive = i;
    if (cum > target) return cands_[i].id;
  }
  return cands_[last_positive].id;  // u * total rounded up to the total
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits,
                                             std::span<const int32_t> history) {
  prepare(logits, history);
  if (params_.temperature == 0) return {TokenProb{argmax(work_), 1.0}};
  if (!truncate()) return {TokenProb{0, 1.0}};
  const double total = weigh();
  std::vector<TokenProb> out(cands_.size());
  for (size_t i = 0; i < cands_.size(); ++i) out[i] = {cands_[i].id, cands_[i].weight / total};
  return out;
}

// ---- StopMatcher ----

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

size_t StopMatcher::held_suffix_len() const {
  size_t hold = 0;
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    // Longest proper prefix of s that pending_ ends with; only longer ones can beat hold.
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

StopMatcher::Output StopMatcher::feed(std::string_view text) {
  Output out;
  if (stopped_) {
    out.stopped = true;
    out.stop_idx = stop_idx_;
    return out;
  }
  pending_.append(text);
  // pending_ held no complete stop before this call, so any match ends in the new text.
  size_t best_pos = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) continue;
    const size_t pos = pending_.find(stops_[i]);
    if (pos < best_pos) {
      best_pos = pos;
      stop_idx_ = static_cast<int32_t>(i);
    }
  }
  if (best_pos != std::string::npos) {
    out.text = pending_.substr(0, best_pos);
    out.stopped = stopped_ = true;
    out.stop_idx = stop_idx_;
    pending_.clear();
    return out;
  }
  const size_t emit = pending_.size() - held_suffix_len();
  out.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace troupe::compute
