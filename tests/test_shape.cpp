// core/shape.h against std::vector<int64_t>: a Shape that keeps its dims inline up to kInline and
// on the heap beyond holds exactly what a vector holds through the operations ptool uses (random
// sequences of push_back, insert, erase, resize, assign, copies and moves across the inline/heap
// boundary), converts both ways, and orders and compares as a vector does.

#include <random>
#include <utility>
#include <vector>

#include "core/shape.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_shape {

void require_same(const Shape& s, const std::vector<int64_t>& v) {
    REQUIRE(s.size() == v.size());
    REQUIRE(s.empty() == v.empty());
    REQUIRE(std::vector<int64_t>(s) == v);
    for (size_t i = 0; i < v.size(); ++i) REQUIRE(s[i] == v[i]);
    if (!v.empty()) REQUIRE((s.front() == v.front() && s.back() == v.back()));
}

TEST_CASE("Shape holds what std::vector<int64_t> holds through random edits across the inline size",
          "[cpu]") {
    std::mt19937_64 rng(11);
    for (int round = 0; round < 200; ++round) {
        Shape s;
        std::vector<int64_t> v;
        for (int op = 0; op < 60; ++op) {
            const int64_t x = static_cast<int64_t>(rng() % 1000) - 500;
            const size_t at = v.empty() ? 0 : rng() % (v.size() + 1);
            switch (rng() % 9) {
                case 0:
                case 1:
                    s.push_back(x), v.push_back(x);
                    break;
                case 2:
                    s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), x);
                    v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), x);
                    break;
                case 3:
                    if (!v.empty() && at < v.size()) {
                        s.erase(s.begin() + static_cast<std::ptrdiff_t>(at));
                        v.erase(v.begin() + static_cast<std::ptrdiff_t>(at));
                    }
                    break;
                case 4: {
                    const size_t n = rng() % 12;
                    s.resize(n, x), v.resize(n, x);
                    break;
                }
                case 5: {  // a range of itself inserted into itself
                    const std::vector<int64_t> copy = v;
                    s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), s.begin(), s.end());
                    v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), copy.begin(), copy.end());
                    break;
                }
                case 6: {  // copies and moves, from an inline or a heap shape, onto either
                    Shape copy = s;
                    require_same(copy, v);
                    Shape moved = std::move(copy);
                    require_same(moved, v);
                    Shape onto{1, 2, 3, 4, 5, 6, 7, 8, 9};
                    onto = moved;
                    require_same(onto, v);
                    Shape small{1};
                    small = std::move(onto);
                    s = small;
                    break;
                }
                case 7:
                    if (!v.empty()) s.pop_back(), v.pop_back();
                    break;
                default: {
                    const std::vector<int64_t> w(rng() % 10, x);
                    s = Shape(w), v = w;
                    break;
                }
            }
            require_same(s, v);
        }
    }
}

TEST_CASE("Shape compares, orders and converts as std::vector<int64_t> does", "[cpu]") {
    const std::vector<std::vector<int64_t>> values = {
        {}, {0}, {1}, {1, 2}, {1, 3}, {2}, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6, 7}, {1, 2, 3, 4, 5, 6, 8}};
    for (const auto& a : values)
        for (const auto& b : values) {
            const Shape sa(a), sb(b);
            REQUIRE((sa == sb) == (a == b));
            REQUIRE((sa != sb) == (a != b));
            REQUIRE((sa < sb) == (a < b));
            REQUIRE((sa <= sb) == (a <= b));
            REQUIRE((sa > sb) == (a > b));
            REQUIRE((sa >= sb) == (a >= b));
            REQUIRE((sa == Shape(b)) == (a == b));  // a vector converted to compare
        }
    const Shape s{4, 8, 16};
    REQUIRE(s == std::vector<int64_t>{4, 8, 16});
    REQUIRE(Shape(3, 7) == Shape{7, 7, 7});
    REQUIRE(Shape(3) == Shape{0, 0, 0});
    const std::vector<int64_t> back = s;
    REQUIRE(back == std::vector<int64_t>{4, 8, 16});
    REQUIRE_THROWS(s.at(3));
    REQUIRE(s.at(2) == 16);
    Shape long_shape(Shape::kInline + 3, 2);  // on the heap from its start
    REQUIRE(long_shape.capacity() >= Shape::kInline + 3);
    REQUIRE(std::vector<int64_t>(long_shape) == std::vector<int64_t>(Shape::kInline + 3, 2));
}

}  // namespace test_shape
