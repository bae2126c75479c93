// Small GraphModel node builders shared by the native tests.
#pragma once

#include <cstdint>

#include "graph/model.h"

namespace foundry_test {

inline foundry::Node simple_node(foundry::NodeKind kind) {
  foundry::Node n;
  n.kind = kind;
  return n;
}

inline foundry::Node event_node(foundry::NodeKind kind, uint32_t event) {
  foundry::Node n = simple_node(kind);
  n.event = event;
  return n;
}

inline foundry::Node child_node(uint32_t child) {
  foundry::Node n = simple_node(foundry::NodeKind::kChildGraph);
  n.child = child;
  return n;
}

}  // namespace foundry_test
