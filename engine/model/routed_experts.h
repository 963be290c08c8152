// What a module that routes each token to some of its experts (a moe layer, model/moe.h) offers the
// rest of ptool: the planner, explain, expert parallel, the run and the fault layer ask a module for
// it (Module::routed_experts()) instead of casting to a concrete type, so a second kind of expert
// layer implements this interface and everything that reads experts follows.
#pragma once

#include <cstdint>
#include <memory>

#include "model/moe_routing.h"

namespace ptool {

class Module;

class RoutedExperts {
public:
    virtual const RouterOptions& router_options() const = 0;  // experts, top_k, the scores
    int64_t experts() const { return router_options().experts; }
    virtual int64_t token_dim() const = 0;  // each token's features: the layer's input and output width
    virtual Module& expert(int64_t e) const = 0;
    // The load-balancing loss's coefficient (0: none) and the capacity factor (0: dropless): both need
    // statistics over every data rank's tokens
    virtual double aux_loss_coef() const = 0;
    virtual double capacity_factor() const = 0;
    // The routing and, under expert parallel, the dispatch it runs (the fault layer's seams)
    virtual void set_router(std::shared_ptr<const Router> r) = 0;
    virtual void set_dispatch(std::shared_ptr<const ExpertDispatch> d) = 0;

protected:
    ~RoutedExperts() = default;
};

}  // namespace ptool
