// Typo suggestions for the tsar command line (cli/suggest.h).
#include "cli/suggest.h"

#include <algorithm>

namespace tsar::cli {
namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Edit distance that counts a swap of neighbours (--outptu) as one edit.
size_t TypoDistance(const std::string& a, const std::string& b) {
  size_t best = EditDistance(a, b);
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    if (a[i] == a[i + 1]) continue;
    std::string t = a;
    std::swap(t[i], t[i + 1]);
    best = std::min(best, 1 + EditDistance(t, b));
  }
  return best;
}

std::string Joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::string> OptionNames(const CLI::App& sub) {
  std::vector<std::string> names = {"--help", "-h"};
  for (const CLI::Option* o : sub.get_options()) {
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    for (const auto& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// The option a token names: "--output=x" -> "--output", "-ox" -> "-o"; ""
// for tokens that are values (a file, "-", a negative number).
std::string OptionName(const std::string& token) {
  if (token.size() < 2 || token[0] != '-') return "";
  if (token[1] == '-') return token.size() == 2 ? "" : token.substr(0, token.find('='));
  return std::isalpha(static_cast<unsigned char>(token[1])) ? token.substr(0, 2) : "";
}

// Whether the option named `name` on `sub` takes a value (so the next token
// is that value, even when it starts with '-').
bool TakesValue(const CLI::App& sub, const std::string& name, const std::string& token) {
  if (token.find('=') != std::string::npos || (name.size() == 2 && token.size() > 2)) return false;
  for (const CLI::Option* o : sub.get_options()) {
    if (o->check_name(name)) return o->get_type_size() != 0;
  }
  return false;
}

std::string DidYouMean(const std::string& closest) {
  return closest.empty() ? "" : " (did you mean " + closest + "?)";
}

}  // namespace

std::string Closest(const std::string& word, const std::vector<std::string>& candidates) {
  // Edits allowed: none for "-x" (every short option is one edit away), one
  // for "pakc", two for "--verison", three for longer words.
  std::string best;
  size_t best_distance = (word.size() < 4 ? 0 : std::min<size_t>(3, 1 + word.size() / 6)) + 1;
  std::vector<std::string> prefixed;
  for (const auto& c : candidates) {
    const size_t d = TypoDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
    if (word.size() >= 3 && c.compare(0, word.size(), word) == 0) prefixed.push_back(c);
  }
  if (best.empty() && prefixed.size() == 1) best = prefixed.front();
  return best;
}

std::string CheckCommandLine(CLI::App& app, std::vector<std::string>& args) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
  if (!args.empty() && args[0] == "help") {
    if (args.size() == 1) {
      args = {"--help"};
    } else if (std::find(commands.begin(), commands.end(), args[1]) != commands.end()) {
      args = {args[1], "--help"};
    } else {
      const std::string closest = Closest(args[1], commands);
      return "help: unknown command `" + args[1] + "`" +
             (closest.empty() ? "" : " (did you mean `tsar help " + closest + "`?)") +
             "; the commands are " + Joined(commands);
    }
  }
  if (args.empty()) {
    return "a command is required: one of " + Joined(commands) +
           " (see `tsar --help`, or `tsar help COMMAND`)";
  }
  const std::string& first = args[0];
  if (first.size() > 1 && first[0] == '-') {
    const std::string name = OptionName(first);
    const std::vector<std::string> top = {"--help", "-h", "--version"};
    if (!name.empty() && std::find(top.begin(), top.end(), name) == top.end()) {
      return "unknown option " + name + DidYouMean(Closest(name, top)) +
             "; options go after the command: tsar COMMAND [OPTIONS] (see `tsar --help`)";
    }
    return "";
  }
  CLI::App* sub = nullptr;
  for (CLI::App* s : app.get_subcommands({})) {
    if (s->get_name() == first) sub = s;
  }
  if (!sub) {
    const std::string closest = Closest(first, commands);
    return "unknown command `" + first + "`" +
           (closest.empty() ? "" : " (did you mean `tsar " + closest + "`?)") +
           "; the commands are " + Joined(commands) + " (see `tsar --help`)";
  }
  const std::vector<std::string> options = OptionNames(*sub);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    const std::string name = OptionName(args[i]);
    if (name.empty()) continue;
    if (std::find(options.begin(), options.end(), name) == options.end()) {
      return first + ": unknown option " + name + DidYouMean(Closest(name, options)) +
             " (see `tsar " + first + " --help`)";
    }
    if (TakesValue(*sub, name, args[i])) ++i;
  }
  return "";
}

}  // namespace tsar::cli
