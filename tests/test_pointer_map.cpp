// core/pointer_map.h against std::unordered_map: the memory accounts' per-storage bookkeeping
// (insert, try_emplace, find, erase and take by backward shift, growth, iteration) holds exactly the same
// entries.

#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/pointer_map.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_pointer_map {

TEST_CASE("PointerMap holds what std::unordered_map holds through inserts, erases and growth", "[cpu]") {
    // keys: addresses inside one buffer, 16-byte strided as allocations are (many share the high
    // bits, so probes run long and erasures shift entries back across the table's end)
    std::vector<char> buffer(1 << 16);
    std::mt19937_64 rng(7);
    PointerMap<int64_t> m;
    std::unordered_map<const void*, int64_t> ref;
    for (int op = 0; op < 200000; ++op) {
        const void* key = &buffer[16 * (rng() % (buffer.size() / 16))];
        const int64_t value = static_cast<int64_t>(rng() % 1000);
        switch (rng() % 6) {
            case 0:
            case 1:
                m.insert_or_assign(key, value);
                ref[key] = value;
                break;
            case 5: {  // try_emplace: the present value kept, an absent key inserted as 0, one probe
                auto [v, inserted] = m.try_emplace(key);
                auto [it, fresh] = ref.try_emplace(key, 0);
                REQUIRE(inserted == fresh);
                CHECK(*v == it->second);
                *v = value, it->second = value;
                break;
            }
            case 2:
                CHECK(m.erase(key) == (ref.erase(key) == 1));
                break;
            case 3: {  // take: the value out and the key gone, in one probe
                int64_t out = -1;
                auto it = ref.find(key);
                REQUIRE(m.take(key, &out) == (it != ref.end()));
                if (it != ref.end()) {
                    CHECK(out == it->second);
                    ref.erase(it);
                } else {
                    CHECK(out == -1);
                }
                break;
            }
            default: {
                const int64_t* v = m.find(key);
                auto it = ref.find(key);
                REQUIRE((v != nullptr) == (it != ref.end()));
                if (v) CHECK(*v == it->second);
            }
        }
        REQUIRE(m.size() == ref.size());
    }
    std::map<const void*, int64_t> seen;
    m.for_each([&](const void* k, int64_t v) { seen.emplace(k, v); });
    CHECK(seen == std::map<const void*, int64_t>(ref.begin(), ref.end()));
    for (const auto& [k, v] : ref) CHECK(m.erase(k));
    CHECK(m.empty());
    m.insert_or_assign(&buffer[0], 1);
    m.clear();
    CHECK(m.find(&buffer[0]) == nullptr);
}

}  // namespace test_pointer_map
