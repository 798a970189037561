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
  if (f_.harmony) return harmony_push(piece, false);
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
  if (f_.harmony) {
    e.rest = harmony_push("", true);
    e.rest.content += h_dropped_;
    e.calls = std::move(h_calls_);
    return e;
  }
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

// ---- harmony (gpt-oss) ----

namespace {
constexpr std::string_view kHarmonyMarkers[] = {"<|start|>",     "<|channel|>", "<|message|>",
                                                "<|constrain|>", "<|end|>",     "<|call|>",
                                                "<|return|>"};

// Whether `s` (starting with '<') may still grow into a harmony marker.
bool marker_prefix(std::string_view s) {
  for (std::string_view m : kHarmonyMarkers)
    if (s.size() < m.size() && m.substr(0, s.size()) == s) return true;
  return false;
}

// The word after `key` in a header (up to a space or '<'); "" when key is absent.
std::string header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return "";
  const size_t b = at + key.size();
  size_t e = b;
  while (e < header.size() && header[e] != ' ' && header[e] != '<') ++e;
  return std::string(header.substr(b, e - b));
}
}  // namespace

void ReplyStream::harmony_emit(std::string_view text, Delta& d) {
  if (h_to_.rfind("functions.", 0) == 0) {
    h_args_ += text;  // a call's arguments: sent whole at the end
  } else if (h_channel_ == "analysis") {
    d.reasoning += text;
  } else {
    d.content += text;  // final, and commentary addressed to no function
  }
}

void ReplyStream::harmony_end_message() {
  if (h_to_.rfind("functions.", 0) == 0) {
    const std::string name = h_to_.substr(10);
    const size_t b = h_args_.find_first_not_of(" \t\r\n");
    const std::string args = b == std::string::npos
                                 ? ""
                                 : h_args_.substr(b, h_args_.find_last_not_of(" \t\r\n") - b + 1);
    const auto parsed = nlohmann::json::parse(args, nullptr, false);
    if (!name.empty() && !parsed.is_discarded() && parsed.is_object())
      h_calls_.push_back({new_tool_call_id(), name, args});
    else
      h_dropped_ += h_args_;  // not a call after all: nothing the model wrote is lost
  }
  h_body_ = false;
  h_channel_.clear();
  h_to_.clear();
  h_args_.clear();
}

ReplyStream::Delta ReplyStream::harmony_push(std::string_view piece, bool at_end) {
  Delta d;
  h_buf_ += piece;
  for (;;) {
    if (!h_body_) {
      // A header: [<|start|>assistant][ to=R]<|channel|>C[ to=R][ <|constrain|>json]<|message|>
      const size_t b = h_buf_.find_first_not_of(" \t\r\n");
      if (b == std::string::npos) {
        if (at_end) h_buf_.clear();
        return d;
      }
      if (h_buf_.compare(b, 2, "<|") != 0 && !(h_buf_.size() - b < 2 && h_buf_[b] == '<')) {
        // No header: a model that writes plain text. It is the final answer.
        h_body_ = true;
        h_channel_ = "final";
        continue;
      }
      const size_t msg = h_buf_.find("<|message|>");
      if (msg == std::string::npos) {
        if (at_end) {  // a header cut short: what it said is content
          d.content += h_buf_;
          h_buf_.clear();
        }
        return d;
      }
      const std::string_view header = std::string_view(h_buf_).substr(0, msg);
      h_channel_ = header_word(header, "<|channel|>");
      h_to_ = header_word(header, "to=");
      h_buf_.erase(0, msg + 11);
      h_body_ = true;
      continue;
    }
    // A body, up to the marker that ends it (or begins the next message).
    size_t end = std::string::npos, len = 0;
    for (std::string_view m :
         {std::string_view("<|end|>"), std::string_view("<|call|>"), std::string_view("<|return|>"),
          std::string_view("<|start|>"), std::string_view("<|channel|>")}) {
      const size_t at = h_buf_.find(m);
      if (at < end) {
        end = at;
        len = m == "<|start|>" || m == "<|channel|>" ? 0 : m.size();  // those begin a header
      }
    }
    if (end == std::string::npos) {
      size_t keep = 0;
      const size_t lt = h_buf_.rfind('<');
      if (!at_end && lt != std::string::npos && marker_prefix(std::string_view(h_buf_).substr(lt)))
        keep = h_buf_.size() - lt;
      harmony_emit(std::string_view(h_buf_).substr(0, h_buf_.size() - keep), d);
      h_buf_.erase(0, h_buf_.size() - keep);
      if (at_end) harmony_end_message();
      return d;
    }
    harmony_emit(std::string_view(h_buf_).substr(0, end), d);
    h_buf_.erase(0, end + len);
    harmony_end_message();
  }
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
