// Next-token sampling for one request (Sampler) and stop-string matching on streamed text
// (StopMatcher). The last pipeline stage owns a Sampler per request; its RNG state travels with
// the request (ARCHITECTURE §3) so a replay draws the same tokens. Not thread-safe: one owner.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace troupe::compute {

/// Per-request sampling settings (OpenAI / vLLM / llama.cpp names). Defaults mean "off".
struct SamplingParams {
  float temperature = 0;         // 0 = greedy (argmax); > 0 scales logits before the draw
  int32_t top_k = 0;             // keep the k most likely tokens; 0 = off
  float top_p = 1;               // keep the smallest most-likely set with mass >= top_p; 1 = off
  float min_p = 0;               // drop tokens with p < min_p * p_max; 0 = off
  float repetition_penalty = 1;  // CTRL / llama.cpp: logit > 0 divided, <= 0 multiplied; 1 = off
  float presence_penalty = 0;    // OpenAI: subtracted once from every token seen; 0 = off
  float frequency_penalty = 0;   // OpenAI: subtracted count times; 0 = off
  int32_t penalty_last_n = 64;   // how many recent history tokens penalties see; -1 = all, 0 = none
  uint64_t seed = 0;             // RNG seed; the router picks one when the client gave none
  std::vector<int32_t> stop_token_ids;    // generation ends after any of these tokens
  std::vector<std::string> stop_strings;  // generation ends before any of these strings
  bool ignore_eos = false;                // if true, the model's EOS tokens do not end generation
  /// GBNF (compute/grammar.h) the reply must be a sentence of; "" = none. The last stage masks
  /// what the grammar forbids before the draw (compute/grammar_sampling.h); the Sampler itself
  /// does not read it.
  std::string grammar;

  /// OK, or an error naming the first bad field and its value: NaN or infinite floats,
  /// temperature < 0, top_k < 0, top_p outside (0, 1], min_p outside [0, 1],
  /// repetition_penalty <= 0, penalty_last_n < -1, a negative stop token id, an empty stop string,
  /// a grammar with ignore_eos (a grammar's reply ends with an end-of-generation token).
  /// Presence and frequency penalties may be any finite value (OpenAI's [-2, 2] is the gateway's).
  Status validate() const;

  /// True if generating token_id ends the request: it is in stop_token_ids, or it is one of
  /// eos_token_ids and ignore_eos is false.
  bool is_stop_token(int32_t token_id, std::span<const int32_t> eos_token_ids) const;
};

/// The whole state of a Sampler's generator (xoshiro256**). Plain data: it travels in messages.
/// All four words zero is the one invalid state.
struct SamplerState {
  uint64_t s[4] = {0, 0, 0, 0};
  bool operator==(const SamplerState&) const = default;
};

/// One surviving token of the final distribution and its probability.
struct TokenProb {
  int32_t token_id = 0;
  double prob = 0;
};

/// Draws the next token from a row of logits. Order of operations (llama.cpp's default chain,
/// minus the samplers troupe lacks; vLLM applies temperature before truncating instead, and
/// counts only generated tokens for presence and frequency):
///   1. NaN logits become -inf: they are never chosen unless every logit is -inf or NaN.
///   2. penalties over the last penalty_last_n history tokens: repetition, then presence and
///      frequency (logit -= count * frequency + (count > 0) * presence).
///   3. temperature == 0: argmax of the penalized logits, ties to the lowest id. Stop here.
///   4. top-k, 5. top-p, 6. min-p: each on softmax(logits) of what survived the step before,
///      so top-p and min-p see the distribution before temperature. top-p keeps the shortest
///      run of most likely tokens whose mass reaches top_p; tokens more than 87 nats below the
///      best have weight 0 and are never in it.
///   7. temperature: survivors' weights are exp((logit - max) / temperature).
///   8. draw: one 64-bit RNG output becomes a double u in [0, 1) (top 53 bits * 2^-53); the
///      chosen token is the first survivor whose cumulative weight exceeds u * total. The order
///      of the survivors is fixed by the logits alone (see distribution()).
/// Where the order of tokens matters (top-k and top-p boundaries), ties in logit go to the lower
/// id. Weights use troupe's own exp (relative error < 1e-6), not libm's, so the same binary
/// draws the same tokens on every node, whatever its libm.
/// If some logits are +inf, only those survive and they are equally likely. If every logit is
/// -inf or NaN, token 0 is returned. Every sample() with temperature > 0 advances the RNG by
/// exactly one step, whatever the logits; greedy calls leave it untouched.
class Sampler {
 public:
  /// REQUIRES: params.validate() is OK (checked: throws InternalError otherwise). The RNG starts
  /// from seeded_state(params.seed).
  explicit Sampler(SamplingParams params);
  /// Validates params first; the way to build a Sampler from request input.
  static Result<Sampler> create(SamplingParams params);

  /// The next token id, in [0, logits.size()).
  /// logits: f32 [vocab] for the position being sampled, vocab >= 1 (checked).
  /// history: prompt + tokens generated so far, oldest first. Ids outside [0, vocab) are not
  /// penalized.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  /// The distribution sample() would draw from (steps 1-7), survivors in draw order; probs sum
  /// to 1. Draw order: by decreasing logit (ties: lower id first) when top-k ran, else by id.
  /// Does not touch the RNG. For tests, debugging and logprobs of the sampled set.
  std::vector<TokenProb> distribution(std::span<const float> logits,
                                      std::span<const int32_t> history);

  /// Step 2 alone, in place: applies the penalties of params() for history to logits.
  void penalize(std::span<float> logits, std::span<const int32_t> history);

  const SamplingParams& params() const { return params_; }

  /// The RNG state to send with the request; set_state() on another Sampler with the same
  /// params continues the same token sequence.
  SamplerState state() const { return rng_; }
  /// Error (nothing changed) if state is all zeros.
  Status set_state(const SamplerState& state);
  /// The state a Sampler starts from for a seed (splitmix64 expansion of the seed).
  static SamplerState seeded_state(uint64_t seed);

 private:
  struct Candidate {
    Candidate() {}  // uninitialized: scratch vectors grow to the vocabulary without a fill
    Candidate(int32_t id_, float logit_, float weight_) : id(id_), logit(logit_), weight(weight_) {}
    int32_t id;
    float logit;
    float weight;  // exp(logit - max) during top-p; exp((logit - max) / temperature) after weigh()
  };

  void prepare(std::span<const float> logits, std::span<const int32_t> history);
  // Steps 4-6: fills cands_ with the survivors in draw order. False if every logit is -inf.
  bool truncate();
  static bool better(const Candidate& a, const Candidate& b);
  static void set_candidate(Candidate& c, size_t id, float logit, float weight);
  void select_top(int64_t k);
  void cut_top_p_sorted();
  void select_nucleus(float max_logit);
  // The worst member of the nucleus among v (one weight bucket), given the mass `base` of the
  // tokens better than all of v. REQUIRES: base + mass(v) >= target. Reorders v.
  static Candidate nucleus_edge(std::vector<Candidate>& v, double base, double target);
  void cut_min_p(float max_logit);
  // Step 7: sets every candidate's weight; returns their sum.
  double weigh();
  uint64_t next_u64();

  SamplingParams params_;
  SamplerState rng_;
  // Scratch reused across calls so steady-state sampling does not allocate.
  std::vector<float> work_;      // f32 [vocab] penalized logits
  std::vector<int32_t> counts_;  // [vocab] occurrences in the penalty window; zero between calls
  std::vector<float> token_weights_;  // f32 [vocab] exp(logit - max), top-p without top-k only
  std::vector<double> bucket_mass_;   // top-p without top-k: mass per logit bucket
  std::vector<Candidate> cands_;
  std::vector<Candidate> boundary_;  // top-p: the tokens of the bucket where the nucleus ends
};

/// Finds stop strings in text that arrives piece by piece (one detokenized token at a time).
/// Text is held back only while it could still be the start of a stop string, and is released as
/// soon as it cannot. Works on bytes: with valid UTF-8 pieces and stops, every emitted piece ends
/// on a character boundary. Empty stop strings are ignored.
class StopMatcher {
 public:
  struct Output {
    std::string text;       // safe to send to the client now
    bool stopped = false;   // a stop string completed; text ends just before it
    int32_t stop_idx = -1;  // which one (index into the constructor's list), when stopped
  };

  explicit StopMatcher(std::vector<std::string> stops);

  /// Appends newly decoded text. If a stop string completes, returns the text before its
  /// earliest occurrence (ties: lowest index) with stopped = true, and ignores all later input.
  Output feed(std::string_view text);
  /// At the end of generation: returns the held-back text (empty once stopped).
  std::string flush();

  bool stopped() const { return stopped_; }

 private:
  size_t held_suffix_len() const;

  std::vector<std::string> stops_;
  std::string pending_;  // held back: a suffix that is a proper prefix of some stop string
  bool stopped_ = false;
  int32_t stop_idx_ = -1;
};

}  // namespace troupe::compute
