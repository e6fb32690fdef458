// The many-tensors inputs of P1 and P5: one archive and one safetensors file
// holding the same 100,000 small fp32 tensors.
#include <ATen/ops/arange.h>
#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench/benchmarks.h"
#include "bench/models.h"
#include "tsar/writer.h"

namespace tsar::bench {

void GenerateMany(const std::string& dir) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(kManyTensors);
  for (int i = 0; i < kManyTensors; ++i) {
    const auto shape = ManyShape(i);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    tensors.push_back((at::arange(n, at::kFloat) + static_cast<float>(i)).reshape(shape));
  }

  Writer w(dir + "/many.tsar");
  for (int i = 0; i < kManyTensors; ++i)
    w.add(ManyName(i), tensors[static_cast<size_t>(i)], Role::kParameter);
  w.finish();

  // safetensors: u64 LE header size, a JSON header (padded with spaces to a
  // multiple of 8, as the reference writer does), then the data back to back.
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (int i = 0; i < kManyTensors; ++i) {
    const at::Tensor& t = tensors[static_cast<size_t>(i)];
    const uint64_t n = t.nbytes();
    header[ManyName(i)] = {
        {"dtype", "F32"}, {"shape", ManyShape(i)}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int b = 0; b < 8; ++b)
    file[b] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * b)) & 0xff);
  file += text;
  for (const auto& t : tensors) file.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  const std::string path = dir + "/many.safetensors";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, file.data(), file.size()) != static_cast<ssize_t>(file.size()) ||
      close(fd) != 0) {
    Die("cannot write " + path);
  }
}

}  // namespace tsar::bench
