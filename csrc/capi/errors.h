// The C boundary's error channel: a status code returned, a message kept per calling thread.
#pragma once

#include "common/status.h"

namespace foundry {

void set_last_error(const Status& s);
// Records the message when s is an error and returns its code (FOUNDRY_OK otherwise).
foundry_status report(const Status& s);

}  // namespace foundry
