// What a module that normalises over the batch with running statistics offers the rest of ptool
// (Module::batch_statistics()): data parallel's SyncBatchNorm, the planner's and mixed precision's
// checks ask for it instead of casting to a concrete batch norm (model/layers.h's BatchNorm).
#pragma once

namespace ptool {

class Communicator;

class BatchStatistics {
public:
    // SyncBatchNorm: statistics over the batch of every rank of `group` (nullptr: local ones).
    virtual void set_sync_group(Communicator* group) = 0;
    virtual bool synced() const = 0;

protected:
    ~BatchStatistics() = default;
};

}  // namespace ptool
