#include "model/module_type.h"

#include <algorithm>
#include <map>

namespace ptool {
namespace {

std::map<std::string, const ModuleType*, std::less<>>& registry() {
    static std::map<std::string, const ModuleType*, std::less<>> types;
    return types;
}

}  // namespace

int64_t ModuleEntry::positive(const char* key) const {
    return keys.at(key).as_positive_int(fmt::format("'{}'", key));
}

int64_t size_mul(const YamlNode& where, int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r))
        where.fail(fmt::format("sizes overflow: {} x {} is beyond 2^63", a, b));
    return r;
}

int64_t size_add(const YamlNode& where, int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r))
        where.fail(fmt::format("sizes overflow: {} + {} is beyond 2^63", a, b));
    return r;
}

const ModuleType* find_module_type(std::string_view name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : it->second;
}

std::vector<std::string> module_type_names() {
    std::vector<const ModuleType*> types;
    for (const auto& [name, t] : registry()) types.push_back(t);
    std::stable_sort(types.begin(), types.end(),
                     [](const ModuleType* a, const ModuleType* b) { return a->listed() < b->listed(); });
    std::vector<std::string> out;
    for (const ModuleType* t : types) out.push_back(t->name());
    return out;
}

bool register_module_type(const ModuleType& type) {
    PTOOL_REQUIRE(!registry().count(type.name()), "module type '{}' registered twice", type.name());
    registry().emplace(type.name(), &type);
    return true;
}

}  // namespace ptool
