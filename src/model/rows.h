// Rows of a batch as the model reads them: the token ids and, with data.document_mask, where
// each position's document begins, so that attention keeps to it. One record from the loader
// to the attention kernels, sliced by micro-batch on the way.
#pragma once

#include <cstdint>

namespace myriad {

struct Rows {
  const int32_t* tokens = nullptr;      // (rows, T+1): inputs [:, :T], targets [:, 1:]
  const int32_t* doc_starts = nullptr;  // (rows, T+1) or null: where each token's document begins in its row

  // Implicit from token ids alone: rows of one document each (every caller before documents).
  Rows(const int32_t* t, const int32_t* d = nullptr) : tokens(t), doc_starts(d) {}
  // Rows [first, ...) of rows T tokens long.
  Rows from(int64_t first, int64_t T) const {
    return {tokens + first * (T + 1), doc_starts ? doc_starts + first * (T + 1) : nullptr};
  }
  // Whether target i of row b (its token i + 1; rows `stride` apart) begins a document, which
  // data.document_end_loss = false leaves out of the loss.
  bool target_begins_document(int64_t b, int64_t i, int64_t stride) const {
    return doc_starts && doc_starts[b * stride + i + 1] == i + 1;
  }
  // The targets of rows [0, rows) (T each, rows `stride` apart: T + 1 unless said) that the loss
  // counts: every one, or with data.document_end_loss off (`document_end_loss` false) those that
  // do not begin a document. The one count the model, the engine and the evaluation use.
  int64_t counted_targets(int64_t rows, int64_t T, bool document_end_loss, int64_t stride = 0) const {
    if (document_end_loss || !doc_starts) return rows * T;
    int64_t n = 0;
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t i = 0; i < T; ++i) n += !target_begins_document(b, i, stride > 0 ? stride : T + 1);
    return n;
  }
};

}  // namespace myriad
