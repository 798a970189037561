// Subcommands of the `troupe` command. Each takes its arguments after the command name and
// returns the process exit code; bad input prints one line "troupe <cmd>: <what>" to stderr and
// returns non-zero.
#pragma once

#include <string>
#include <vector>

namespace troupe::cli {

using Args = std::vector<std::string>;

int cmd_generate(const Args& args);
int cmd_eval(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_detokenize(const Args& args);
int cmd_inspect(const Args& args);
int cmd_synth(const Args& args);  // bin/cmd_synth.cc
int cmd_demo(const Args& args);
int cmd_node(const Args& args);  // bin/cmd_node.cc
int cmd_serve(const Args& args);
int cmd_status(const Args& args);

}  // namespace troupe::cli
