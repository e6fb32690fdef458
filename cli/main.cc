// tsar command line (placeholder until the CLI lands).
#include "tsar/tsar.h"
int main() { return 0; }
