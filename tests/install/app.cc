// A user's program built against an installed tsar (find_package(tsar CONFIG)):
// opens an archive given on the command line and prints what it holds.
#include <tsar/tsar.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const tsar::Archive a = tsar::Archive::open(argv[1]);
  std::printf("%zu tensors, first %s, format %u.%u\n", a.names().size(), a.names()[0].c_str(),
              a.format_major(), a.format_minor());
  return 0;
}
