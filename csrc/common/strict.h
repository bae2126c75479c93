// Strict mode (FOUNDRY_STRICT=1): every fallback becomes an error.
#pragma once

namespace foundry {
bool strict_mode();
void set_strict_mode(bool strict);
}  // namespace foundry
