#include "compute/grammar_sampling.h"

#include <algorithm>
#include <limits>

#include "base/check.h"

namespace troupe::compute {

namespace {
constexpr size_t kMaxCompiledGrammars = 64;

Error too_complex(const GrammarMatcher& m) {
  const GrammarLimits& l = m.grammar()->limits();
  return make_error(0, strfmt("the grammar is too ambiguous to mask: one mask needs more than "
                              "%zu parse states or %zu stack moves",
                              l.max_walk_states, l.max_walk_work));
}
}  // namespace

GrammarSampling::GrammarSampling(std::shared_ptr<const TokenVocab> vocab, size_t mask_cache_bytes,
                                 int top_frames)
    : vocab_(std::move(vocab)), mask_cache_bytes_(mask_cache_bytes), top_frames_(top_frames) {
  TROUPE_CHECK(vocab_ != nullptr, "GrammarSampling needs a vocabulary");
}

Result<GrammarSampling::Compiled> GrammarSampling::compiled(const std::string& text) {
  if (auto it = grammars_.find(text); it != grammars_.end()) return it->second;
  auto g = Grammar::compile(text);
  if (!g) return g.error();
  if (grammars_.size() >= kMaxCompiledGrammars) grammars_.clear();  // sequences keep theirs
  Compiled c{*g, next_grammar_id_++, std::make_shared<GrammarDfa>(*g)};
  grammars_.emplace(text, c);
  return c;
}

Result<GrammarSampling::SeqState*> GrammarSampling::state_for(int64_t seq_id,
                                                              const std::string& text,
                                                              std::span<const int32_t> output) {
  SeqState& s = seqs_[seq_id];
  s.last_step = step_;
  bool in_step = s.matcher && s.text == text && s.consumed.size() <= output.size() &&
                 std::equal(s.consumed.begin(), s.consumed.end(), output.begin());
  if (!in_step) {
    auto c = compiled(text);
    if (!c) {
      seqs_.erase(seq_id);
      return c.error();
    }
    s.text = text;
    s.grammar_id = c->id;
    s.dfa = c->dfa;
    s.matcher = std::make_unique<GrammarMatcher>(c->grammar);
    s.consumed.clear();
    s.prepared_allowed = -1;
  }
  for (size_t i = s.consumed.size(); i < output.size(); ++i) {
    if (!s.matcher->accept_token(*vocab_, output[i])) {
      const int32_t t = output[i];
      seqs_.erase(seq_id);
      return make_error(
          0, strfmt("the reply's token %zu (id %d, '%s') does not follow its grammar", i, t,
                    t >= 0 && t < vocab_->size() ? vocab_->piece(t).c_str() : "?"));
    }
    s.consumed.push_back(output[i]);
  }
  return &s;
}

Result<int64_t> GrammarSampling::build_mask(const SeqState& s, std::vector<uint8_t>& out) {
  const GrammarMatcher& m = *s.matcher;
  out.assign(static_cast<size_t>(vocab_->size()), 0);
  // The union of the stacks' top masks (cached); then the tokens some top left undecided and
  // none allowed, checked on the whole state.
  std::vector<int32_t> undecided;
  std::vector<std::string> seen;
  const std::string prefix = std::to_string(s.grammar_id) + ':';
  for (size_t i = 0; i < m.num_stacks(); ++i) {
    std::string key = prefix + m.stack_key(i, top_frames_);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    auto it = masks_.find(key);
    if (it != masks_.end()) {
      ++stats_.mask_hits;
    } else {
      GrammarMatcher::TopMask top;
      if (!m.fill_top_mask(*vocab_, i, top_frames_, &top, s.dfa.get())) return too_complex(m);
      ++stats_.masks_built;
      const size_t bytes = top.allowed.size() + top.undecided.size() * sizeof(int32_t) + key.size();
      if (mask_bytes_ + bytes > mask_cache_bytes_) {
        masks_.clear();  // (the masks of this state already merged stay in `out`)
        mask_bytes_ = 0;
      }
      mask_bytes_ += bytes;
      it = masks_.emplace(std::move(key), std::move(top)).first;
    }
    const GrammarMatcher::TopMask& top = it->second;
    for (size_t t = 0; t < out.size(); ++t) out[t] |= top.allowed[t];
    undecided.insert(undecided.end(), top.undecided.begin(), top.undecided.end());
  }
  std::sort(undecided.begin(), undecided.end());
  undecided.erase(std::unique(undecided.begin(), undecided.end()), undecided.end());
  const auto& order = vocab_->order();
  undecided.erase(std::remove_if(undecided.begin(), undecided.end(),
                                 [&](int32_t oi) { return out[size_t(order[size_t(oi)])] != 0; }),
                  undecided.end());
  stats_.undecided += static_cast<int64_t>(undecided.size());
  if (m.fill_mask_of(*vocab_, undecided, &out, s.dfa.get()) < 0) return too_complex(m);
  if (m.can_end())
    for (int32_t id : vocab_->eog()) out[size_t(id)] = 1;
  int64_t allowed = 0;
  for (uint8_t b : out) allowed += b;
  return allowed;
}

Result<int32_t> GrammarSampling::sample(int64_t seq_id, const SamplingParams& params,
                                        std::span<const int32_t> output, Sampler& sampler,
                                        std::span<const float> logits,
                                        std::span<const int32_t> history) {
  auto st = state_for(seq_id, params.grammar, output);
  if (!st) return st.error();
  SeqState& s = **st;
  if (params.temperature == 0) {
    // The best token of all is the best allowed one when the grammar allows it.
    const int32_t best = sampler.sample(logits, history);
    if (s.matcher->allows(*vocab_, best)) {
      ++stats_.greedy_fast;
      return best;
    }
  }
  int64_t allowed = 0;
  if (s.prepared_allowed >= 0 && s.prepared_at == s.consumed.size()) {
    mask_.swap(s.prepared);
    allowed = s.prepared_allowed;
    ++stats_.prepared;
  } else {
    auto built = build_mask(s, mask_);
    if (!built) return built.error();
    allowed = *built;
  }
  s.prepared_allowed = -1;
  const std::vector<uint8_t>& mask = mask_;
  if (allowed == 0) {
    return make_error(0, strfmt("the grammar allows no token of the vocabulary after the reply's "
                                "%zu tokens",
                                output.size()));
  }
  masked_.assign(logits.begin(), logits.end());
  const float ninf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(masked_.size(), mask.size());
  for (size_t i = 0; i < n; ++i)
    if (!mask[i]) masked_[i] = ninf;
  for (size_t i = n; i < masked_.size(); ++i) masked_[i] = ninf;  // rows past the vocabulary
  const int32_t tok = sampler.sample(masked_, history);
  if (size_t(tok) >= n || !mask[size_t(tok)]) {
    // Every allowed token's logit is -inf or NaN: the draw fell back to token 0.
    return make_error(0, "every token the grammar allows has a logit of -inf or NaN");
  }
  return tok;
}

void GrammarSampling::prepare(int64_t seq_id, const SamplingParams& params,
                              std::span<const int32_t> output) {
  auto st = state_for(seq_id, params.grammar, output);
  if (!st) return;  // sample() says why
  SeqState& s = **st;
  auto built = build_mask(s, s.prepared);
  s.prepared_allowed = built ? *built : -1;
  s.prepared_at = s.consumed.size();
}

void GrammarSampling::end_step(uint64_t idle_steps) {
  ++step_;
  if (step_ % 64 != 0) return;
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    if (step_ - it->second.last_step > idle_steps)
      it = seqs_.erase(it);
    else
      ++it;
  }
}

}  // namespace troupe::compute
