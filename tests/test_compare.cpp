// verify's tensor comparison and digests: the in-place, per-dtype loop gives the numbers of the
// plain rule (|a - e| <= atol + rtol |e|, ULPs in the dtype), and digests tell tensors apart.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "comm/comm_choice.h"
#include "core/rng.h"
#include "core/tensor_ops.h"
#include "test_helpers.h"
#include "verify/compare.h"
#include "verify/digest.h"
#include "verify/faults.h"
#include "verify/report.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_compare {

TEST_CASE("compare_tensors: max abs/rel error, headroom and ULPs of float32 and bfloat16", "[cpu]") {
    Tensor e = Tensor::from_doubles({2, 3}, DType::float32, {1.0, -2.0, 0.5, 4.0, 0.0, 3.0});
    Tensor a = e.clone();
    const TensorDiff same = compare_tensors(a, e, {1.3e-6, 1e-5});
    CHECK(same.pass);
    CHECK(same.max_abs == 0);
    CHECK(same.max_ulp == 0);
    a.data<float>()[3] = std::nextafter(4.0f, 5.0f);  // one ULP at 4: 2^-21
    a.data<float>()[4] = 1e-6f;                       // against an expected 0: relative error infinite
    const TensorDiff d = compare_tensors(a, e, {1.3e-6, 1e-5});
    CHECK(d.max_abs == static_cast<double>(1e-6f));  // the larger of 2^-21 and 1e-6
    CHECK(d.max_rel == std::numeric_limits<double>::infinity());
    CHECK(d.headroom == Approx(static_cast<double>(1e-6f) / 1e-5));  // vs 2^-21 / (1e-5 + 1.3e-6 * 4) = 0.031
    const float tiny = 1e-6f;
    int32_t tiny_bits;
    std::memcpy(&tiny_bits, &tiny, 4);
    CHECK(d.max_ulp == tiny_bits);  // from 0 to 1e-6: every positive float below it
    CHECK(d.pass);
    a.data<float>()[0] = 1.001f;
    CHECK_FALSE(compare_tensors(a, e, {1.3e-6, 1e-5}).pass);

    Tensor eb = Tensor::from_doubles({2}, DType::bfloat16, {1.0, -1.0});
    Tensor ab = Tensor::from_doubles({2}, DType::bfloat16, {1.0078125, -1.0});  // next bf16 above 1
    const TensorDiff b = compare_tensors(ab, eb, Tolerance::for_dtype(DType::bfloat16));
    CHECK(b.max_ulp == 1);
    CHECK(b.max_abs == 0.0078125);
    CHECK(b.pass);
}

TEST_CASE(
    "compare_tensors: NaN and inf agree only with themselves at the same place, mixed dtypes compare values",
    "[cpu]") {
    Tensor e = Tensor::from_doubles({3}, DType::float32, {1.0, 2.0, 3.0});
    Tensor a = e.clone();
    a.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    Tensor a2 = a.clone();
    const TensorDiff same = compare_tensors(a, a2, {});  // a file diffed with itself
    CHECK(same.pass);
    CHECK(same.nonfinite == 1);
    const TensorDiff d = compare_tensors(a, e, {});  // a NaN against a number: reported as nan
    CHECK_FALSE(d.pass);
    CHECK(std::isnan(d.max_abs));
    CHECK(std::isnan(d.headroom));
    CHECK_FALSE(compare_tensors(e, a, {}).pass);
    Tensor other_place = e.clone();
    other_place.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
    CHECK_FALSE(compare_tensors(a, other_place, {}).pass);  // both hold a NaN, at different places
    Tensor inf = e.clone(), minus_inf = e.clone();
    inf.data<float>()[0] = std::numeric_limits<float>::infinity();
    minus_inf.data<float>()[0] = -std::numeric_limits<float>::infinity();
    CHECK(compare_tensors(inf, inf.clone(), {}).pass);
    CHECK_FALSE(compare_tensors(inf, minus_inf, {}).pass);
    CHECK(compare_tensors(inf, e, {}).max_abs == std::numeric_limits<double>::infinity());
    Tensor e64 = Tensor::from_doubles({3}, DType::float64, {1.0, 2.0, 3.0000001});
    const TensorDiff m = compare_tensors(e, e64, {1.3e-6, 1e-5});
    CHECK(m.pass);
    CHECK(m.max_abs == Approx(1e-7).margin(1e-9));
    CHECK(m.max_ulp == 0);  // no ULP distance across dtypes
    CHECK_FALSE(compare_tensors(Tensor({3, 1}, DType::float32), e, {}).shape_ok);
}

TEST_CASE("compare_tensors: a large tensor, compared in blocks on threads, gives the one-pass numbers",
          "[cpu]") {
    // 3M elements: 12 blocks; the worst element, a NaN and a bitwise-equal copy in late blocks
    const int64_t n = 3'000'000;
    Tensor e({n}, DType::float32), a({n}, DType::float32);
    for (int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(std::sin(0.001 * i));
        e.data<float>()[i] = v, a.data<float>()[i] = v + static_cast<float>(1e-7 * ((i % 7) - 3));
    }
    a.data<float>()[n - 5] = e.data<float>()[n - 5] + 1e-3f;  // the worst: in the last block
    double err2 = 0, ref2 = 0, act2 = 0, worst = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double w = a.data<float>()[i], v = e.data<float>()[i];
        err2 += (w - v) * (w - v), ref2 += v * v, act2 += w * w, worst = std::max(worst, std::abs(w - v));
    }
    const Tolerance loose_norm{1.3e-6, 1e-5, 1.0};  // a Frobenius bound, so norms are summed
    const TensorDiff d = compare_tensors(a, e, loose_norm);
    CHECK(d.max_abs == worst);
    CHECK(d.headroom == Approx(worst / (1e-5 + 1.3e-6 * std::abs(e.data<float>()[n - 5]))));
    CHECK(d.headroom > 1);
    CHECK(d.by_frobenius);  // past the elementwise rule, within the (loose) norm bound
    CHECK(d.ref_norm == Approx(std::sqrt(ref2)).epsilon(1e-12));
    CHECK(d.err_norm == Approx(std::sqrt(err2)).epsilon(1e-12));
    CHECK_FALSE(compare_tensors(a, e, {1.3e-6, 1e-5}).pass);
    Tensor same = a.clone();
    const TensorDiff eq = compare_tensors(same, a, loose_norm);
    CHECK(eq.pass);
    CHECK(eq.max_abs == 0);
    CHECK(eq.ref_norm == Approx(std::sqrt(act2)).epsilon(1e-12));
    same.data<float>()[n - 1] = std::numeric_limits<float>::quiet_NaN();
    CHECK(compare_tensors(same, same.clone(), {})
              .pass);  // bitwise equal, a NaN in the last block at the same place
    CHECK(compare_tensors(same, same.clone(), {}).nonfinite == 1);
    CHECK(std::isnan(compare_tensors(same, a, {}).headroom));  // against a number
    CHECK_FALSE(compare_tensors(same, a, {}).pass);
}

TEST_CASE("ExactSum: the same value whatever the order and grouping of its terms", "[cpu]") {
    std::vector<double> terms;
    for (int i = 0; i < 20000; ++i) terms.push_back(std::pow(1.7, (i % 97) - 48) * (1 + 1e-3 * i));
    terms.push_back(std::numeric_limits<double>::denorm_min());
    terms.push_back(1e300);
    ExactSum forward, backward, halves_a, halves_b;
    for (double t : terms) forward.add(t);
    for (auto it = terms.rbegin(); it != terms.rend(); ++it) backward.add(*it);
    for (size_t i = 0; i < terms.size(); ++i) (i % 3 ? halves_a : halves_b).add(terms[i]);
    halves_a.add(halves_b);
    CHECK(forward.value() == backward.value());
    CHECK(forward.value() == halves_a.value());
    // exact where doubles are not: 2^60 + 4096 x 1 (a double sum in this order stays at 2^60)
    ExactSum big;
    big.add(std::ldexp(1.0, 60));
    for (int i = 0; i < 4096; ++i) big.add(1.0);
    CHECK(big.value() == std::ldexp(1.0, 60) + 4096.0);
}

TEST_CASE("compare_piece: a tensor compared in pieces on ranks reads exactly the whole tensor's numbers",
          "[cpu]") {
    // [7, 10] cut as torch.chunk cuts it: rows over 3 ranks (3, 3, 1), columns over 4 (3, 3, 3, 1),
    // and both (a 2-D mesh); every piece against its box of the whole expected tensor
    Tensor e({7, 10}, DType::float32), a({7, 10}, DType::float32);
    for (int64_t i = 0; i < 70; ++i) {
        e.data<float>()[i] = static_cast<float>(std::sin(0.37 * i) * 3);
        a.data<float>()[i] = e.data<float>()[i] + static_cast<float>(1e-6 * ((i % 5) - 2));
    }
    a.data<float>()[33] = e.data<float>()[33] * 1.01f;  // the worst element
    Tolerance tol{1.3e-6, 1e-5, 0, 1e-4};
    tol.projected = true;  // a clipped model's gradient: <a - e, e> summed too
    const TensorDiff whole = compare_tensors(a, e, tol);
    auto by_pieces = [&](int row_parts, int col_parts) {
        DiffPiece all;
        for (int r = 0; r < row_parts; ++r)
            for (int c = 0; c < col_parts; ++c) {
                const Chunk rc = chunk_of(7, row_parts, r), cc = chunk_of(10, col_parts, c);
                const Tensor piece = chunk(chunk(a, row_parts, r, 0), col_parts, c, 1);
                DiffPiece p = compare_piece(piece, e, {rc.offset, cc.offset}, tol, 1);
                std::vector<int64_t> packed(kPieceWords);
                pack_piece(p, packed.data());
                merge_piece(all, unpack_piece(packed.data()));  // as the ranks' metrics travel
            }
        return finish_diff(all, tol);
    };
    for (auto [rows, cols] : {std::pair{3, 1}, {1, 4}, {3, 4}, {7, 10}}) {
        const TensorDiff d = by_pieces(rows, cols);
        CHECK(d.max_abs == whole.max_abs);
        CHECK(d.max_rel == whole.max_rel);
        CHECK(d.headroom == whole.headroom);
        CHECK(d.max_ulp == whole.max_ulp);
        CHECK(d.err_norm == whole.err_norm);  // exact sums: bitwise, not approximately
        CHECK(d.ref_norm == whole.ref_norm);
        CHECK(d.projection == whole.projection);
        CHECK(d.pass == whole.pass);
    }
    CHECK_FALSE(whole.pass);
    CHECK(whole.projected);
    {  // the projection, in doubles: <a - e, e> / ||e||^2
        double ae = 0, ee = 0;
        for (int64_t i = 0; i < 70; ++i) {
            const double x = e.data<float>()[i], y = a.data<float>()[i];
            ae += (y - x) * x, ee += x * x;
        }
        CHECK(std::abs(whole.projection - ae / ee) <= 1e-12 * std::abs(ae / ee));
    }
    // a piece that does not fit its box fails
    CHECK_FALSE(compare_piece(chunk(a, 3, 0, 0), e, {5, 0}, tol, 1).d.shape_ok);
}

TEST_CASE("element_hash_sum: pieces add up to the whole tensor's digest, one element apart differs",
          "[cpu]") {
    Tensor t({6, 5}, DType::float32);
    for (int64_t i = 0; i < 30; ++i) t.data<float>()[i] = static_cast<float>(i * 0.25 - 3);
    const uint64_t whole = element_hash_sum(t, t.shape(), {0, 0});
    uint64_t sum = 0;
    for (int c = 0; c < 2; ++c)
        for (int r = 0; r < 4; ++r)
            sum += element_hash_sum(chunk(chunk(t, 2, c, 1), 4, r, 0), t.shape(),
                                    {chunk_of(6, 4, r).offset, chunk_of(5, 2, c).offset});
    CHECK(sum == whole);
    Tensor u = t.clone();
    u.data<float>()[17] = std::nextafter(u.data<float>()[17], 100.0f);
    CHECK(element_hash_sum(u, u.shape(), {0, 0}) != whole);
    Tensor swapped = t.clone();
    std::swap(swapped.data<float>()[3], swapped.data<float>()[4]);  // the same values elsewhere
    CHECK(element_hash_sum(swapped, swapped.shape(), {0, 0}) != whole);
    CHECK(finish_element_hash(whole, DType::float32, {6, 5}) !=
          finish_element_hash(whole, DType::float32, {5, 6}));
}

TEST_CASE("tensor_digest: equal tensors agree, a bit, a shape or a dtype apart differ", "[cpu]") {
    Tensor t({1000 * 8 + 3}, DType::float32);  // not a multiple of the 32-byte stride: a tail
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::sin(0.1 * static_cast<double>(i)));
    const uint64_t h = tensor_digest(t);
    CHECK(tensor_digest(t.clone()) == h);
    for (int64_t byte :
         {int64_t{0}, int64_t{17}, int64_t{4 * 4000 + 9}, static_cast<int64_t>(t.nbytes()) - 1}) {
        Tensor u = t.clone();
        static_cast<unsigned char*>(u.raw())[byte] ^= 0x10;
        CHECK(tensor_digest(u) != h);
    }
    Tensor s = Tensor::from_doubles({2, 3}, DType::float32, {1, 2, 3, 4, 5, 6});
    CHECK(tensor_digest(s) != tensor_digest(s.reshape({3, 2})));
    Tensor z32({4}, DType::float32), zi({4}, DType::int32);  // the same zero bytes
    CHECK(tensor_digest(z32) != tensor_digest(zi));
}

TEST_CASE("in-process verify compares as it records: the report of comparing stored records", "[cpu]") {
    // a 2-D mesh (dp x tp, rowwise weights gathered along dim 1), correct and with a fault
    const std::string dir = PTOOL_SOURCE_DIR;
    RunInputs in;
    in.model_path = dir + "/models/mlp_stacked_mse.yaml";
    in.model_text = read_text(in.model_path);
    const Plan plan = load_plan(dir + "/plans/mlp_stacked_dp2_tp2.yaml");
    for (const char* fault : {"", "skip_all_reduce:layers.1.net2"}) {
        INFO("fault '" << fault << "'");
        const Fault f = parse_fault(fault);
        const Model probe = load_model_text(in.model_text, in.model_path, "", false);
        const Tolerance tol = tolerance_for(plan, VerifyOptions{}, probe);
        const RunRecord ref = record_reference(in, single_device_plan(), 2, RecordOptions{});
        RunRecord stored, streamed;
        RecordOptions as_recorded;
        as_recorded.compare_with = &ref, as_recorded.tol = tol;
        for (auto [opt, out] : {std::pair{RecordOptions{}, &stored}, std::pair{as_recorded, &streamed}})
            run_ranks(
                plan.world_size(), CommOptions{},
                [&, opt = opt, out = out](Communicator& w) {
                    const auto layer = fault_layer(f);
                    Run run(in, plan, w, layer.get());
                    RunRecord r = record_run(run, 2, opt);
                    if (w.rank() == 0) *out = std::move(r);
                },
                Device::cpu);
        REQUIRE(streamed.steps.size() == 2);
        CHECK(streamed.steps[0].tensors.empty());  // diffs, not tensors
        CHECK_FALSE(stored.steps[0].tensors.empty());
        const PlanReport a = compare_runs(ref, stored, plan, tol), b = compare_runs(ref, streamed, plan, tol);
        CHECK(a.pass == (*fault == 0));
        CHECK(b.pass == a.pass);
        CHECK(b.passed == a.passed);
        CHECK(b.failed == a.failed);
        CHECK(b.localisation == a.localisation);
        if (*fault)
            CHECK(b.localisation.find("first divergence: step 0 forward `layers.1.net2` output") == 0);
        REQUIRE(b.tensors.size() == a.tensors.size());
        for (size_t i = 0; i < a.tensors.size(); ++i) {
            CHECK(b.tensors[i].name == a.tensors[i].name);
            CHECK(b.tensors[i].diff.max_abs == a.tensors[i].diff.max_abs);
            CHECK(b.tensors[i].replicas == a.tensors[i].replicas);
        }
    }
}

TEST_CASE("zero-size tensors flow through every op and the comparison", "[cpu]") {
    Backend& be = backend_for(Device::cpu);
    const Tensor x({0, 4}, DType::float32), w({3, 4}, DType::float32), w0({3, 0}, DType::float32);
    Tensor y({0, 3}, DType::float32), y2({2, 3}, DType::float32), a({2, 0}, DType::float32);
    be.gemm(x, false, w, true, y);  // no rows
    be.fill(y2, 7.0);
    be.gemm(a, false, w0, true, y2);  // an empty sum (a rowwise shard with no columns): zeros
    CHECK(y2.item(0) == 0.0);
    Tensor e({0, 4}, DType::float32), d({0, 4}, DType::float32);
    for (Activation act :
         {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu, Activation::tanh}) {
        be.activation(act, x, e);
        be.activation_backward(act, x, x, d);
    }
    be.add(x, x, e), be.mul(x, x, e), be.axpy(2.0, x, e), be.scale(x, 3.0, e), be.copy(x, e);
    Tensor bias({4}, DType::float32), db({4}, DType::float32);
    be.add_bias(e, bias);
    be.sum_rows(e, db, false);
    CHECK(db.item(0) == 0.0);
    CHECK(be.sum_all(x) == 0.0);
    Tensor mean({0}, DType::float32), rstd({0}, DType::float32);
    be.layer_norm(x, bias, bias, 1e-5, false, e, mean, rstd);
    be.layer_norm_backward(x, bias, mean, rstd, x, false, d, &db, &db);
    Tensor s({0, 5, 5}, DType::float32), sy({0, 5, 5}, DType::float32);
    be.softmax(s, true, sy);
    be.softmax_backward(sy, s, sy);
    const Tensor ids({0}, DType::int64), table({8, 4}, DType::float32);
    Tensor rows({0, 4}, DType::float32), dtable({8, 4}, DType::float32);
    be.embedding(ids, table, rows);
    be.embedding_backward(ids, rows, dtable);
    const TensorDiff diff = compare_tensors(x, x.clone(), Tolerance{});
    CHECK(diff.pass);
    CHECK(diff.max_abs == 0);
    CHECK_FALSE(compare_tensors(x, Tensor({4, 0}, DType::float32), Tolerance{}).shape_ok);
    CHECK(tensor_digest(x) != tensor_digest(Tensor({0, 5}, DType::float32)));
}

TEST_CASE("tensor_digest is its definition on every length (the vector path the same as the scalar one)",
          "[cpu]") {
    // eight lanes, each mixing word k of every whole 64-byte stripe in order (multiply-xorshift),
    // the tail's bytes into lane 0, then the lanes into the dtype's and shape's hash: written out
    // here in plain C++, against whichever path this CPU takes
    auto mix = [](uint64_t h, uint64_t w) {
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        return h ^ (h >> 31);
    };
    const CounterRng rng(5, 1);
    for (int64_t n : {0, 1, 3, 15, 16, 17, 64, 100, 1000, 4099}) {
        Tensor t({n}, DType::float32);
        for (int64_t i = 0; i < n; ++i)
            t.data<float>()[i] = static_cast<float>(rng.normal(static_cast<uint64_t>(i)));
        uint64_t h = mix(0x9E3779B97F4A7C15ull, static_cast<uint64_t>(t.dtype()));
        h = mix(h, static_cast<uint64_t>(n));
        uint64_t lane[8];
        for (int k = 0; k < 8; ++k) lane[k] = h ^ static_cast<uint64_t>(k);
        const auto* p = static_cast<const unsigned char*>(t.raw());
        const size_t bytes = t.nbytes(), whole = bytes / 64 * 64;
        for (size_t i = 0; i < whole; i += 8) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            lane[(i / 8) % 8] = mix(lane[(i / 8) % 8], w);
        }
        for (size_t i = whole; i < bytes; ++i) lane[0] = (lane[0] ^ p[i]) * 0x94D049BB133111EBull;
        for (uint64_t l : lane) h = mix(h, l);
        INFO(n << " elements");
        CHECK(tensor_digest(t) == (h ^ (h >> 29)));
    }
}

TEST_CASE("BinnedSum: exactly ExactSum's sum, across its flushes, subnormals and the largest doubles",
          "[cpu]") {
    const CounterRng rng(3, 8);
    std::vector<double> terms;
    for (int i = 0; i < 30000; ++i)
        terms.push_back(
            std::ldexp(1 + rng.uniform(i), static_cast<int>(2040 * rng.uniform(i + 1'000'000)) - 1070));
    for (int i = 0; i < 5000; ++i)
        terms.push_back(std::nextafter(2.0, 0.0));  // one bin's largest mantissa, past a flush
    for (int i = 0; i < 100; ++i) terms.push_back(std::numeric_limits<double>::denorm_min() * (i + 1));
    terms.push_back(std::numeric_limits<double>::max());
    terms.push_back(0.0);
    ExactSum plain;
    BinnedSum binned;
    for (double t : terms) plain.add(t), binned.add(t);
    ExactSum got = binned.sum();
    plain.normalize(), got.normalize();
    CHECK(std::equal(std::begin(plain.w), std::end(plain.w), std::begin(got.w)));
    CHECK(got.value() == plain.value());
    CHECK(binned.sum().value() == plain.value());  // a second sum() adds nothing
}

TEST_CASE("compare_tensors: the exact sums reach the float32 extremes (every bin a square can fill)",
          "[cpu]") {
    // the largest and smallest squares a float32 comparison makes: (FLT_MAX - -FLT_MAX)^2 = 2^258
    // and (2^-149)^2 = 2^-298, in chunks that differ, and chunks that are bitwise equal, on the
    // vector paths (whole chunks of 64) and the element loop (a tail of 3)
    const float big = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
    for (int64_t n : {int64_t{256}, int64_t{259}}) {
        Tensor a({n}, DType::float32), e({n}, DType::float32);
        for (int64_t i = 0; i < n; ++i) {
            const float v = i % 4 == 0 ? big : i % 4 == 1 ? -big : i % 4 == 2 ? tiny : -tiny;
            e.data<float>()[i] = v;
            a.data<float>()[i] = i < 128 ? -v : v;  // the first two chunks differ, the rest are equal
        }
        ExactSum err2, ref2;
        for (int64_t i = 0; i < n; ++i) {
            const double x = a.data<float>()[i], y = e.data<float>()[i];
            err2.add((x - y) * (x - y)), ref2.add(y * y);
        }
        const TensorDiff d = compare_tensors(a, e, Tolerance{});
        INFO(n << " elements");
        CHECK(d.err_norm == std::sqrt(err2.value()));
        CHECK(d.ref_norm == std::sqrt(ref2.value()));
        CHECK(d.err_norm > 1e38);
    }
}

TEST_CASE("compare_tensors: the maxima are bitwise those of dividing every element (gated divisions)",
          "[cpu]") {
    // random signs and magnitudes over 40 decades, exact zeros, subnormals, errors of a few ULPs to
    // 10%, some of the opposite sign and far larger: max_rel and headroom equal a plain loop that divides
    // every element, the norms a plain ExactSum of every element's squares; every element differing, or one
    // in 1000 (whole equal chunks between)
    const CounterRng rng(9, 4);
    for (DType dt : {DType::float32, DType::float64})
        for (const Tolerance& tol : {Tolerance{1.3e-6, 1e-5}, Tolerance{0, 0}, Tolerance{1e-2, 0}})
            for (int64_t every : {1, 1000}) {
                const int64_t n = 200'000;
                Tensor a({n}, dt), e({n}, dt);
                for (int64_t i = 0; i < n; ++i) {
                    const double mag = std::pow(10.0, 40 * rng.uniform(3 * i) - 30) *
                                       (rng.uniform(3 * i + 1) < 0.5 ? -1 : 1);
                    const double v = i % 101 == 0 ? 0.0 : i % 257 == 0 ? 1e-40 : mag;
                    const double rel = i % 13 == 0 ? 0.0 : std::pow(10.0, -8 + 7 * rng.uniform(3 * i + 2));
                    e.set(i, v), a.set(i, i % every != 0 ? e.item(i)
                                          : i % 97 == 0  ? 0.0
                                          : i % 389 == 0 ? -v * 1e20
                                                         : v * (1 + rel));
                }
                double max_abs = 0, max_rel = 0, headroom = 0;
                int64_t max_ulp =
                    0;  // |a - e| in units of the last place: the distance of their ordered bit patterns
                for (int64_t i = 0; i < n; ++i) {
                    if (dt == DType::float32) {
                        int32_t x, y;
                        std::memcpy(&x, a.data<float>() + i, 4), std::memcpy(&y, e.data<float>() + i, 4);
                        const int64_t ox = x < 0 ? -int64_t{x & 0x7fffffff} : x,
                                      oy = y < 0 ? -int64_t{y & 0x7fffffff} : y;
                        max_ulp = std::max(max_ulp, ox > oy ? ox - oy : oy - ox);
                    } else {
                        int64_t x, y;
                        std::memcpy(&x, a.data<double>() + i, 8), std::memcpy(&y, e.data<double>() + i, 8);
                        const __int128 ox = x < 0 ? -static_cast<__int128>(x & INT64_MAX) : x,
                                       oy = y < 0 ? -static_cast<__int128>(y & INT64_MAX) : y;
                        const __int128 u = ox > oy ? ox - oy : oy - ox;
                        max_ulp =
                            std::max<int64_t>(max_ulp, u > INT64_MAX ? INT64_MAX : static_cast<int64_t>(u));
                    }
                }
                ExactSum err2, ref2;
                for (int64_t i = 0; i < n; ++i) {
                    const double x = a.item(i), y = e.item(i), err = std::abs(x - y),
                                 bound = tol.atol + tol.rtol * std::abs(y);
                    max_abs = std::max(max_abs, err);
                    if (y != 0)
                        max_rel = std::max(max_rel, err / std::abs(y));
                    else if (err > 0)
                        max_rel = std::numeric_limits<double>::infinity();
                    headroom = std::max(headroom, bound > 0 ? err / bound : (err > 0 ? 1e300 : 0.0));
                    err2.add(err * err), ref2.add(y * y);
                }
                const TensorDiff d = compare_tensors(a, e, tol);
                INFO(dtype_name(dt) << " rtol " << tol.rtol << " atol " << tol.atol << " one in " << every
                                    << " differs");
                CHECK(d.max_abs == max_abs);
                CHECK(d.max_rel == max_rel);
                CHECK(d.headroom == headroom);
                CHECK(d.err_norm == std::sqrt(err2.value()));
                CHECK(d.ref_norm == std::sqrt(ref2.value()));
                CHECK(d.max_ulp == max_ulp);
            }
}

}  // namespace test_compare
