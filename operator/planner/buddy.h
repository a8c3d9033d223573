// operator/planner/buddy.h — buddy copies (DESIGN.md §4 step 5) as pure functions: which rank
// keeps a copy of which rank's state (a ring that crosses nodes), and, after a loss, from which
// survivor's memory each rank of the lost generation is read, at which step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tidal::planner {

// For each rank (`nodes[r]`: rank r's node, "" when not known), the rank whose part of the state
// it keeps a copy of: its ward. Every rank is exactly one rank's ward, and a copy is on another
// node than its original whenever no node holds more than half the ranks (ranks on unknown
// nodes count as each on a node of its own). One rank: its own ward (no copies).
std::vector<int> BuddyWards(const std::vector<std::string>& nodes);

// One part of state a worker holds in memory (worker.proto HeldPart).
struct HeldPartView {
  int64_t generation = 0;
  int rank = 0, world_size = 0;
  int64_t step = 0;
  bool operator==(const HeldPartView&) const = default;
};

// A survivor of the lost generation: its name, its rank there, and what it holds.
struct Holder {
  std::string name;
  int rank = 0;
  std::vector<HeldPartView> held;
};

struct BuddyRecovery {
  int64_t step = 0;                  // 0: no step has every part held
  std::vector<std::string> sources;  // per rank of the lost generation: who holds its part
  std::vector<int> missing;          // with step 0: the ranks held by no survivor at any step
};

// The newest step at which every rank of `generation` (of `world_size` ranks) has its part held
// by some holder, and for each rank the holder to read it from (the rank itself when it
// survived, else a copy). Step 0 when there is none: `missing` names the ranks whose part
// no survivor holds at the newest step a survivor holds anything (those lost with their buddy).
BuddyRecovery PlanBuddyRecovery(int64_t generation, int world_size,
                                const std::vector<Holder>& holders);

}  // namespace tidal::planner
