// Sampling under a grammar at the last pipeline stage: each constrained sequence's GrammarMatcher
// kept between steps, compiled grammars and token masks cached, and the draw made from the
// logits with every token the grammar forbids at -inf. One owner (the stage's thread).
//
// A sequence's matcher is a function of its grammar and the reply's tokens so far, which every
// step carries (SeqWork::output): it is advanced by the tokens added since the last step, and
// rebuilt from all of them when it is missing (a new stage after a failure) or out of step (a
// step whose outcome was dropped). Nothing about it has to travel or survive a failure.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "compute/grammar.h"
#include "compute/sampler.h"

namespace troupe::compute {

struct GrammarSamplingStats {
  int64_t greedy_fast = 0;  // greedy draws whose unmasked best token the grammar allowed
  int64_t masks_built = 0;  // top masks computed by a walk over the vocabulary
  int64_t mask_hits = 0;    // top masks found in the cache
  int64_t undecided = 0;    // tokens top masks left to the whole state, summed over masks
  int64_t prepared = 0;     // draws whose mask prepare() had built
};

class GrammarSampling {
 public:
  /// mask_cache_bytes: masks kept by (grammar, top of the state: GrammarMatcher::TopMask); the
  /// cache is emptied when it would pass this. top_frames: how many nodes of each parse stack a
  /// cached mask is keyed by.
  explicit GrammarSampling(std::shared_ptr<const TokenVocab> vocab,
                           size_t mask_cache_bytes = size_t{64} << 20, int top_frames = 3);

  /// Draws sequence seq_id's next token: sampler.sample() on `logits` with the tokens that
  /// params.grammar forbids after `output` (the reply's tokens so far) set to -inf. Greedy draws
  /// first try the unmasked best token (the same answer when the grammar allows it).
  /// Errors: the grammar does not compile; `output` holds a token the grammar does not allow;
  /// the grammar allows no token of the vocabulary.
  Result<int32_t> sample(int64_t seq_id, const SamplingParams& params,
                         std::span<const int32_t> output, Sampler& sampler,
                         std::span<const float> logits, std::span<const int32_t> history);

  /// Builds the mask sample() will need for this sequence's next draw, ahead of its logits: the
  /// last stage calls it on a thread of its own while the forward pass runs. Errors are left for
  /// sample() to report. Not concurrently with any other call.
  void prepare(int64_t seq_id, const SamplingParams& params, std::span<const int32_t> output);

  /// Ends a step: sequences no draw has named in the last `idle_steps` steps are forgotten
  /// (finished, or moved to another stage; a later draw rebuilds them).
  void end_step(uint64_t idle_steps = 256);

  const GrammarSamplingStats& stats() const { return stats_; }

 private:
  struct Compiled {
    std::shared_ptr<const Grammar> grammar;
    uint64_t id = 0;
    std::shared_ptr<GrammarDfa> dfa;  // moves shared by every mask built for this grammar
  };
  struct SeqState {
    std::string text;  // the grammar's source
    uint64_t grammar_id = 0;
    std::shared_ptr<GrammarDfa> dfa;
    std::unique_ptr<GrammarMatcher> matcher;
    std::vector<int32_t> consumed;  // the reply's tokens the matcher has taken
    uint64_t last_step = 0;
    std::vector<uint8_t> prepared;  // prepare()'s mask, for the state after consumed.size() tokens
    int64_t prepared_allowed = -1;  // its allowed tokens; -1: none prepared
    size_t prepared_at = 0;
  };
  Result<Compiled> compiled(const std::string& text);
  Result<SeqState*> state_for(int64_t seq_id, const std::string& text,
                              std::span<const int32_t> output);
  // The mask of s's state in `out`: its stacks' top masks (cached) and the undecided tokens
  // checked. Returns how many tokens it allows.
  Result<int64_t> build_mask(const SeqState& s, std::vector<uint8_t>& out);

  std::shared_ptr<const TokenVocab> vocab_;
  size_t mask_cache_bytes_;
  std::unordered_map<std::string, Compiled> grammars_;  // by source
  uint64_t next_grammar_id_ = 1;
  std::unordered_map<int64_t, SeqState> seqs_;
  std::unordered_map<std::string, GrammarMatcher::TopMask> masks_;
  size_t mask_bytes_ = 0;
  int top_frames_;
  uint64_t step_ = 0;
  std::vector<uint8_t> mask_;
  std::vector<float> masked_;
  GrammarSamplingStats stats_;
};

}  // namespace troupe::compute
