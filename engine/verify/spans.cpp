#include "verify/spans.h"

namespace ptool {

std::vector<Span> spans_of(const Shape& local, const Shape& global, const std::vector<int64_t>& offset) {
    const int64_t nd = static_cast<int64_t>(local.size());
    int64_t numel = 1;
    for (int64_t d : local) numel *= d;
    if (numel == 0) return {};
    if (nd == 0) return {{0, 0, 1}};
    // the trailing dims the piece covers whole are one run with the last partial dim
    int64_t k = nd - 1;
    while (k > 0 && local[k] == global[k] && offset[k] == 0) --k;
    int64_t run = 1;
    for (int64_t d = k; d < nd; ++d) run *= local[d];
    std::vector<int64_t> stride(nd, 1);
    for (int64_t d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * global[d + 1];
    std::vector<Span> out;
    std::vector<int64_t> idx(k, 0);  // over the dims before k
    for (int64_t a = 0; a < numel; a += run) {
        int64_t e = offset[k] * stride[k];
        for (int64_t d = 0; d < k; ++d) e += (idx[d] + offset[d]) * stride[d];
        if (!out.empty() && out.back().a + out.back().n == a && out.back().e + out.back().n == e)
            out.back().n += run;
        else
            out.push_back({a, e, run});
        for (int64_t d = k - 1; d >= 0 && ++idx[d] == local[d]; --d) idx[d] = 0;
    }
    return out;
}

}  // namespace ptool
