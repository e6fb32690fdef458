// tsar_gen_samples DIR: writes every file of samples/ into DIR (spec §8).
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "tests/format/samples_gen.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tsar_gen_samples SAMPLES_DIR\n");
    return 2;
  }
  try {
    for (const auto& f : tsar::testing::GenerateSamples()) {
      const std::string path = std::string(argv[1]) + "/" + f.path;
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(f.bytes.data(), static_cast<std::streamsize>(f.bytes.size()));
      if (!out) throw std::runtime_error("cannot write " + path);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tsar_gen_samples: %s\n", e.what());
    return 1;
  }
  return 0;
}
