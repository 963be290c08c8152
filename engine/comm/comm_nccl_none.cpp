// A build without CUDA has no nccl communicator; comm_choice never picks it there (no GPU is
// visible), so reaching these is an engine bug, reported as a RuntimeError.
#include "comm/comm_nccl.h"

namespace ptool {

void run_nccl_threads(int, const CommOptions&, const std::function<void(Communicator&)>&) {
    throw RuntimeError("nccl communicator: this ptool was built without CUDA");
}

std::unique_ptr<Communicator> make_nccl_world(Communicator&, const CommOptions&) {
    throw RuntimeError("nccl communicator: this ptool was built without CUDA");
}

}  // namespace ptool
