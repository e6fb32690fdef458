// Umbrella header of tsar, the tensor archive: #include <tsar/tsar.h>.
#pragma once

#include "tsar/archive.h"
#include "tsar/bind.h"
#include "tsar/device.h"
#include "tsar/dtype.h"
#include "tsar/error.h"
#include "tsar/live.h"
#include "tsar/version.h"
#include "tsar/writer.h"
