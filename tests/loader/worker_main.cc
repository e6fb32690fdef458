// tsar_test_worker ARCHIVE [--hold]: a minimal model-server stand-in for the
// sharing tests. Opens the archive, touches every storage byte, prints
// "ok <checksum-ish sum>", and with --hold keeps the mapping until stdin closes.
#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "tsar/archive.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  try {
    const tsar::Archive a = tsar::Archive::open(argv[1]);
    const auto sd = a.state_dict();
    double sum = 0;
    for (const auto& item : sd) sum += item.value().to(at::kDouble).sum().item<double>();
    // Touch every page, including bytes no tensor view reaches.
    const auto* p = static_cast<const volatile uint8_t*>(a.data());
    uint64_t touched = 0;
    for (uint64_t i = 0; i < a.mapped_size(); i += 4096) touched += p[i];
    std::printf("ok %.6g %llu\n", sum, static_cast<unsigned long long>(touched));
    std::fflush(stdout);
    if (argc > 2 && std::strcmp(argv[2], "--hold") == 0) {
      char buf[16];
      while (read(STDIN_FILENO, buf, sizeof buf) > 0) {
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tsar: %s\n", e.what());
    return 3;
  }
  return 0;
}
