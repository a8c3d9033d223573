// worker/engine/zero_load.cc — ShardedParameters' shards loaded (from a checkpoint's reader,
// or from the base weights a previous generation kept), and what a next generation's shards
// need read ahead of it (ReadAheadBaseWeights and its budget).
#include <algorithm>
#include <set>

#include "worker/engine/zero_internal.h"

namespace tidal::engine {

int64_t ShardedParameters::HeldSize(const Flat& flat, bool trainable) const {
  if (options_.stage == 3) return flat.padded / comm_.world_size();
  return trainable ? flat.padded : flat.numel;
}

Status ShardedParameters::Load(const ParameterReader& read, const LoadProgress& progress,
                               KeptBaseWeights* kept) {
  torch::NoGradGuard no_grad;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  // What this rank keeps of each parameter: [begin, end) of its flat buffer, and their sum.
  const int64_t stage = options_.stage;
  auto kept_range = [&](const Flat& flat, bool trainable, size_t k, const ParamSpec& p) {
    const int64_t lo = stage == 3 ? rank * (flat.padded / world) : 0;
    const int64_t hi = lo + HeldSize(flat, trainable);
    return std::pair{std::max(lo, flat.offset[k]), std::min(hi, flat.offset[k] + p.numel())};
  };
  int64_t total = 0, loaded = 0;
  for (size_t b = 0; b < blocks_.size(); ++b)
    for (const Flat* flat : {&blocks_[b]->frozen, &blocks_[b]->trainable})
      for (size_t k = 0; k < flat->param_index.size(); ++k) {
        const auto [begin, end] = kept_range(*flat, flat == &blocks_[b]->trainable, k,
                                             model_.blocks()[b].params[flat->param_index[k]]);
        total += std::max<int64_t>(0, end - begin);
      }
  if (kept && kept->blocks.size() != blocks_.size())
    return Internal("kept base weights of " + std::to_string(kept->blocks.size()) +
                    " blocks for a model of " + std::to_string(blocks_.size()));
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const BlockSpec& spec = model_.blocks()[b];
    // The last generation's copy of this block's frozen flat, where it can serve: same dtype
    // and device (the same job's engine always has them).
    KeptBaseWeights::Block* mine = nullptr;
    if (kept && kept->blocks[b].data.defined() &&
        kept->blocks[b].data.scalar_type() == options_.compute_dtype &&
        kept->blocks[b].data.device() == options_.device)
      mine = &kept->blocks[b];
    bool frozen_adopted = false;
    for (Flat* flat : {&blocks_[b]->frozen, &blocks_[b]->trainable}) {
      const int64_t lo = stage == 3 ? rank * (flat->padded / world) : 0;
      const bool frozen = flat == &blocks_[b]->frozen;
      // The kept block taken over as it is, when it is exactly this rank's new one (or one
      // assembled ahead is: AssembleNextShards).
      bool adopted = false;
      if (frozen && !flat->data.defined()) {
        const int64_t size = HeldSize(*flat, /*trainable=*/false);
        KeptBaseWeights::Segment* whole = nullptr;
        if (kept)
          for (KeptBaseWeights::Segment& s : kept->blocks[b].ahead)
            if (s.lo == lo && s.data.numel() == size &&
                s.data.scalar_type() == options_.compute_dtype &&
                s.data.device() == options_.device)
              whole = &s;
        if (mine && mine->lo == lo && mine->data.numel() == size) {
          flat->data = std::move(mine->data);
          mine->data = torch::Tensor();
          adopted = true;
        } else if (whole) {
          flat->data = std::move(whole->data);
          adopted = true;
        } else {
          flat->data = torch::zeros(
              {size}, torch::TensorOptions().device(options_.device).dtype(options_.compute_dtype));
        }
        frozen_adopted = adopted;
      }
      for (size_t k = 0; k < flat->param_index.size(); ++k) {
        const ParamSpec& p = spec.params[flat->param_index[k]];
        const auto [begin, end] = kept_range(*flat, !frozen, k, p);
        if (begin >= end) continue;
        if (adopted) {
          kept->reused += end - begin;
          loaded += end - begin;
          if (progress) progress(loaded, total);
          continue;
        }
        // [begin, end) in flat elements: what a kept source holds (the last generation's
        // shard, a segment read ahead) is copied, the gaps between them are read.
        std::vector<const KeptBaseWeights::Segment*> sources;
        KeptBaseWeights::Segment last;
        if (frozen && mine && mine->data.defined()) {
          last = {mine->lo, mine->data};
          sources.push_back(&last);
        }
        if (frozen && kept)
          for (const KeptBaseWeights::Segment& ahead : kept->blocks[b].ahead)
            sources.push_back(&ahead);
        for (int64_t at = begin; at < end;) {
          const KeptBaseWeights::Segment* holding = nullptr;
          int64_t gap_end = end;  // where the next source starts, when none holds `at`
          for (const KeptBaseWeights::Segment* src : sources) {
            if (src->lo <= at && at < src->lo + src->data.numel()) {
              holding = src;
              break;
            }
            if (src->lo > at) gap_end = std::min(gap_end, src->lo);
          }
          if (holding) {
            const int64_t to = std::min(end, holding->lo + holding->data.numel());
            flat->data.narrow(0, at - lo, to - at)
                .copy_(holding->data.narrow(0, at - holding->lo, to - at));
            kept->reused += to - at;
            at = to;
            continue;
          }
          auto values = read(p, at - flat->offset[k], gap_end - at);
          if (!values.ok()) return values.status();
          if (values->numel() != gap_end - at)
            return Internal("reader returned " + std::to_string(values->numel()) +
                            " elements for " + p.name + ", expected " +
                            std::to_string(gap_end - at));
          flat->data.narrow(0, at - lo, gap_end - at).copy_(values->reshape({-1}));
          if (kept && frozen) kept->read += gap_end - at;
          at = gap_end;
        }
        loaded += end - begin;
        if (progress) progress(loaded, total);
      }
    }
    if (kept) {  // one block of both at a time, at most
      KeptBaseWeights::Block& old = kept->blocks[b];
      if (old.data.defined() && frozen_adopted) kept->retired.push_back(std::move(old.data));
      old.data = torch::Tensor();
      for (KeptBaseWeights::Segment& s : old.ahead)
        if (frozen_adopted && s.data.defined()) kept->retired.push_back(std::move(s.data));
      old.ahead.clear();
    }
  }
  return OkStatus();
}

namespace {

// [lo, hi) of the frozen flat of `spec` (its frozen parameters in order) that `at` holds,
// within the flat's elements; the flat's size in `numel`.
std::pair<int64_t, int64_t> FrozenHeld(const BlockSpec& spec, ShardPlacement at, int64_t* numel) {
  int64_t n = 0;
  for (const ParamSpec& p : spec.params)
    if (!p.trainable) n += p.numel();
  *numel = n;
  if (at.stage != 3) return {0, n};
  const int64_t slice = (n + at.world_size - 1) / at.world_size;
  return {std::min(n, at.rank * slice), std::min(n, (at.rank + 1) * slice)};
}

}  // namespace

StatusOr<std::vector<std::vector<KeptBaseWeights::Segment>>> ReadAheadBaseWeights(
    const DecoderModel& model, ShardPlacement from, ShardPlacement to, torch::ScalarType dtype,
    const ParameterReader& read, const std::function<bool()>& cancelled, bool* complete) {
  torch::NoGradGuard no_grad;
  if (complete) *complete = false;
  std::vector<std::vector<KeptBaseWeights::Segment>> out(model.blocks().size());
  for (size_t b = 0; b < model.blocks().size(); ++b) {
    const BlockSpec& spec = model.blocks()[b];
    int64_t numel = 0;
    const auto [old_lo, old_hi] = FrozenHeld(spec, from, &numel);
    const auto [new_lo, new_hi] = FrozenHeld(spec, to, &numel);
    // The new range less the old one: a part before it and a part after it.
    for (const auto& [lo, hi] : {std::pair{new_lo, std::min(new_hi, std::max(new_lo, old_lo))},
                                 std::pair{std::max(new_lo, std::min(new_hi, old_hi)), new_hi}}) {
      if (lo >= hi) continue;
      torch::Tensor segment = torch::empty({hi - lo}, torch::TensorOptions().dtype(dtype));
      int64_t offset = 0;
      for (const ParamSpec& p : spec.params) {
        if (p.trainable) continue;
        const int64_t begin = std::max(lo, offset), end = std::min(hi, offset + p.numel());
        if (begin < end) {
          if (cancelled && cancelled()) {  // keep what is read: this segment up to `begin`
            if (begin > lo) out[b].push_back({lo, segment.narrow(0, 0, begin - lo)});
            return out;
          }
          TIDAL_ASSIGN_OR_RETURN(torch::Tensor values, read(p, begin - offset, end - begin));
          if (values.numel() != end - begin)
            return Internal("reader returned " + std::to_string(values.numel()) + " elements for " +
                            p.name + ", expected " + std::to_string(end - begin));
          segment.narrow(0, begin - lo, end - begin).copy_(values.reshape({-1}));
        }
        offset += p.numel();
      }
      out[b].push_back({lo, std::move(segment)});
    }
  }
  if (complete) *complete = true;
  return out;
}

ReadAheadSize SizeOfReadAhead(const DecoderModel& model, ShardPlacement from, ShardPlacement to) {
  ReadAheadSize size;
  for (const BlockSpec& spec : model.blocks()) {
    int64_t numel = 0;
    const auto [old_lo, old_hi] = FrozenHeld(spec, from, &numel);
    const auto [new_lo, new_hi] = FrozenHeld(spec, to, &numel);
    const int64_t shared =
        std::max<int64_t>(0, std::min(old_hi, new_hi) - std::max(old_lo, new_lo));
    size.read += (new_hi - new_lo) - shared;
    if (to.stage == 3) size.assembled += (numel + to.world_size - 1) / to.world_size;
  }
  return size;
}

ReadAheadFit FitReadAhead(ReadAheadSize size, int64_t element_bytes, int64_t budget_bytes) {
  // In elements, so that no product of bytes overflows.
  const int64_t budget = std::max<int64_t>(0, budget_bytes) / std::max<int64_t>(1, element_bytes);
  if (size.read > budget) return ReadAheadFit::kNothing;
  if (size.assembled > 0 && size.read + size.assembled <= budget)
    return ReadAheadFit::kReadAndAssemble;
  return ReadAheadFit::kReadOnly;
}

void AssembleNextShards(const DecoderModel& model, ShardPlacement to,
                        const std::vector<KeptBaseWeights::Segment>& current,
                        std::vector<std::vector<KeptBaseWeights::Segment>>& ahead,
                        const std::function<bool()>& cancelled) {
  torch::NoGradGuard no_grad;
  if (to.stage != 3) return;  // every rank holds the whole base: the kept one is taken over
  for (size_t b = 0; b < model.blocks().size() && b < current.size() && b < ahead.size(); ++b) {
    if (cancelled && cancelled()) return;
    int64_t numel = 0;
    const auto [new_lo, new_hi] = FrozenHeld(model.blocks()[b], to, &numel);
    const int64_t slice = (numel + to.world_size - 1) / to.world_size;
    const int64_t lo = to.rank * slice;
    const KeptBaseWeights::Segment& now = current[b];
    torch::Tensor whole = torch::zeros({slice}, now.data.options());
    std::vector<const KeptBaseWeights::Segment*> sources = {&now};
    for (const KeptBaseWeights::Segment& s : ahead[b]) sources.push_back(&s);
    int64_t filled = 0;
    for (const KeptBaseWeights::Segment* s : sources) {
      const int64_t from = std::max(new_lo, s->lo);
      const int64_t until = std::min(new_hi, s->lo + s->data.numel());
      if (from >= until) continue;
      whole.narrow(0, from - lo, until - from).copy_(s->data.narrow(0, from - s->lo, until - from));
      filled += until - from;
    }
    // Held now and read ahead are disjoint; together they must be the whole new range.
    if (filled != new_hi - new_lo) continue;
    ahead[b].clear();
    ahead[b].push_back({lo, std::move(whole)});
  }
}

std::vector<KeptBaseWeights::Segment> ShardedParameters::FrozenShards() const {
  std::vector<KeptBaseWeights::Segment> out;
  const int64_t world = comm_.world_size(), rank = comm_.rank();
  for (const auto& block : blocks_) {
    const Flat& flat = block->frozen;
    out.push_back({options_.stage == 3 ? rank * (flat.padded / world) : 0, flat.data.detach()});
  }
  return out;
}

KeptBaseWeights ShardedParameters::ReleaseBaseWeights() {
  compression_.reset();  // its exchange stopped: these parameters are not stepped again
  KeptBaseWeights kept;
  for (KeptBaseWeights::Segment& shard : FrozenShards())
    kept.blocks.push_back({shard.lo, std::move(shard.data), {}});
  for (auto& block : blocks_) block->frozen.data = torch::Tensor();
  blocks_.clear();
  return kept;
}

}  // namespace tidal::engine
