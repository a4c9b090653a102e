#include "parallel/mappings.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/communicator.h"

namespace myriad::parallel {

int ParallelContext::tp_rank() const { return group_rank(tp); }
int ParallelContext::tp_size() const { return group_size(tp); }
int ParallelContext::pp_rank() const { return group_rank(pp); }
int ParallelContext::pp_size() const { return group_size(pp); }
int ParallelContext::dp_rank() const { return group_rank(dp); }
int ParallelContext::dp_size() const { return group_size(dp); }
int ParallelContext::ep_rank() const { return group_rank(ep); }
int ParallelContext::ep_size() const { return group_size(ep); }
int ParallelContext::cp_rank() const { return group_rank(cp); }
int ParallelContext::cp_size() const { return group_size(cp); }

int group_size(const Communicator* c) { return c ? c->size() : 1; }
int group_rank(const Communicator* c) { return c ? c->rank() : 0; }

namespace {
bool active(const Communicator* c) { return c != nullptr && c->size() > 1; }

void copy(const float* from, float* to, int64_t n) {
  if (from != to) std::memmove(to, from, n * sizeof(float));
}
}  // namespace

void CopyToTp::backward(Communicator* tp, float* grad, int64_t count, Stream s) {
  if (active(tp)) tp->all_reduce(grad, count, s)->wait();
}

void ReduceFromTp::forward(Communicator* tp, float* x, int64_t count, Stream s) {
  if (active(tp)) tp->all_reduce(x, count, s)->wait();
}

void GatherFromSequence::forward(Communicator* tp, const float* local, float* full, int64_t chunk,
                                 Stream s) {
  if (!active(tp)) return copy(local, full, chunk);
  tp->all_gather(local, full, chunk, s)->wait();
}

void GatherFromSequence::backward(Communicator* tp, const float* dfull, float* dlocal,
                                  int64_t chunk, Stream s) {
  if (!active(tp)) return copy(dfull, dlocal, chunk);
  tp->reduce_scatter(dfull, dlocal, chunk, s)->wait();
}

void ReduceScatterToSequence::forward(Communicator* tp, const float* full, float* local,
                                      int64_t chunk, Stream s) {
  GatherFromSequence::backward(tp, full, local, chunk, s);
}

void ReduceScatterToSequence::backward(Communicator* tp, const float* dlocal, float* dfull,
                                       int64_t chunk, Stream s) {
  GatherFromSequence::forward(tp, dlocal, dfull, chunk, s);
}

void sum_over_group(Communicator* c, double* x, int64_t count) {
  if (!active(c) || count == 0) return;
  const int n = c->size(), r = c->rank();
  static_assert(sizeof(double) == 2 * sizeof(float));
  // Each rank's doubles travel exactly, their bytes carried as floats, then are added in rank
  // order: the same bits on every rank.
  std::vector<float> parts(2 * count * n);
  std::memcpy(parts.data() + 2 * count * r, x, count * sizeof(double));
  c->all_gather(parts.data() + 2 * count * r, parts.data(), 2 * count)->wait();
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int q = 0; q < n; ++q) {
      double v;
      std::memcpy(&v, parts.data() + 2 * (count * q + i), sizeof(double));
      sum += v;
    }
    x[i] = sum;
  }
}

double sum_over_group(Communicator* c, double local) {
  sum_over_group(c, &local, 1);
  return local;
}

void sum_over_group(Communicator* c, float* x, int64_t count, Stream stream) {
  if (active(c)) c->all_reduce(x, count, stream)->wait();
}

void max_over_group(Communicator* c, float* x, int64_t count) {
  if (!active(c)) return;
  const int n = c->size();
  std::vector<float> all(static_cast<size_t>(count) * n);
  c->all_gather(x, all.data(), count)->wait();
  for (int64_t i = 0; i < count; ++i) {
    float m = all[i];
    for (int q = 1; q < n; ++q) m = std::max(m, all[q * count + i]);
    x[i] = m;
  }
}

}  // namespace myriad::parallel
