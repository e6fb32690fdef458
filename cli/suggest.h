// Help for typos on the command line: `tsar inspec`, `tsar --verison` and
// `tsar pack --outptu` are named with the closest real command or option
// ("did you mean ...?") before CLI11 parses anything, since CLI11 would
// report something else first ("A subcommand is required", "--output is
// required") and hide the typo. Also turns `tsar help [COMMAND]` into
// `tsar [COMMAND] --help`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tsar::cli {

// The candidate closest to `word` when it is close enough to be a typo of it
// (a few edits for its length, or `word` is a prefix of exactly one), else "".
std::string Closest(const std::string& word, const std::vector<std::string>& candidates);

// Checks `args` (argv without the program name) against the subcommands and
// options registered on `app`. Returns "" when nothing is unknown, else the
// one-line usage error to print. Rewrites `help [COMMAND]` in `args`.
std::string CheckCommandLine(CLI::App& app, std::vector<std::string>& args);

}  // namespace tsar::cli
