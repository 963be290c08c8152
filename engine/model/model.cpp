#include "model/model.h"

#include <unordered_set>

namespace ptool {

static std::vector<std::pair<std::string, ParamPtr>> unique_entries(const Module& root, bool buffers) {
    std::vector<std::pair<std::string, ParamPtr>> out;
    std::unordered_set<const Parameter*> seen;
    for_each_param(
        root,
        [&](const std::string& name, const ParamPtr& p) {
            if (seen.insert(p.get()).second) out.emplace_back(name, p);
        },
        buffers);
    return out;
}

std::vector<std::pair<std::string, ParamPtr>> Model::named_parameters() const {
    std::vector<std::pair<std::string, ParamPtr>> out = unique_entries(*root, false);
    for (auto& [name, p] : out)
        if (auto it = parameter_names.find(p.get()); it != parameter_names.end()) name = it->second;
    return out;
}
std::vector<std::pair<std::string, ParamPtr>> Model::named_buffers() const {
    return unique_entries(*root, true);
}

// PyTorch's state_dict order: per module, its parameters then its buffers, then its children.
static void walk_state(const Module& m, const std::string& prefix,
                       std::vector<std::pair<std::string, ParamPtr>>& out) {
    for (const auto& e : m.params()) out.emplace_back(join_name(prefix, e.name), e.param);
    for (const auto& e : m.buffers()) out.emplace_back(join_name(prefix, e.name), e.param);
    for (const auto& [name, child] : m.children()) walk_state(*child, join_name(prefix, name), out);
}

std::vector<std::pair<std::string, ParamPtr>> Model::state_dict() const {
    std::vector<std::pair<std::string, ParamPtr>> out;
    walk_state(*root, "", out);
    return out;
}

void Model::init_params() {
    init_params_except([](const Module&) { return false; });
}

void Model::init_params_except(const std::function<bool(const Module&)>& skip) {
    for_each_module(*root, [&](const std::string&, Module& m) {
        if (!skip(m)) m.init_params(seed);
    });
}

void Model::allocate_on(Device device) {
    auto place = [device](Tensor& t, MemoryUse use) {
        MemoryUseScope scope(use);
        if (t.defined() && t.device() != device) t = Tensor::empty(t.shape(), t.dtype(), device);
    };
    for (auto& [name, p] : named_parameters())
        place(p->value, MemoryUse::parameters), place(p->grad, MemoryUse::gradients);
    for (auto& [name, b] : named_buffers()) place(b->value, MemoryUse::parameters);
}

void Model::to_device(Device device) {
    auto move = [device](Tensor& t, MemoryUse use) {
        MemoryUseScope scope(use);
        if (t.defined() && t.device() != device) t = t.to_device(device);
    };
    for (auto& [name, p] : named_parameters()) {
        move(p->value, MemoryUse::parameters);
        if (p->grad.defined() && p->grad.device() != device) {  // uninitialised until a step zeroes it
            MemoryUseScope scope(MemoryUse::gradients);         // (make_param): nothing to copy
            p->grad = Tensor::empty(p->grad.shape(), p->grad.dtype(), device);
        }
    }
    for (auto& [name, b] : named_buffers()) move(b->value, MemoryUse::parameters);
}

}  // namespace ptool
