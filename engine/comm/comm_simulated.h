// A simulated rank: one rank of a world that does not exist. Its collectives and point-to-point
// ops move nothing (the tensors are meta) and count what they would send, so a step executed on it
// (train/simulate.h) reports a real rank's collectives. A mesh built on it knows its groups from the mesh's
// shape (split_known); any other split is a group of one.
#pragma once

#include "comm/communicator.h"

namespace ptool {

class SimulatedCommunicator final : public Communicator {
public:
    SimulatedCommunicator(int rank, int size) : rank_(rank), size_(size) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string backend() const override { return "simulated"; }

    void all_reduce(Tensor& t, ReduceOp) override {
        count(Collective::all_reduce, static_cast<int64_t>(t.nbytes()));
    }
    void all_gather(const Tensor&, Tensor& out) override {
        count(Collective::all_gather, static_cast<int64_t>(out.nbytes()));
    }
    void reduce_scatter(const Tensor& in, Tensor&, ReduceOp) override {
        count(Collective::reduce_scatter, static_cast<int64_t>(in.nbytes()));
    }
    void broadcast(Tensor& t, int) override {
        count(Collective::broadcast, static_cast<int64_t>(t.nbytes()));
    }
    void all_to_all(const Tensor& in, Tensor&) override {
        count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    }
    void all_to_all_v(const Tensor& in, const std::vector<int64_t>&, Tensor&,
                      const std::vector<int64_t>&) override {
        count(Collective::all_to_all, static_cast<int64_t>(in.nbytes()));
    }
    void barrier() override {}
    void batch_isend_irecv(const std::vector<P2POp>& ops) override { count_p2p(ops); }
    std::unique_ptr<Communicator> split(int, int) override {
        return std::make_unique<SimulatedCommunicator>(0, 1);
    }
    std::unique_ptr<Communicator> split_known(int, int, int group_rank, int group_size) override {
        return std::make_unique<SimulatedCommunicator>(group_rank, group_size);
    }

private:
    int rank_, size_;
};

}  // namespace ptool
