// Resolution::rebound (parallel/parallelize.h): a resolution made once, against one model of the
// job's text, re-targeted at another model of the same text (each rank builds its own: its
// parameters hold its own values). The two module trees are walked together, transparent
// containers included (the layout pass records their calls), and must match module for module.
#include <map>

#include "parallel/parallelize.h"

namespace ptool {
namespace {

using ModuleMap = std::map<const Module*, Module*>;

// Maps a's tree onto b's: the same type, name, children and parameters (names, shapes, dtypes) at
// every node; a module shared under two names maps to one module both times.
void map_modules(const Module& a, Module& b, ModuleMap& out) {
    PTOOL_REQUIRE(a.fqn() == b.fqn() && a.type() == b.type(),
                  "rebinding a resolution: '{}' ({}) against '{}' ({}): the models differ", a.fqn(), a.type(),
                  b.fqn(), b.type());
    const auto [it, fresh] = out.emplace(&a, &b);
    PTOOL_REQUIRE(it->second == &b, "rebinding a resolution: '{}' is shared in one model only", a.fqn());
    if (!fresh) return;
    PTOOL_REQUIRE(a.params().size() == b.params().size(),
                  "rebinding a resolution: '{}' has {} parameters against {}", a.fqn(), a.params().size(),
                  b.params().size());
    for (size_t i = 0; i < a.params().size(); ++i) {
        const Module::Entry &pa = a.params()[i], &pb = b.params()[i];
        PTOOL_REQUIRE(pa.name == pb.name && pa.param->value.shape() == pb.param->value.shape() &&
                          pa.param->value.dtype() == pb.param->value.dtype(),
                      "rebinding a resolution: '{}'s parameter '{}' differs from '{}'", a.fqn(), pa.name,
                      pb.name);
    }
    PTOOL_REQUIRE(a.children().size() == b.children().size(),
                  "rebinding a resolution: '{}' has {} children against {}", a.fqn(), a.children().size(),
                  b.children().size());
    for (size_t i = 0; i < a.children().size(); ++i) {
        PTOOL_REQUIRE(a.children()[i].first == b.children()[i].first,
                      "rebinding a resolution: '{}'s child '{}' against '{}'", a.fqn(), a.children()[i].first,
                      b.children()[i].first);
        map_modules(*a.children()[i].second, *b.children()[i].second, out);
    }
}

Module* mapped(const ModuleMap& map, const Module* m) {
    if (!m) return nullptr;
    const auto it = map.find(m);
    PTOOL_REQUIRE(it != map.end(),
                  "rebinding a resolution: '{}' is not a module of the model it was resolved against",
                  m->fqn());
    return it->second;
}

std::set<const Module*> mapped(const ModuleMap& map, const std::set<const Module*>& modules) {
    std::set<const Module*> out;
    for (const Module* m : modules) out.insert(mapped(map, m));
    return out;
}

}  // namespace

Resolution Resolution::rebound(const Model& from, const Model& to) const {
    ModuleMap map;
    map_modules(*from.root, *to.root, map);
    std::map<const ResolvedStyle*, size_t> index;  // each style's place in `styles`
    for (size_t i = 0; i < styles.size(); ++i) index[&styles[i]] = i;
    Resolution r = *this;
    for (ResolvedStyle& rs : r.styles) rs.module = mapped(map, rs.module);
    for (CallLayout& c : r.layouts.calls) {
        c.module = mapped(map, c.module);
        if (!c.style) continue;
        const auto it = index.find(c.style);
        PTOOL_REQUIRE(it != index.end(),
                      "rebinding a resolution: the call of '{}' has a style not in its styles", c.fqn);
        c.style = &r.styles[it->second];
    }
    r.checkpointing.checkpointed = mapped(map, checkpointing.checkpointed);
    r.checkpointing.selective = mapped(map, checkpointing.selective);
    r.checkpointing.recompute_core = mapped(map, checkpointing.recompute_core);
    for (auto& [m, gemms] : r.float8) m = mapped(map, m);
    return r;
}

}  // namespace ptool
