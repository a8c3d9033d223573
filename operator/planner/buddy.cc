// operator/planner/buddy.cc
#include "operator/planner/buddy.h"

#include <algorithm>
#include <map>

namespace tidal::planner {

std::vector<int> BuddyWards(const std::vector<std::string>& nodes) {
  const int n = static_cast<int>(nodes.size());
  // The ranks grouped by node (nodes in order of first appearance, ranks in order within
  // each; an unknown node is a group of its own), and the largest group's size.
  std::vector<std::vector<int>> groups;
  std::map<std::string, size_t> index;
  for (int r = 0; r < n; ++r) {
    if (nodes[r].empty()) {
      groups.push_back({r});
      continue;
    }
    auto [it, added] = index.emplace(nodes[r], groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(r);
  }
  std::vector<int> order;
  size_t largest = 0;
  for (const auto& g : groups) {
    order.insert(order.end(), g.begin(), g.end());
    largest = std::max(largest, g.size());
  }
  // Rank order[i]'s copy goes `shift` places on. With every group at most `shift` long and
  // `shift` at most n/2, both ways round the ring two ranks of one group are nearer than that.
  const int shift = std::max(1, std::min(static_cast<int>(largest), n / 2));
  std::vector<int> ward(n);
  for (int i = 0; i < n; ++i) ward[order[(i + shift) % n]] = order[i];
  return ward;
}

BuddyRecovery PlanBuddyRecovery(int64_t generation, int world_size,
                                const std::vector<Holder>& holders) {
  BuddyRecovery out;
  if (world_size < 1) return out;
  // step → rank → holders (the rank itself first)
  std::map<int64_t, std::vector<std::vector<const Holder*>>, std::greater<>> by_step;
  for (const Holder& h : holders)
    for (const HeldPartView& p : h.held) {
      if (p.generation != generation || p.world_size != world_size || p.rank < 0 ||
          p.rank >= world_size || p.step < 1)
        continue;
      auto& ranks = by_step[p.step];
      ranks.resize(world_size);
      auto& who = ranks[p.rank];
      if (std::find(who.begin(), who.end(), &h) != who.end()) continue;
      if (h.rank == p.rank)
        who.insert(who.begin(), &h);
      else
        who.push_back(&h);
    }
  for (const auto& [step, ranks] : by_step) {
    if (std::all_of(ranks.begin(), ranks.end(), [](const auto& who) { return !who.empty(); })) {
      out.step = step;
      for (const auto& who : ranks) out.sources.push_back(who.front()->name);
      return out;
    }
  }
  if (!by_step.empty()) {
    const auto& newest = by_step.begin()->second;
    for (int r = 0; r < world_size; ++r)
      if (newest[r].empty()) out.missing.push_back(r);
  }
  return out;
}

}  // namespace tidal::planner
