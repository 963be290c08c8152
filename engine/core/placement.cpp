#include "core/placement.h"

#include <regex>

#include "core/tensor_ops.h"

namespace ptool {

Placement Placement::normalized(int64_t ndim) const {
    if (!is_shard()) return *this;
    return shard(normalize_dim(dim, ndim));
}

bool Placement::same_as(const Placement& o, int64_t ndim) const {
    if (kind != o.kind) return false;
    if (is_owned()) return dim == o.dim;
    return !is_shard() || normalize_dim(dim, ndim) == normalize_dim(o.dim, ndim);
}

std::string Placement::str() const {
    switch (kind) {
        case Kind::replicate:
            return "Replicate()";
        case Kind::shard:
            return fmt::format("Shard({})", dim);
        case Kind::partial:
            return "Partial(sum)";
        case Kind::owned:
            return fmt::format("Owned({})", dim);
    }
    return "?";
}

Placement grad_placement(const Placement& p) {
    return p.is_partial() ? Placement::replicate() : p;
}

bool parse_placement(const std::string& text, Placement* out) {
    static const std::regex shard_re(R"(^\s*shard\(\s*(-?\d{1,2})\s*\)\s*$)", std::regex::icase);
    std::smatch m;
    if (text == "replicate" || text == "Replicate()") return *out = Placement::replicate(), true;
    if (text == "partial" || text == "Partial()") return *out = Placement::partial(), true;
    if (std::regex_match(text, m, shard_re)) return *out = Placement::shard(std::stoll(m[1].str())), true;
    return false;
}

Shape absent_shape(Shape global) {
    if (global.empty()) return {0};
    global[0] = 0;
    return global;
}

Shape local_shape(const Shape& global, const Placement& p, int parts, int index) {
    if (p.is_owned()) return p.dim == index ? global : absent_shape(global);
    if (!p.is_shard()) return global;
    Shape s = global;
    const int64_t d = normalize_dim(p.dim, static_cast<int64_t>(global.size()));
    s[d] = chunk_of(global[d], parts, index).length;
    return s;
}

std::string Layout::str() const {
    return fmt::format("{} {}", shape_str(global),
                       p.is_shard() ? p.normalized(static_cast<int64_t>(global.size())).str() : p.str());
}

}  // namespace ptool
