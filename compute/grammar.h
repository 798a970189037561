// Constrained decoding: a context-free grammar over bytes (written in GBNF, the grammar notation
// llama.cpp made common) and a matcher that says which tokens of a vocabulary may come next.
// The last pipeline stage masks the logits of the tokens a request's grammar forbids before it
// samples (compute/sampler.h), so a reply is a sentence of the grammar: JSON for a schema
// (serve/json_schema.h), a forced tool call, a user's own grammar.
//
// The notation (`root` is the start rule):
//   name ::= alternative | alternative ...     rules; names are [A-Za-z0-9_-]+
//   "text"  'text'                             literal bytes (UTF-8), escapes \n \r \t \\ \" \'
//                                              \[ \] \- \xHH \uHHHH \UHHHHHHHH
//   [a-z0-9_]  [^"\\]                          a character (code point) class, or its complement
//   .                                          any character
//   ( ... )                                    a group
//   x*  x+  x?  x{n}  x{n,}  x{n,m}            repetition
//   # ...                                      a comment to the end of the line
// A rule goes on over newlines until the next `name ::=`. Characters are matched as their UTF-8
// bytes; classes and `.` match only well-formed UTF-8 (no surrogates, nothing above U+10FFFF).
// Left recursion (a rule that can reach itself without consuming a byte) is refused when the
// grammar compiles, with the rule's name: the matcher needs every step to consume.
//
// Grammar is immutable once compiled and shared by every request that uses it. GrammarMatcher
// is one request's state; not thread-safe (one owner).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/result.h"

namespace troupe::model {
class Tokenizer;
}

namespace troupe::compute {

struct GrammarLimits {
  size_t max_source_bytes = 1 << 20;  // the grammar's text
  size_t max_elements = 1 << 20;      // compiled symbols (repetitions expand into copies)
  int64_t max_repeat = 4096;          // n and m of x{n,m}
  size_t max_heads = 4096;            // parse stacks alive at once (an ambiguous grammar's cost)
  size_t max_walk_states = 1 << 17;   // parse states one mask may make (GrammarDfa)
  size_t max_walk_work = 1 << 24;     // stacks one mask may move by a byte (~0.5 s of work)
};

class Grammar {
 public:
  /// Compiles GBNF text. Errors name the line and what is wrong: a syntax error, an undefined
  /// rule, no `root`, left recursion, a limit passed.
  static Result<std::shared_ptr<const Grammar>> compile(std::string_view source,
                                                        GrammarLimits limits = {});

  const GrammarLimits& limits() const { return limits_; }
  size_t num_rules() const { return rules_.size(); }
  size_t num_elements() const { return elems_.size(); }

  // ---- compiled form (for the matcher) ----
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  struct Elem {
    Kind kind = Kind::kEnd;
    int32_t arg = 0;  // kBytes: index into byte_sets(); kRule: rule index
  };
  /// 256 bits: byte b is in the set when (bits[b >> 6] >> (b & 63)) & 1.
  struct ByteSet {
    uint64_t bits[4] = {0, 0, 0, 0};
    bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
    void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
    bool operator==(const ByteSet&) const = default;
  };
  /// Every alternative is a run of elements ending with kEnd; a rule lists its alternatives'
  /// first elements.
  const std::vector<Elem>& elems() const { return elems_; }
  const std::vector<ByteSet>& byte_sets() const { return sets_; }
  const std::vector<int32_t>& alternatives(int32_t rule) const { return rules_[rule]; }
  int32_t root() const { return root_; }

  Grammar() = default;  // use compile()

 private:
  friend class GrammarBuilder;
  GrammarLimits limits_;
  std::vector<Elem> elems_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<int32_t>> rules_;
  std::vector<std::string> names_;
  int32_t root_ = 0;
};

/// A vocabulary as the matcher sees it: each token's bytes (its piece; control tokens have none
/// and are never allowed by a grammar) and which tokens end generation. Sorted for a walk that
/// shares the work of tokens with a common prefix. Immutable; build once per model.
class TokenVocab {
 public:
  /// pieces[i]: token i's bytes ("" for a token that writes none); eog: ids that end generation.
  TokenVocab(std::vector<std::string> pieces, std::vector<int32_t> eog);
  /// From a tokenizer: token_to_piece(i) for every id, its is_eog() ids.
  static std::shared_ptr<const TokenVocab> of(const model::Tokenizer& tok);

  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  bool is_eog(int32_t id) const { return eog_flag_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& eog() const { return eog_; }

  // The walk: tokens with a non-empty piece in byte order; lcp[i] = bytes token order[i] shares
  // with order[i - 1] (0 for i = 0).
  const std::vector<int32_t>& order() const { return order_; }
  const std::vector<uint32_t>& lcp() const { return lcp_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_;
  std::vector<uint8_t> eog_flag_;
  std::vector<int32_t> order_;
  std::vector<uint32_t> lcp_;
};

/// One node of a parse stack: a place in the grammar and the node below it.
struct StackNode {
  int32_t pos;     // index into elems(): a kBytes element awaiting a byte, or a return point
  int32_t parent;  // the node to continue at (its pos + 1) when this alternative ends; -1: root
};

/// The parse states met while masks are built, and their moves byte by byte: a DFA over one
/// grammar's stacks, built as walks need it (equal stacks are one node, equal sets of stacks one
/// state). Walks that share one pay for a move once: the second time through a JSON string costs
/// a table lookup per byte. One owner; not thread-safe. Emptied before a walk once it holds
/// max_states.
class GrammarDfa {
 public:
  explicit GrammarDfa(std::shared_ptr<const Grammar> grammar, size_t max_states = size_t{1} << 18);
  size_t num_states() const { return state_heads_.size(); }
  const std::shared_ptr<const Grammar>& grammar() const { return g_; }

 private:
  friend class GrammarMatcher;
  static constexpr size_t kDense = 4096;  // states with a 256-entry move table (others: a map)
  void clear();
  int32_t add(int32_t pos, int32_t parent);  // the node (pos, parent), made once
  const StackNode& node(int32_t id) const { return nodes_[size_t(id)]; }
  int32_t state(std::vector<int32_t> heads);  // the state of these head nodes, made once
  uint32_t& move(int32_t state, uint8_t byte);

  std::shared_ptr<const Grammar> g_;
  size_t max_states_;
  std::vector<StackNode> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<std::vector<int32_t>> state_heads_;  // sorted head node ids
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<std::unique_ptr<uint32_t[]>> dense_;  // moves of the first kDense states
  std::unordered_map<uint64_t, uint32_t> sparse_;   // moves of the others
  uint64_t work_ = 0;                               // stacks moved to make moves, ever
};

/// Where one request's reply stands in its grammar: the set of parse stacks that the bytes so far
/// leave open. Copyable (a copy is an independent state).
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  /// Consumes bytes if they continue a sentence of the grammar; false (state unchanged) if not,
  /// or if the grammar's max_heads would be passed.
  bool accept_bytes(std::string_view bytes);
  /// Consumes a token: its piece, or, for an end-of-generation token, the end of the reply
  /// (allowed only when can_end()). False (state unchanged) when not allowed.
  bool accept_token(const TokenVocab& vocab, int32_t id);
  /// Whether `id` may come next (accept_token without changing the state).
  bool allows(const TokenVocab& vocab, int32_t id) const;

  /// The bytes so far are a whole sentence of the grammar.
  bool can_end() const { return accepting_; }
  /// Some byte may still follow.
  bool can_continue() const { return !heads_.empty(); }
  /// An end-of-generation token was accepted: nothing more may follow.
  bool ended() const { return ended_; }

  /// allowed[i] = 1 if token i may come next, else 0 (resized to vocab.size()). End-of-generation
  /// tokens are allowed exactly when can_end(). Returns how many are allowed, or -1 when the
  /// walk would pass the grammar's max_walk_states or max_walk_work (the mask is then
  /// unknown). `dfa` (optional, for this grammar): moves shared with other walks.
  int64_t fill_mask(const TokenVocab& vocab, std::vector<uint8_t>* allowed,
                    GrammarDfa* dfa = nullptr) const;

  /// A canonical description of the state (equal for equal states).
  std::string state_key() const;

  // ---- masks shared between states (compute/grammar_sampling.h) ----
  /// Most of a mask depends only on the tops of the parse stacks: a token inside a JSON string
  /// is allowed whatever the string is part of. One stack cut to its top `frames` nodes decides
  /// each token one of three ways: allowed whatever lies below, refused whatever lies below, or
  /// undecided (some way through it pops below the cut). Stacks equal at the top share this, and
  /// a state's mask is the union over its stacks, with the undecided tokens checked on the whole
  /// state (fill_mask_of).
  struct TopMask {
    std::vector<uint8_t> allowed;    // [vocab.size()]: allowed whatever lies below the cut
    std::vector<int32_t> undecided;  // indices into vocab.order(), ascending
    int64_t allowed_count = 0;       // (end-of-generation tokens left out: see can_end())
  };
  size_t num_stacks() const { return heads_.size(); }
  /// Stack i cut to `frames` nodes: what its TopMask is cached by.
  std::string stack_key(size_t i, int frames) const;
  /// False when the walk would pass max_walk_states (as fill_mask's -1).
  bool fill_top_mask(const TokenVocab& vocab, size_t stack, int frames, TopMask* out,
                     GrammarDfa* dfa = nullptr) const;
  /// allowed[id] = 1 for each token of `order_idx` (indices into vocab.order(), ascending) that
  /// this state allows; other entries are left as they are. Returns how many it set, or -1 as
  /// fill_mask does.
  int64_t fill_mask_of(const TokenVocab& vocab, const std::vector<int32_t>& order_idx,
                       std::vector<uint8_t>* allowed, GrammarDfa* dfa = nullptr) const;

  const std::shared_ptr<const Grammar>& grammar() const { return g_; }

 private:
  using Node = StackNode;
  static constexpr int32_t kCut = -2;  // a parent below a stack's cut (fill_top_mask)
  // Adds to `out` the heads reached from (pos, parent) without consuming a byte, making nodes in
  // `arena` (the matcher's own vector, or a GrammarDfa). Sets `cut` when a way pops to kCut (and
  // drops it). False when max_heads would be passed.
  template <class Arena>
  bool closure(int32_t pos, int32_t parent, Arena& arena, std::vector<int32_t>& out,
               bool& accepting, bool& cut) const;
  template <class Arena>
  bool step(Arena& arena, const std::vector<int32_t>& heads_in, uint8_t byte,
            std::vector<int32_t>& heads, bool& accepting, bool& cut) const;
  // dfa's move from `state` on `byte` (made when new): packed as GrammarDfa stores it.
  uint32_t dfa_move(GrammarDfa& dfa, int32_t state, uint8_t byte) const;
  // Walks tokens from the stacks of `heads` (in `nodes`): all of vocab.order(), or `subset` of
  // it (ascending order indices). verdict(order_index, allowed, cut): cut when some way through
  // popped below a cut. False (verdicts incomplete) past max_walk_states.
  template <class Verdict>
  bool walk(const std::vector<Node>& nodes, const std::vector<int32_t>& heads,
            const TokenVocab& vocab, const std::vector<int32_t>* subset, GrammarDfa* dfa,
            Verdict&& verdict) const;
  void compact();

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;     // the stacks' nodes (parents before children)
  std::vector<int32_t> heads_;  // nodes whose pos is a kBytes element
  bool accepting_ = false;
  bool ended_ = false;
};

}  // namespace troupe::compute
