// The Trainer: owns the engine (model, gradients, optimizer on a device), the data loaders and
// the run directory, and runs the step loop (Trainer::run) that reads top to bottom.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/state.h"
#include "core/config.h"
#include "core/rolling.h"
#include "data/loader.h"
#include "model/engine.h"
#include "observe/metrics.h"
#include "runtime/distributed.h"
#include "runtime/heartbeat.h"

namespace myriad {

class Trainer {
 public:
  // Validates the data files against the model, creates RUN_DIR and resumes per
  // checkpoint.resume. Throws input errors for bad data or checkpoints.
  Trainer(const Config& cfg, const std::string& run_dir);
  ~Trainer();

  // Trains from the current step to train.steps, logging, evaluating and checkpointing. Ends
  // early, once the step under way and a save of it have committed, when a preemption signal
  // (core/preemption.h) reached any rank: every rank stops after the same step.
  enum class End { kDone, kPreempted };
  End run();
  // Writes this rank's flight record (runtime/heartbeat.h), as a failing worker does.
  void dump_flight_record() { heartbeat_.dump_flight_record(); }

  // Each validation source's mean loss over train.eval_steps global batches from its start,
  // into `rec`: val_loss/<name> (with more than one source) and val_loss, their mean weighted
  // by the tokens evaluated.
  void evaluate(nlohmann::json& rec);
  void check_loss(float loss);
  // The step's batch, already read, dropped and the step counted: train.skip_steps, or a batch
  // that counts no target (`why` says which).
  void skip_step(const data::Batch& batch, const std::string& why);
  bool eval_due() const;  // train.eval_every (with validation data), and the last step
  bool save_due() const;  // checkpoint.every, and the last step
  void check_replicas();
  // Saves RUN_DIR/checkpoints/step_<step> (or checkpoint.dir) and prunes old ones: in the
  // step only a snapshot of the state (checkpoint.async), the files on the writer's thread.
  void save_checkpoint(bool always = false);  // always: not skipped by checkpoint.async_policy

  int64_t step() const { return step_; }
  Engine& engine() { return *engine_; }

 private:
  void resume_from(const std::string& dir);
  End stop_preempted();
  void init_from(const std::string& path);
  // A fresh run into a checkpoint directory that holds committed checkpoints: an input error.
  void refuse_foreign_checkpoints() const;
  // --resume auto: the newest committed checkpoint that loads on every rank, or a fresh start.
  void resume_latest_good();
  // This rank's rows of the next step's global batch (global_batch / dp, T+1): read, or taken
  // from the node's reader.
  data::Batch next_batch();
  // Ints in one step's batch of this rank: its rows' tokens and, with data.document_mask, their
  // document starts.
  int64_t batch_ints() const;
  // The batch as the model reads it.
  static Rows rows_of(const data::Batch& b);
  // The blend's place after a step's global batch (the loader's, data::Batch::position); logs a
  // source's new epoch, or its cap.
  void take_position(const data::Batch& batch);
  // run()'s parts: the start's log lines; the step under way; the injected faults and checks
  // after the step (returns the injection left for end_step); the step's record and heartbeat;
  // its log line; what the step leaves for the launcher, the trace and injected faults.
  void describe_start();
  void begin_step();
  std::string after_step(StepResult& r);
  nlohmann::json step_record(const StepResult& r, double step_s);
  void log_step(const nlohmann::json& rec, const StepResult& r);
  void end_step(const StepResult& r, const std::string& injected, double step_s);
  // The blend as the run starts: each source's share, tokens and expected epochs.
  void describe_blend() const;
  // Opens a token file and checks it against the model (vocabulary) and the tokenizer.
  std::unique_ptr<data::IndexedDataset> open_data(const std::string& prefix, const char* key);
  std::string checkpoint_root() const;
  void trace_collectives();

  Config cfg_;
  std::string run_dir_;
  std::unique_ptr<Distributed> dist_;  // null in a single-process run
  // To a supervising launcher, from construction on; it reads dist_'s groups' records, so it is
  // declared after dist_ and stops before dist_ goes.
  Heartbeat heartbeat_;
  std::unique_ptr<Engine> engine_;
  // What a checkpoint holds, as components (runtime/state.h) over the state below and the
  // engine's: the step, the parameters, the optimizer, the data position, the RNG, the loss
  // history, the skip list.
  checkpoint::Components state_;
  // data.train's files, in the config's order, and where their blend stands (the samples
  // consumed by completed steps, and each source's); data.valid's files.
  std::vector<std::unique_ptr<data::IndexedDataset>> train_files_, valid_files_;
  std::unique_ptr<data::Blend> blend_;
  std::unique_ptr<data::BatchLoader> loader_;      // null on the members that take shared batches
  std::unique_ptr<data::SharedBatch> shared_;      // the node-shared batch, with tensor parallelism
  std::unique_ptr<MetricsWriter> metrics_;
  RollingWindow step_s_{21};       // the last steps' times, for the heartbeat's allowance
  double allowance_s_ = 0;  // how long the next step may take (the heartbeat's); 0 before the first
  RollingWindow recent_loss_{21};  // the last steps' losses, for fault.spike_factor (checkpointed)
  RollingWindow own_s_{10};        // the last steps' own times (the heartbeat's own_ms)
  double last_end_ = 0;            // when the last step ended (its checks and save included)
  double elapsed_s_ = 0;           // the timed steps' time, for the ETA (the first step warms caches)
  int64_t timed_ = 0;
  bool said_no_target_ = false, said_no_eval_target_ = false;  // a step's, an evaluation's: warned once
  int64_t rows_ = 0;          // sequences of each global batch this rank reads: global_batch / dp
  int64_t step_ = 0;          // optimizer steps completed
  int64_t saved_step_ = -1;   // the step of the last save started (or resumed from)
  std::map<std::string, uint64_t> traced_seq_;  // per group: the last operation traced
  std::string start_id_;      // names this start's partial saves (checkpoint::SaveGroup::id)
  // The copy of the state (every float of shards(true), in order) a save on the CPU writes
  // while training changes the live one; allocated at the first save. A GPU's host copy of its
  // state serves instead: only the next save, which waits for the writer, changes it.
  std::vector<float> snapshot_;
  // The last background write's step and times (trace clock), set by the writer's thread; -1 once traced.
  struct Written {
    int64_t step = -1, t0_us = 0, t1_us = 0;
  } written_;
  void trace_written_save();
  // Declared last: it is destroyed (and stops) first, while the state it writes still exists.
  checkpoint::Writer writer_;
};

}  // namespace myriad
