// The `troupe` command: dispatches to subcommands.
#include <cstdio>
#include <cstring>
int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: troupe <command> ...\n");
    return 2;
  }
  std::fprintf(stderr, "troupe: unknown command '%s'\n", argv[1]);
  return 2;
}
