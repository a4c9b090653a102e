// The backends behind make_groups (communicator.h). Internal to src/comm.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous.h"

namespace myriad::comm {

// gloo_communicator.cc
std::vector<std::unique_ptr<Communicator>> make_gloo_groups(const std::shared_ptr<Store>& store,
                                                            const std::vector<GroupSpec>& groups,
                                                            const CommOptions& options);

#ifdef MYRIAD_HAVE_CUDA
// cuda/nccl_communicator.cc
std::vector<std::unique_ptr<Communicator>> make_nccl_groups(const std::shared_ptr<Store>& store,
                                                            const std::vector<GroupSpec>& groups,
                                                            const CommOptions& options);
// Whether a CUDA device is visible (for backend = auto).
bool cuda_device_visible();
#endif

}  // namespace myriad::comm
