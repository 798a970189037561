// The `troupe` command: dispatches to subcommands; turns CliError into a one-line message.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "bin/args.h"
#include "bin/commands.h"

namespace {

constexpr const char* kUsage =
    "troupe: serve large language models across a cluster\n"
    "\n"
    "usage: troupe <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate    generate text from a prompt (GGUF file or Hugging Face directory)\n"
    "  eval        teacher-forced evaluation: write the logits of every position\n"
    "  tokenize    print the token ids of a text\n"
    "  detokenize  print the text of token ids\n"
    "  inspect     describe a model file: architecture, shapes, tensor types and sizes\n"
    "  synth       write a deterministic random-weight model of any supported architecture\n"
    "  demo        synthesize the built-in demo model and generate from it\n"
    "  serve       run the head node of a cluster (controller, router, scheduler)\n"
    "  node        run a node daemon of a cluster\n"
    "  status      print a running cluster's membership, placement and start-up phases\n"
    "\n"
    "run 'troupe <command> --help' for a command's options\n";

struct Command {
  const char* name;
  int (*fn)(const troupe::cli::Args&);
};

constexpr Command kCommands[] = {
    {"generate", troupe::cli::cmd_generate}, {"eval", troupe::cli::cmd_eval},
    {"tokenize", troupe::cli::cmd_tokenize}, {"detokenize", troupe::cli::cmd_detokenize},
    {"inspect", troupe::cli::cmd_inspect},   {"synth", troupe::cli::cmd_synth},
    {"demo", troupe::cli::cmd_demo},         {"serve", troupe::cli::cmd_serve},
    {"node", troupe::cli::cmd_node},         {"status", troupe::cli::cmd_status},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  troupe::cli::Args args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.fn(args);
    } catch (const troupe::cli::CliError& e) {
      std::fprintf(stderr, "troupe %s: %s\n", c.name, e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe %s: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "troupe: unknown command '%s' (run 'troupe --help')\n", name.c_str());
  return 2;
}
