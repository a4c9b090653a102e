// The one layer schedule on the CUDA op set.
#include "model/cuda/cuda_ops.h"
#include "model/gpt_impl.h"

namespace myriad {

template class GptModel<cuda::CudaOps>;

}  // namespace myriad
