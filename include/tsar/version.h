// Versions of the tsar library and of the file format it reads and writes.
#pragma once

#define TSAR_VERSION_STRING "0.1.0"
#define TSAR_FORMAT_MAJOR 1
#define TSAR_FORMAT_MINOR 5
