// The subcommands of `tsar`: each registers itself on the CLI11 app and
// returns the function that runs it once parsing succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tsar::cli {

using Run = std::function<int()>;

Run AddPack(CLI::App& app);
Run AddInspect(CLI::App& app);
Run AddVerify(CLI::App& app);
Run AddExport(CLI::App& app);
Run AddDiff(CLI::App& app);
Run AddResidency(CLI::App& app);

}  // namespace tsar::cli
