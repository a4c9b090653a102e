#include "model/gpt_impl.h"

namespace myriad {

template class GptModel<cpu::CpuOps>;

}  // namespace myriad
