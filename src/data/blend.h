// A weighted blend of training sources whose proportions are exact over every prefix of the
// sample stream, and whose place (the data position a checkpoint keeps) survives any resume.
//
// Sample k of the stream comes from the source furthest behind its share: the one with the
// largest weight_s x (k - since + 1) - (taken_s - base_s), the lowest index on a tie (as
// Megatron-LM's BlendedDataset builds its index). Every prefix of the stream since `since` then
// holds within one sample of weight_s x its length from each source. The choice depends only on
// the position below, so a resume in any layout continues the same stream.
//
// `since` is where the current balancing began: the run's start, a resume that changed the
// blend (weights, sources, caps), or a source reaching its epoch cap and leaving. From there
// every source counts afresh (base_s = taken_s at since), so an under-weighted source does not
// catch up in a burst.
//
// Within source s, its j-th sample is sample perm_e(j mod n_s) of its own file, epoch e =
// j / n_s, shuffled by the source's own order (data/loader.h's Sampler), seeded as its
// SourceOrder says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace myriad::data {

// How a source's samples are shuffled: by the run's seed itself, as a run of one file always
// was, or by the run's seed mixed with the source's name, so that a blend's sources draw
// unrelated orders. Fixed when the source first enters a run (a lone source at a run's start:
// kRunSeed; every other: kNamed) and kept by every resume, so a source reads the same order
// whether others join it or leave.
enum class SourceOrder { kRunSeed, kNamed };

// Where the blend stands after `consumed` samples of the stream.
struct BlendPosition {
  int64_t consumed = 0;
  int64_t since = 0;
  std::vector<std::string> names;  // the sources, in the config's order
  std::vector<double> weights;     // as configured (normalized when used)
  std::vector<int64_t> epochs;     // each source's cap (0: none)
  std::vector<int64_t> base;       // each source's samples taken by `since`
  std::vector<int64_t> taken;      // each source's samples taken by `consumed`
  // Each source's order; empty in checkpoints from before it was kept (then a lone source's
  // was kRunSeed, a blend's kNamed).
  std::vector<SourceOrder> orders;
  bool operator==(const BlendPosition&) const = default;
};

class Blend {
 public:
  // `samples`: each source's samples (of seq_len + 1 tokens) in its file.
  Blend(const DataSources& sources, std::vector<int64_t> samples);

  // The start of a run: nothing taken.
  void start();
  // A resume: `saved` is the checkpoint's position (sources matched by name). The same blend
  // continues as it was; a changed one starts its balancing afresh at saved.consumed, each
  // source keeping what it took and its order (a new source from 0, kNamed). Returns what
  // changed ("" nothing), for the log.
  std::string resume(const BlendPosition& saved);

  // The loader's walk taken over: the blend as it stands after a batch the loader built from
  // this same blend (Batch::position). One walk per step, the loader's.
  void advance_to(const BlendPosition& after);

  // The source and the within-source sample number of the stream's next sample; advances.
  struct Pick {
    int source = 0;
    int64_t sample = 0;  // within the source: taken_s before this one
  };
  Pick next();

  const BlendPosition& position() const { return pos_; }
  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int s) const { return names_[s]; }
  int64_t samples(int s) const { return samples_[s]; }
  SourceOrder order(int s) const { return pos_.orders[s]; }
  // Epochs of source s consumed so far (fractional).
  double epochs_taken(int s) const { return double(pos_.taken[s]) / double(samples_[s]); }
  // Whether source s is still drawn from (its cap not reached).
  bool active(int s) const { return caps_[s] == 0 || pos_.taken[s] < caps_[s] * samples_[s]; }
  // Its share of the samples from here (0 once it left).
  double share(int s) const { return share_[s]; }
  // The samples the blend holds when every source is capped (sum of cap x samples); -1 when a
  // source has no cap.
  int64_t capacity() const;

 private:
  void reshare();    // the configured weights, normalized over the active sources
  void rebalance();  // the balancing afresh: since = consumed, base = taken; reshare

  std::vector<std::string> names_;
  std::vector<int64_t> samples_, caps_;
  std::vector<double> configured_;  // the config's weights
  std::vector<double> share_;       // normalized over the active sources (0: inactive)
  BlendPosition pos_;
};

}  // namespace myriad::data
