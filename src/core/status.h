// The Status type is part of the public API; see include/klein/status.h.
#pragma once
#include "klein/status.h"
