// `myriad`: the command line. The only place that turns errors into exit codes (README table).
#include <fcntl.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "cli/args.h"
#include "core/config.h"
#include "core/dir_lock.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/preemption.h"
#include "core/text.h"
#include "core/worker_report.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "driver/hang_report.h"
#include "observe/trace.h"
#include "runtime/generate.h"
#include "optim/optimizer.h"
#include "plan/planner.h"
#include "runtime/engine.h"
#include "runtime/trainer.h"

namespace fs = std::filesystem;
using namespace myriad;

namespace myriad::cli {
int cmd_bench_init(int argc, char** argv);  // bench_init.cc
int cmd_launch(int argc, char** argv);      // launch.cc
int cmd_comm_check(int argc, char** argv);  // launch.cc
int cmd_self_check(int argc, char** argv);  // self_check.cc
}

namespace {

// A failing process under `myriad launch` leaves its launcher the typed record of why
// (MYRIAD_FAULT_RECORD, core/worker_report.h): the driver decides from it, not from the line
// printed beside it.
void write_fault_record(const Error& e) {
  const char* path = std::getenv("MYRIAD_FAULT_RECORD");
  if (!path || !*path) return;
  const char* rank = std::getenv("MYRIAD_RANK");
  write_record(path, encode(fault_of(e, rank && *rank ? std::atoi(rank) : -1)));
}

const char* kUsage = R"(myriad: train GPT-style language models

usage:
  myriad train   --config FILE [--set section.key=value]... [--run-dir DIR] [--resume auto|none|DIR]
  myriad prepare --input FILE [--input FILE]... --tokenizer byte|gpt2|llama3|qwen3|hf:DIR --output PREFIX
                 [--valid-fraction F] [--doc-separator LINE] [--overwrite] [--jobs N] [--per-input]
  myriad sample  --checkpoint DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S] [--logits FILE]
  myriad bench   --config FILE [--set section.key=value]... [--steps N] [--warmup K] [--doc-length L]
  myriad bench-init --ranks N [--store redis|file] [--url URL] [--threads T] [--tp 8] [--pp P] [--timeout S]
  myriad launch --nproc-per-node N [--nnodes M --node-rank R] [--rdzv URL] [--job NAME] [--grace-period S] [--max-restarts N] [--spare] [--node-name NAME] -- COMMAND [ARGS...]
  myriad hang-report RUN_DIR
  myriad trace RUN_DIR [--steps A:B] [--output FILE] [--overwrite]
  myriad report RUN_DIR
  myriad export  --checkpoint DIR --format hf --output OUT [--dtype bf16|fp32] [--max-shard-size 5GB] [--overwrite]
  myriad import  --hf DIR --output CKPT
  myriad verify  CHECKPOINT
  myriad plan    --config MODEL.toml --gpus N --cluster CLUSTER.toml [--batch G] [--layout tp=8,pp=8,v=6,mb=1]
                 [--features megatron|megascale|LIST] [--search]
  myriad help

exit codes: 0 success, 1 internal error, 2 bad input or config (do not retry),
            3 runtime fault (retry), 4 communication fault, 5 numerics fault,
            6 preempted (SIGTERM: saved, resume with --resume auto)
)";

int cmd_train(int argc, char** argv) {
  // A peer that dies closes its sockets: a write to one (Gloo's, the store's) must fail as a
  // communication fault, not kill this worker with SIGPIPE, which read as a fault of its own and
  // blamed the survivor (a restart test saw it on a loaded machine). The launcher gives its
  // workers SIGPIPE's default; a trainer ignores it.
  std::signal(SIGPIPE, SIG_IGN);
  cli::Args args("train", argc, argv, {"config", "set", "run-dir", "resume"});
  std::vector<std::string> sets = args.all("set");
  if (args.has("resume")) sets.push_back("checkpoint.resume=" + args.get("resume"));
  Config cfg = load_config(args.required("config"), sets);
  std::string run_dir = args.get("run-dir");
  if (run_dir.empty()) run_dir = (fs::path("runs") / fs::path(args.get("config")).stem()).string();
  log::info("run directory: ", run_dir);
  // One run per directory (core/dir_lock.h); under myriad launch the launcher holds the lock.
  std::vector<std::unique_ptr<DirLock>> locks;
  if (!std::getenv("MYRIAD_RANK")) locks = lock_run(run_dir, cfg.checkpoint_root(run_dir));
  // From here on, SIGTERM (and fault.preempt_signal) saves before the process ends.
  preemption::install(preemption::signal_number(cfg.fault.preempt_signal), cfg.fault.preempt_grace_s);
  Trainer trainer(cfg, run_dir);
  try {
    if (trainer.run() == Trainer::End::kPreempted) return exit_code(ErrorClass::kPreempted);
  } catch (const Error& e) {
    // A worker that fails exits at once, before the Trainer's teardown: its peers, blocked on
    // it, fail with a communication fault as soon as its sockets close, and a slow teardown
    // (threads joined, buffers freed, on a loaded machine) would let their echoes reach the
    // launcher first and be reported as the cause. Every file it wrote is flushed already.
    std::fprintf(stderr, "myriad: %s: %s\n", class_name(e.cls()), e.what());
    write_fault_record(e);
    trainer.dump_flight_record();  // what its groups did last, for the hang report
    std::fflush(stdout), std::fflush(stderr);
    std::_Exit(exit_code(e.cls()));
  }
  return 0;
}

// Every rank's timeline in one Chrome trace (observe/trace.h), by default RUN_DIR/traces/timeline.json.
int cmd_trace(int argc, char** argv) {
  if (argc < 1 || argv[0][0] == '-')
    throw_input("usage: myriad trace RUN_DIR [--steps A:B] [--output FILE] [--overwrite]");
  const std::string run_dir = argv[0];
  cli::Args args("trace", argc - 1, argv + 1, {"steps", "output"}, {"overwrite"});
  long long first = 0, last = std::numeric_limits<long long>::max();
  if (args.has("steps")) {
    const std::string s = args.get("steps");
    char tail = 0;
    if (std::sscanf(s.c_str(), "%lld:%lld%c", &first, &last, &tail) != 2 || first < 0 || last < first)
      throw_input("trace: --steps must be A:B with 0 <= A <= B, got '", s, "'");
  }
  const std::string out = args.has("output") ? args.get("output") : (fs::path(run_dir) / "traces" / "timeline.json").string();
  const nlohmann::json merged = trace::merge(run_dir, first, last);
  // A file that is there already is replaced only when it is a timeline this command wrote (the
  // default output included), or with --overwrite: --output may name a user's file.
  std::error_code ec;
  if (!args.has("overwrite") && fs::exists(fs::symlink_status(out, ec)) && !trace::is_merged_timeline(out))
    throw_input("trace: ", out, " exists and is not a timeline myriad trace wrote: give another --output, or add "
                "--overwrite to replace it");
  std::ofstream f(out);
  f << merged.dump() << "\n";
  if (!f) throw_input("trace: cannot write ", out, ": choose another --output");
  std::printf("trace: %zu events of %s in %s (open it in https://ui.perfetto.dev or chrome://tracing)\n",
              merged["traceEvents"].size(), run_dir.c_str(), out.c_str());
  return 0;
}

// The heat maps and the page of a traced run (tools/report.py, which plots with matplotlib):
// RUN_DIR/report/{heatmap.png, curves.png, index.html}.
int cmd_report(int argc, char** argv) {
  if (argc != 1) throw_input("usage: myriad report RUN_DIR");
  if (std::error_code ec; !fs::is_directory(argv[0], ec))
    throw_input("report: ", argv[0], " is not a directory: give the run directory a train wrote (its --run-dir)");
  // The script relative to this binary, wherever it was copied with its tree: an installed one
  // (<prefix>/bin/myriad -> <prefix>/share/myriad/tools/report.py, `cmake --install`), else a
  // source tree's build (<source>/build/myriad -> <source>/tools/report.py). MYRIAD_TOOLS wins.
  std::error_code ec;
  const fs::path root = fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path();
  fs::path script = root / "share" / "myriad" / "tools" / "report.py";
  if (!fs::exists(script)) script = root / "tools" / "report.py";
  if (const char* t = std::getenv("MYRIAD_TOOLS"); t && *t) script = fs::path(t) / "report.py";
  if (!fs::exists(script))
    throw_input("report: ", script.string(), " is not there: install myriad (make install PREFIX=DIR), run the "
                "myriad of a source tree's build, or set MYRIAD_TOOLS to the tools/ folder");
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Debian's python3, where scripts/setup.sh installs matplotlib, before one earlier in PATH.
    const char* python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
    ::execlp(python, python, script.c_str(), argv[0], static_cast<char*>(nullptr));
    std::fprintf(stderr, "myriad: runtime fault: report: cannot run python3\n");
    std::_Exit(exit_code(ErrorClass::kRuntime));
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) throw_runtime("report: cannot start python3");
  return WIFEXITED(status) ? WEXITSTATUS(status) : exit_code(ErrorClass::kRuntime);
}

// The signal that asked `myriad prepare` to stop (0: none); set by its handler.
std::atomic<int> g_prepare_stop{0};
void on_prepare_signal(int sig) { g_prepare_stop.store(sig); }

int cmd_prepare(int argc, char** argv) {
  cli::Args args("prepare", argc, argv,
                 {"input", "tokenizer", "output", "valid-fraction", "doc-separator", "jobs"}, {"overwrite", "per-input"});
  data::PrepareOptions opt;
  opt.inputs = args.all("input");
  if (opt.inputs.empty()) throw_input("myriad prepare: --input is required; see myriad help");
  opt.tokenizer = args.get("tokenizer", "byte");
  opt.output_prefix = args.required("output");
  opt.valid_fraction = args.get_double("valid-fraction", 0.0);
  if (opt.valid_fraction < 0 || opt.valid_fraction >= 1)
    throw_input("myriad prepare: --valid-fraction must be in [0, 1), got ", opt.valid_fraction);
  opt.doc_separator = args.get("doc-separator");
  opt.overwrite = args.has("overwrite");
  opt.per_input = args.has("per-input");
  const long long jobs = args.get_int("jobs", 0);
  if (jobs < 0 || jobs > 4096) throw_input("myriad prepare: --jobs must be 0 (one per core) .. 4096, got ", jobs);
  opt.jobs = static_cast<int>(jobs);
  // SIGTERM, SIGINT or SIGHUP stops the prepare at its next document; it removes what it was
  // writing, then ends by the same signal (as the default action would have, less the litter).
  opt.stop = &g_prepare_stop;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::signal(sig, on_prepare_signal);
  data::PrepareStats st;
  try {
    st = data::prepare(opt);
  } catch (const data::Interrupted& e) {
    std::fprintf(stderr, "myriad: %s\n", e.what());
    std::fflush(stderr);
    ::signal(e.signal, SIG_DFL);
    ::raise(e.signal);
    throw;  // the signal is blocked or ignored: an ordinary runtime fault
  }
  for (const auto& split : st.splits)
    log::info("prepare: ", split.prefix, ": ", split.documents, " documents, ", split.tokens, " tokens");
  if (st.splits.size() == 2 && !opt.per_input)  // the fraction asked for is seldom a whole number of documents
    log::info("prepare: ", st.splits[1].documents, " of ", st.documents, " documents to validation (",
              double(st.splits[1].documents) / double(st.documents), "): --valid-fraction ", opt.valid_fraction,
              " rounded to the nearest whole number of documents");
  log::info("prepare: ", st.input_bytes, " input bytes in ", st.seconds, " s (", st.skipped,
            " empty documents skipped)");
  return 0;
}

int cmd_sample(int argc, char** argv) {
  cli::Args args("sample", argc, argv, {"checkpoint", "prompt", "tokens", "temperature", "top-k", "seed", "logits"});
  LoadedModel m = load_for_inference(args.required("checkpoint"));
  auto tok = data::make_tokenizer(m.cfg.data.tokenizer);
  SampleOptions opt;
  opt.tokens = args.get_int("tokens", 200);
  opt.temperature = args.get_double("temperature", 0.8);
  opt.top_k = args.get_int("top-k", 40);
  opt.seed = args.get_int("seed", 0);
  opt.stop = tok->eot();
  if (opt.tokens < 0 || opt.tokens > kMaxSampleTokens)
    throw_input("myriad sample: --tokens must be 0..", kMaxSampleTokens, ", got ", opt.tokens);
  if (opt.top_k < 0) throw_input("myriad sample: --top-k must be 0 or more, got ", opt.top_k);
  if (!(opt.temperature >= 0) || !std::isfinite(opt.temperature))
    throw_input("myriad sample: --temperature must be a finite number >= 0 (0 = greedy), got ",
                args.get("temperature"));
  std::string prompt = args.required("prompt");
  std::vector<int32_t> ids = tok->encode(prompt);
  check_prompt(ids, m.cfg);  // every id before any lookup
  log::info("sample: ", m.dir, ", ", ids.size(), " prompt tokens");
  // For comparing with another implementation: the prompt's ids and the logits after its last
  // token, {"prompt_ids": [...], "logits": [vocab_size floats]}, into a new file, made once the
  // logits are computed (nothing is left behind by a failure).
  if (args.has("logits")) {
    const std::string path = args.get("logits");
    if (int64_t(ids.size()) > m.cfg.model.seq_len)
      throw_input("myriad sample: --logits needs a prompt of 1..", m.cfg.model.seq_len, " tokens, got ", ids.size());
    std::error_code ec;
    if (fs::exists(fs::symlink_status(path, ec))) throw_input("myriad sample: --logits ", path, " exists: give a new file");
    std::vector<float> logits(static_cast<size_t>(m.cfg.padded_vocab()));
    m.engine->last_logits(ids.data(), 1, static_cast<int>(ids.size()), logits.data());
    logits.resize(static_cast<size_t>(m.cfg.model.vocab_size));
    const std::string text = nlohmann::json({{"prompt_ids", ids}, {"logits", logits}}).dump() + "\n";
    // A new file only, made here (O_EXCL: never one that exists, nor through a link).
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
      throw_input("myriad sample: --logits ", path, ": ", errno == EEXIST ? "exists: give a new file" : std::strerror(errno));
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    if (::close(fd) != 0 || !ok) {
      const int err = errno;
      ::unlink(path.c_str());  // the file this command made, half written
      throw_runtime("myriad sample: cannot write --logits ", path, ": ", std::strerror(err));
    }
  }
  // Streamed token by token (the tokenizers decode byte-wise, so the pieces add up to the
  // whole), so a long sample shows progress and stops at end-of-text.
  std::cout << prompt << std::flush;
  opt.on_token = [&](int32_t t) { std::cout << tok->decode({t}) << std::flush; };
  generate(*m.engine, m.cfg, ids, opt);
  std::cout << std::endl;
  return 0;
}

// A size as transformers' max_shard_size reads it: "5GB", "500MB", "64KB" (powers of 1000),
// "2GiB" (of 1024), or bytes; units in any case, and, as there, a lowercase final "b" of
// GB/MB/KB counts bits ("5Gb" and "5gb" are 625 MB). The bytes.
int64_t parse_size(const std::string& flag, const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  std::string unit = text.substr(digits);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::map<std::string, double> units = {{"", 1},      {"B", 1},        {"KB", 1e3},          {"MB", 1e6},
                                               {"GB", 1e9}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  double value = 0;
  try {
    size_t used = 0;
    value = digits > 0 ? std::stod(text.substr(0, digits), &used) : -1;
    if (used != digits) value = -1;
  } catch (const std::exception&) {
    value = -1;
  }
  const bool bits = unit.size() == 2 && unit != "B" && text.back() == 'b';
  const double bytes = units.count(unit) ? value * units.at(unit) / (bits ? 8 : 1) : -1;
  if (value <= 0 || !units.count(unit) || bytes > 1e18)
    throw_input(flag, " ", text, " is not a size such as 5GB, 500MB or 2GiB");
  if (bits) log::info(flag, " ", text, " is ", int64_t(bytes), " bytes: a lowercase b counts bits, as transformers reads it");
  return static_cast<int64_t>(bytes);
}

// A checkpoint's model as a Hugging Face GPT-2 or Llama directory (checkpoint/hf.h).
int cmd_export(int argc, char** argv) {
  cli::Args args("export", argc, argv, {"checkpoint", "format", "output", "dtype", "max-shard-size"}, {"overwrite"});
  if (const std::string f = args.get("format", "hf"); f != "hf")
    throw_input("export: --format ", f, " is not known: the one format is hf (Hugging Face GPT-2 or Llama, safetensors)");
  checkpoint::ExportOptions opt;
  opt.dtype = args.get("dtype", "");
  if (args.has("dtype") && opt.dtype != "bf16" && opt.dtype != "fp32")
    throw_input("export: --dtype ", opt.dtype, " is not one of: bf16, fp32");
  if (args.has("max-shard-size")) opt.max_shard_bytes = parse_size("export: --max-shard-size", args.get("max-shard-size"));
  opt.overwrite = args.has("overwrite");
  const checkpoint::ReadHold held(args.required("checkpoint"));  // not pruned while it is read
  checkpoint::export_hf(held.dir(), args.required("output"), opt);
  return 0;
}

// A Hugging Face GPT-2 or Llama directory as a committed checkpoint of step 0.
int cmd_import(int argc, char** argv) {
  cli::Args args("import", argc, argv, {"hf", "output"});
  // import_hf refuses an --output that exists, judged on the path it will write.
  checkpoint::import_hf(args.required("hf"), args.required("output"));
  return 0;
}

// Every piece of a checkpoint against its checksum: exit 0 when sound, 2 (with the damaged file
// and piece named) when not.
int cmd_verify(int argc, char** argv) {
  if (argc != 1) throw_input("usage: myriad verify CHECKPOINT");
  const checkpoint::ReadHold held(argv[0]);
  const std::string& dir = held.dir();
  const int64_t pieces = checkpoint::verify(dir);
  std::printf("verify: %s is sound: meta.json and %lld pieces match their checksums\n", dir.c_str(),
              static_cast<long long>(pieces));
  return 0;
}

// The planner's prediction for a model, a cluster and a layout (plan/planner.h); --search ranks
// the layouts that fit.
int cmd_plan(int argc, char** argv) {
  cli::Args args("plan", argc, argv, {"config", "gpus", "cluster", "batch", "layout", "features"}, {"search"});
  const Config cfg = load_config(args.required("config"), {});
  const plan::Cluster cluster = plan::load_cluster(args.required("cluster"));
  const int64_t gpus = args.get_int("gpus", 1), batch = args.get_int("batch", cfg.train.global_batch);
  if (gpus < 1) throw_input("plan: --gpus must be at least 1");
  if (batch < 1) throw_input("plan: --batch must be a positive number of sequences, got ", batch);
  const plan::Features features = plan::parse_features(args.get("features", "megatron"));
  std::printf("%s on %lld x %s, global batch %lld (%.0f tokens)\n", args.get("config").c_str(),
              static_cast<long long>(gpus), cluster.name.c_str(), static_cast<long long>(batch),
              double(batch) * double(cfg.model.seq_len));
  if (args.has("search")) {
    const auto ranked = plan::search(cfg.model, batch, gpus, cluster, features);
    if (ranked.empty()) throw_input("plan: no layout fits ", gpus, " GPUs of ", cluster.memory_gib, " GiB");
    for (size_t i = 0; i < std::min<size_t>(ranked.size(), 5); ++i)
      std::printf("#%zu %s", i + 1, plan::describe(ranked[i].second, ranked[i].first).c_str());
    return 0;
  }
  const plan::Layout layout = plan::parse_layout(args.get("layout", "tp=1,pp=1"));
  const plan::Prediction p = plan::predict(cfg.model, batch, gpus, cluster, layout, features);
  std::fputs(plan::describe(p, layout).c_str(), stdout);
  std::fflush(stdout);  // the prediction before the error, also through a pipe
  if (!p.fits && p.microbatches == 0) throw_input("plan: ", p.why_not);
  // A layout that does not fit in memory is as impossible as one that does not divide: its
  // prediction is printed for what it shows, and the exit code lets a script tell.
  if (!p.fits) {
    // The recompute modes that keep less than this layout's, in the order they cost more time.
    std::string less;
    bool past = false;
    for (const char* rc : {"none", "norms", "selective", "full"}) {
      if (past) less += std::string(less.empty() ? "" : ", ") + "recompute=" + rc;
      past = past || layout.recompute == rc;
    }
    throw_input("plan: the layout does not fit: ", p.why_not, "; try --search, a larger tp or pp",
                less.empty() ? "" : ", or " + less);
  }
  return 0;
}

// Training steps on fresh random tokens: the model and optimizer of a config, no data files.
// --doc-length L packs each row with documents of L tokens on average (a new one at each
// position with chance 1/L, fresh every step) under data.document_mask.
int cmd_bench(int argc, char** argv) {
  cli::Args args("bench", argc, argv, {"config", "set", "steps", "warmup", "doc-length"});
  Config cfg = load_config(args.required("config"), args.all("set"));
  const int64_t steps = args.get_int("steps", 10), warmup = args.get_int("warmup", 2);
  if (steps < 1) throw_input("bench: --steps ", steps, " must be at least 1 (the steps timed)");
  if (warmup < 0) throw_input("bench: --warmup ", warmup, " must be 0 or more (the untimed steps before them)");
  const int64_t doc_length = args.get_int("doc-length", 0);
  if (doc_length < 0) throw_input("bench: --doc-length ", doc_length, " must be at least 1 (or 0: no documents)");
  if (doc_length > 0) cfg.data.document_mask = true;
  cfg.validate();
  std::unique_ptr<Engine> engine = make_engine(cfg);
  const int64_t G = cfg.train.global_batch, T = cfg.model.seq_len;
  std::vector<int32_t> tokens(G * (T + 1)), doc_starts(doc_length > 0 ? G * (T + 1) : 0);
  std::mt19937 gen(1234);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(cfg.model.vocab_size - 1));
  std::uniform_int_distribution<int64_t> starts(0, std::max<int64_t>(doc_length, 1) - 1);
  std::vector<double> ms;
  // With observe.trace, the steps' spans go where a run's would (their cost is what is measured).
  const fs::path trace_dir = fs::temp_directory_path() / cat("myriad-bench-trace-", ::getpid());
  if (cfg.observe.trace) trace::open(trace_dir.string(), 0, "bench", cfg.observe.trace_every, 0);
  for (int64_t s = 0; s < warmup + steps; ++s) {
    for (auto& t : tokens) t = dist(gen);
    for (int64_t i = 0, start = 0; i < int64_t(doc_starts.size()); ++i) {
      if (i % (T + 1) == 0) start = 0;
      else if (starts(gen) == 0) start = i % (T + 1);
      doc_starts[i] = static_cast<int32_t>(start);
    }
    trace::set_step(s + 1);
    auto t0 = std::chrono::steady_clock::now();
    engine->train_step({tokens.data(), doc_starts.empty() ? nullptr : doc_starts.data()}, s + 1,
                       lr_at(cfg.optim, s, cfg.train.steps));
    double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) ms.push_back(dt);
  }
  if (cfg.observe.trace) {
    trace::close();
    std::error_code ec;
    fs::remove_all(trace_dir, ec);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2], tps = G * T / (median / 1e3);
  nlohmann::json r = {{"impl", "myriad"}, {"device", engine->device()},
                      {"tokens_per_s", tps}, {"step_ms_median", median},
                      {"params", engine->layout().total()},
                      {"model_tflops_per_s", tps * engine->flops_per_token() / 1e12},
                      {"peak_memory_gib", engine->peak_memory() / double(1 << 30)}};
  if (doc_length > 0) r["doc_length"] = doc_length;
  if (engine->peak_flops() > 0) {
    r["mfu"] = tps * engine->flops_per_token() / engine->peak_flops();
    r["peak_tflops_used"] = engine->peak_flops() / 1e12;
  }
  std::cout << r.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> commands = {"train", "prepare", "sample", "bench", "bench-init", "launch", "hang-report", "trace", "report", "export", "import", "verify", "plan", "help"};
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? exit_code(ErrorClass::kInput) : 0;
  }
  const std::string cmd = argv[1];
  try {
    fault::check_injection();
    if (cmd == "train") return cmd_train(argc - 2, argv + 2);
    if (cmd == "prepare") return cmd_prepare(argc - 2, argv + 2);
    if (cmd == "sample") return cmd_sample(argc - 2, argv + 2);
    if (cmd == "bench") return cmd_bench(argc - 2, argv + 2);
    if (cmd == "bench-init") return cli::cmd_bench_init(argc - 2, argv + 2);
    if (cmd == "launch") return cli::cmd_launch(argc - 2, argv + 2);
    if (cmd == "comm-check") return cli::cmd_comm_check(argc - 2, argv + 2);
    if (cmd == "self-check") return cli::cmd_self_check(argc - 2, argv + 2);
    if (cmd == "trace") return cmd_trace(argc - 2, argv + 2);
    if (cmd == "report") return cmd_report(argc - 2, argv + 2);
    if (cmd == "export") return cmd_export(argc - 2, argv + 2);
    if (cmd == "import") return cmd_import(argc - 2, argv + 2);
    if (cmd == "verify") return cmd_verify(argc - 2, argv + 2);
    if (cmd == "plan") return cmd_plan(argc - 2, argv + 2);
    if (cmd == "hang-report") {
      // Matches the flight records a hung job's ranks wrote (driver/hang_report.h).
      if (argc != 3) throw_input("usage: myriad hang-report RUN_DIR");
      std::fputs(driver::write_hang_report(argv[2]).text().c_str(), stdout);
      return 0;
    }
    throw_input("myriad: unknown command '", cmd, "'", did_you_mean(cmd, commands), "; see myriad help");
  } catch (const Error& e) {
    std::fprintf(stderr, "myriad: %s: %s\n", class_name(e.cls()), e.what());
    write_fault_record(e);
    return exit_code(e.cls());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "myriad: runtime fault: out of memory\n");
    write_fault_record(Error(ErrorClass::kRuntime, "out of memory"));
    return exit_code(ErrorClass::kRuntime);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "myriad: internal error: %s\n", e.what());
    write_fault_record(Error(ErrorClass::kInternal, e.what()));
    return exit_code(ErrorClass::kInternal);
  }
}
