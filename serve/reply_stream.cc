// ReplyStream (serve/reply_stream.h): reasoning, content and tool calls of a reply as it arrives.
#include "serve/reply_stream.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace troupe::serve {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The length of the longest tail of `s` that is a proper start of `marker`.
size_t marker_tail(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(marker.size() - 1, s.size()); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

ReplyStream::ReplyStream(ReplyFormat f)
    : f_(f),
      in_reasoning_(f.reasoning && f.starts_in_reasoning),
      seen_start_(!f.reasoning || f.starts_in_reasoning) {}

ReplyStream::Delta ReplyStream::push(std::string_view piece) {
  Delta d;
  std::string text(piece);
  if (!seen_start_) {
    // Does the reply open with <think> (after any whitespace)?
    pending_ += text;
    text.clear();
    const size_t b = pending_.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return d;
    const std::string_view lead = std::string_view(pending_).substr(b);
    if (lead.size() < kOpen.size() && kOpen.substr(0, lead.size()) == lead) return d;
    seen_start_ = true;
    if (lead.substr(0, kOpen.size()) == kOpen) {
      in_reasoning_ = true;
      text = std::string(lead.substr(kOpen.size()));
    } else {
      text = pending_;
    }
    pending_.clear();
  }
  if (in_reasoning_) {
    pending_ += text;
    text.clear();
    if (!reasoning_started_) {  // the reasoning's leading whitespace is not sent
      const size_t b = pending_.find_first_not_of(" \t\r\n");
      if (b == std::string::npos) {
        pending_.clear();
        return d;
      }
      pending_.erase(0, b);
      reasoning_started_ = true;
    }
    const size_t close = pending_.find(kClose);
    if (close == std::string::npos) {
      const size_t keep = marker_tail(pending_, kClose);
      d.reasoning = pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return d;
    }
    d.reasoning = pending_.substr(0, close);
    text = pending_.substr(close + kClose.size());
    pending_.clear();
    in_reasoning_ = false;
    after_reasoning_ = true;
  }
  if (after_reasoning_ && content_.empty()) {  // the content's leading whitespace goes
    const size_t b = text.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return d;
    text.erase(0, b);
  }
  content_ += text;
  if (!f_.forced_function.empty()) return d;  // the reply is one call's arguments: held whole
  size_t safe = streamable_prefix(f_.tools, content_, sent_);
  // With tools, whitespace that may end the text before a call waits for what follows it.
  if (f_.tools != ToolFormat::kNone)
    while (safe > sent_ && is_space(content_[safe - 1])) --safe;
  if (safe > sent_) {
    d.content = content_.substr(sent_, safe - sent_);
    sent_ = safe;
  }
  return d;
}

ReplyStream::End ReplyStream::finish() {
  End e;
  if (!seen_start_ || in_reasoning_) {
    // A reply of only whitespace, a cut "<thi", or reasoning cut before </think>.
    if (in_reasoning_) {
      e.rest.reasoning = pending_;
    } else {
      content_ += pending_;
    }
    pending_.clear();
  }
  if (!f_.forced_function.empty()) {
    // The arguments of the named function; a reply cut short (max_tokens) stays content.
    const auto args = nlohmann::json::parse(content_, nullptr, false);
    if (!args.is_discarded() && args.is_object()) {
      const size_t b = content_.find_first_not_of(" \t\r\n");
      const size_t last = content_.find_last_not_of(" \t\r\n");
      e.calls.push_back({new_tool_call_id(), f_.forced_function, content_.substr(b, last - b + 1)});
      return e;
    }
  }
  const ParsedReply p = parse_tool_calls(f_.tools, content_, f_.param_types.get());
  if (p.calls.empty()) {
    if (sent_ < content_.size()) e.rest.content = content_.substr(sent_);
    return e;
  }
  const size_t start = std::min(streamable_prefix(f_.tools, content_), content_.size());
  if (start > sent_) e.rest.content = content_.substr(sent_, start - sent_);
  while (!e.rest.content.empty() && is_space(e.rest.content.back())) e.rest.content.pop_back();
  e.calls = p.calls;
  return e;
}

ReplyStream::Split ReplyStream::split(ReplyFormat f, std::string_view reply) {
  ReplyStream s(f);
  Split out;
  const Delta d = s.push(reply);
  End e = s.finish();
  out.reasoning = d.reasoning + e.rest.reasoning;
  out.content = d.content + e.rest.content;
  out.calls = std::move(e.calls);
  return out;
}

}  // namespace troupe::serve
