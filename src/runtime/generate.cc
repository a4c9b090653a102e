#include "runtime/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "checkpoint/state.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "runtime/engine.h"
#include "runtime/state.h"
#ifdef MYRIAD_HAVE_CUDA
#include "model/cuda/device.h"
#endif

namespace fs = std::filesystem;

namespace myriad {

LoadedModel load_for_inference(const std::string& path) {
  const checkpoint::ReadHold held(path);  // not pruned while it is read
  const std::string dir = held.dir();
  nlohmann::json meta = checkpoint::read_meta(dir);
  Config cfg = parse_config(checkpoint::config_of(meta, dir), dir + "/meta.json");
  cfg.parallel = ParallelConfig{};  // sampling runs the whole model in this process, one row
  cfg.train.global_batch = cfg.train.micro_batch = 1;
  // FP8 is a training compute format: sampling computes in bf16 (fp32 on the CPU) on any device.
  cfg.train.precision = "bf16";
  cfg.train.fp8_lm_head = false, cfg.train.fp8_gradients = "e5m2", cfg.train.fp8_fast_accum = false;
  cfg.train.fp8_scaling = "tensor";
#ifdef MYRIAD_HAVE_CUDA
  // Sampling has no device option: with train.device = auto, a model the CUDA kernels cannot
  // run (an imported GPT-2 of head size 32, one trained on CPUs) runs on the CPU instead.
  if (cfg.train.device == "auto" && cuda_available())
    if (const std::string why = cuda_unsupported_model(cfg); !why.empty()) {
      log::info("sample: the GPU cannot run this model (", why, "): sampling on the CPU");
      cfg.train.device = "cpu";
    }
#endif
  std::unique_ptr<Engine> engine = make_engine(cfg);
  checkpoint::load(dir, meta, ParamsState(*engine).shards(/*for_save=*/false));
  engine->state_from_host();
  return {cfg, std::move(engine), dir};
}

void check_prompt(const std::vector<int32_t>& prompt, const Config& cfg) {
  if (prompt.empty()) throw_input("sample: the prompt encodes to no tokens");
  const int64_t V = cfg.model.vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      throw_input("sample: the prompt's token ", i, " is id ", prompt[i], ", outside the model's vocabulary of ", V,
                  " ids (model.vocab_size; data.tokenizer = \"", cfg.data.tokenizer, "\"): this model cannot read it");
}

std::vector<int32_t> generate(Engine& engine, const Config& cfg, std::vector<int32_t> prompt,
                              const SampleOptions& opt) {
  check_prompt(prompt, cfg);
  const int64_t V = cfg.model.vocab_size, Vp = cfg.padded_vocab(), T = cfg.model.seq_len;
  std::vector<float> logits(Vp);
  std::vector<int32_t> out;
  std::vector<int32_t> order(V);
  std::vector<double> probs(V);
  const uint64_t key = rng::key(static_cast<uint64_t>(opt.seed), rng::hash("sample"));
  for (int64_t i = 0; i < opt.tokens; ++i) {
    const int64_t n = std::min<int64_t>(T, prompt.size());
    engine.last_logits(prompt.data() + prompt.size() - n, 1, static_cast<int>(n), logits.data());
    int32_t next;
    if (opt.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = opt.top_k > 0 ? std::min<int64_t>(opt.top_k, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      const double top = logits[order[0]];
      double total = 0;
      for (int64_t j = 0; j < k; ++j) total += probs[j] = std::exp((logits[order[j]] - top) / opt.temperature);
      double u = rng::uniform(key, i) * total;
      int64_t j = 0;
      for (; j + 1 < k && u >= probs[j]; ++j) u -= probs[j];
      next = order[j];
    }
    if (next == opt.stop) break;
    out.push_back(next);
    if (opt.on_token) opt.on_token(next);
    prompt.push_back(next);
  }
  return out;
}

}  // namespace myriad
