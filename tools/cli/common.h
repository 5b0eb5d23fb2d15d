// Shared pieces of the `klein` command-line tool.
#pragma once

#include <string>

#include "core/status.h"

namespace klein::cli {

// Prints "klein: <message>" on stderr and returns the exit code for `s` (never 0).
int fail(const Status& s);

}  // namespace klein::cli
