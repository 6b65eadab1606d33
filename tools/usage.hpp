// Command-line usage errors, one format for every sub-command: exit status 2 and
// "error: attn CMD: <what>", as every other bad input (docs/reliability.md). CLI11's own exit
// codes (104-114) and messages (bounds printed from numeric_limits) never reach the user.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace attn::cli {

// Option values as the project reads numbers: decimal only (no 0x10, no 1.5 for an integer, no
// inf or nan), within [lo, hi]; the message names the option, the bounds and the value:
// "--tokens: expected an integer in [1, 65536], got 'abc'". Bounds past 2^32 print as powers of
// two (2^63 - 1), never as 19 or 309 digits.
CLI::Validator in_range(int64_t lo, int64_t hi);
CLI::Validator in_range(int lo, int hi);
CLI::Validator in_range(double lo, double hi);

// Gives every INT, UINT or FLOAT option of `app` and its sub-commands that has no in_range the
// strict check of its whole type (so `--seed -1` is not 2^64 - 1, and `--alibi x` is named).
void check_numbers(CLI::App& app);

// Parses the command line. Returns -1 to go on, 0 after --help, or 2 after printing a usage error:
// unknown options and unexpected arguments are named first (they often explain a missing one).
int parse_command_line(CLI::App& app, int argc, char** argv);

// A bound as the messages print it ("65536", "2^40", "2^63 - 1").
std::string bound_text(long double v);

}  // namespace attn::cli
